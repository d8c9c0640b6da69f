"""ceem_casadi: certainty-equivalent EM for partially observed nonlinear systems on CasADi.

The public API, by task (every function that takes data takes ``(model, data, theta, *, ...)``
with ``theta`` a dict of arrays keyed by parameter name; results are dataclasses with a short
``repr``, ``.table()`` and ``.to_dict()``):

    StateSpaceModel, Param, Parameters, MLP     the model (structure; values go into functions)
    Trajectories, simulate, read_trajectories   data: arrays, simulated, or read from files
    load_cascaded_tanks, load_silverbox         real benchmark data (checksummed, official splits)
    ceem, CEEMOptions, SmootherOptions,         the EM loop and its two steps' options
    LearnerOptions, CEEMResult, ceem_checkpointed
    refine_output_error, OutputErrorOptions     output-error (simulation-error) identification
    identify, compare_structures                the recommended pipeline; structure selection on estimation data
    estimate_initial_state, simulate_output     initial states from the first samples; free runs
    calibrate_noise, NoiseCalibrationOptions    process-noise level chosen on the estimation data
    parameter_uncertainty, UncertaintyOptions   covariance, intervals, identifiability
    validation_report                           free-run and k-step-ahead prediction metrics
    residual_analysis                           whiteness and input-independence of the residuals
    simulation_bands                            confidence bands of free runs and k-step predictions
    save_model, load_model, generate_ekf        model files (never pickle) and C code of EKF predictors
    export_casadi, design_input                 the model as CasADi Functions for control; optimal inputs
    n4sid, Sharded, Status                      linear baseline; distributed fits; the status of every fit
    CeemError, ShapeError, NonFiniteError,      typed errors (all ValueError or RuntimeError subclasses)
    ParameterError, OptionsError, SolverError

Everything else lives in the subpackages, one per concept: ``model``, ``io``, ``objective``,
``smoothing``, ``learning``, ``em``, ``workflow``, ``filtering``, ``baselines``, ``deploy``,
``distributed``, ``runtime``, ``cli`` (see docs/architecture.md).
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
    "SmootherOptions", "SolverError", "StateSpaceModel", "Status", "Trajectories", "UncertaintyOptions",
    "__version__", "baselines", "calibrate_noise", "ceem", "compare_structures", "ceem_checkpointed", "distributed",
    "design_input", "estimate_initial_state", "export_casadi", "filtering", "generate_ekf", "identify", "io", "load_cascaded_tanks", "load_model",
    "load_silverbox", "n4sid", "parameter_uncertainty", "read_trajectories", "refine_output_error", "save_model",
    "residual_analysis", "simulate", "simulate_output", "simulation_bands", "validation_report",
]
