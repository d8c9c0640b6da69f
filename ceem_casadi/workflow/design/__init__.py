"""Optimal experiment design: the Fisher information of a record and the input that maximises it (docs/control.md);
re-exported by `ceem_casadi.workflow` (and `design_input` by `ceem_casadi`)."""
from ._experiment_design import DesignOptions, InputDesign, design_input, fisher_information

__all__ = ["DesignOptions", "InputDesign", "design_input", "fisher_information"]
