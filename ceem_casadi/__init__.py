"""ceem_casadi: certainty-equivalent EM for partially observed nonlinear systems on CasADi.

Every function that takes data takes ``(model, data, theta, *, ...)`` with ``theta`` a dict of arrays keyed
by parameter name; results are dataclasses with a short ``repr``, ``.table()`` and ``.to_dict()``. The
public names by task: docs/api/index.md; everything else lives in one subpackage per concept
(docs/architecture.md).
"""
from . import baselines, distributed, filtering, io
from ._version import __version__
from .baselines import n4sid
from .deploy import export_casadi, generate_ekf, load_model, save_model
from .distributed import Sharded
from .em import CEEMOptions, CEEMResult, ceem, ceem_checkpointed
from .errors import CeemError, NonFiniteError, OptionsError, ParameterError, ShapeError, SolverError
from .io import Trajectories, load_cascaded_tanks, load_silverbox, read_trajectories, simulate
from .learning import LearnerOptions
from .model import MLP, Param, Parameters, StateSpaceModel, simulate_output
from .runtime import Status
from .smoothing import SmootherOptions
from .workflow import (
    NoiseCalibrationOptions,
    OutputErrorOptions,
    UncertaintyOptions,
    calibrate_noise,
    compare_structures,
    design_input,
    estimate_initial_state,
    identify,
    parameter_uncertainty,
    refine_output_error,
    residual_analysis,
    simulation_bands,
    validation_report,
)

__all__ = [
    "MLP", "CEEMOptions", "CEEMResult", "CeemError", "LearnerOptions", "NoiseCalibrationOptions", "NonFiniteError",
    "OptionsError", "OutputErrorOptions", "Param", "ParameterError", "Parameters", "ShapeError", "Sharded",
    "SmootherOptions", "SolverError", "StateSpaceModel", "Status", "Trajectories", "UncertaintyOptions", "__version__",
    "baselines", "calibrate_noise", "ceem", "compare_structures", "ceem_checkpointed", "distributed", "design_input",
    "estimate_initial_state", "export_casadi", "filtering", "generate_ekf", "identify", "io", "load_cascaded_tanks",
    "load_model", "load_silverbox", "n4sid", "parameter_uncertainty", "read_trajectories", "refine_output_error",
    "save_model", "residual_analysis", "simulate", "simulate_output", "simulation_bands", "validation_report",
]
