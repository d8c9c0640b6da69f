"""Optimal experiment design: the Fisher information of a record (`fisher_information`) and the
input that maximises it under amplitude and rate bounds (`design_input`). Public names are
re-exported by `ceem_casadi.workflow` (and `design_input` by `ceem_casadi`)."""
from ._experiment_design import DesignOptions, InputDesign, design_input, fisher_information

__all__ = ["DesignOptions", "InputDesign", "design_input", "fisher_information"]
