"""ceem_casadi: certainty-equivalent EM for partially observed nonlinear systems on CasADi.

Public API::

    Param, Parameters                 named parameters (structure)
    StateSpaceModel                   gray-box model (from_ode / from_discrete)
    Trajectories, simulate            data
    ceem, CEEMOptions, CEEMResult     the EM loop
    Smoother, Learner                 the two steps, reusable
    ceem_checkpointed                 a checkpointed, resumable fit
    save_model, load_model            integrity-checked model files (.npz, never pickle)
    validation_report, rmse, ...      free-run / k-step prediction metrics
    generate_ekf                      C99 EKF predictor of a learned model
    filtering                         EKF, Kalman filter, RTS smoother (one FilterResult)
    baselines                         N4SID (n4sid), particle filter/FFBSi/particle EM, LSTM
    io, read_trajectories             CSV/Parquet/npz trajectory files; restricted PyTorch reader
    MLP, AdamLearner                  neural-network terms of a model; Adam learning step (large models)
    load_cascaded_tanks, load_silverbox  real benchmark data (checksummed, official splits)
    simulate_output, rollout          noise-free free run (rollout Function cached per (model, T))
    estimate_initial_state            least-squares initial state from the first samples (IPOPT)
    refine_output_error               output-error (simulation-error) identification, single/multiple shooting
    Status                            result status (a str enum with advice), shared by every fit
    calibrate_noise                   CE-EM over a grid of process-noise levels, one chosen by a criterion
"""
from . import baselines, filtering, io
from .baselines import n4sid
from .deploy._codegen import GeneratedEKF, generate_ekf
from .deploy._modelfile import ModelFileError, SavedModel, load_model, save_model
from .em._ceem import ceem
from .em._checkpoint import CheckpointError, ceem_checkpointed
from .em._options import CEEMOptions
from .em._results import CEEMResult, IterationRecord
from .errors import CeemError, ModelError, NonFiniteError, OptionsError, ParameterError, ShapeError, SolverError
from .io import DataFileError, read_trajectories
from .io._data import Trajectories, simulate
from .io._datasets import (
    BenchmarkSplit,
    ChecksumError,
    DatasetNotFoundError,
    load_cascaded_tanks,
    load_silverbox,
    simulation_rms,
)
from .learning._adam import AdamLearner, AdamLearnerOptions
from .learning._learner import Learner, LearnResult
from .learning._options import LearnerOptions
from .model._model import Noise, StateSpaceModel
from .model._nn import MLP
from .model._params import Param, Parameters
from .model._simulation import rollout, simulate_output
from .objective._log_density import joint_log_density
from .runtime._status import Status
from .smoothing._options import SmootherOptions
from .smoothing._smoother import Smoother, SmoothResult
from .workflow._initial_state import InitialStateResult, estimate_initial_state
from .workflow._metrics import Metrics, ValidationReport, fit_percent, nrmse, rmse, validation_report
from .workflow._noise_calibration import NoiseCalibrationOptions, NoiseCalibrationResult, NoiseLevelFit, calibrate_noise
from .workflow._output_error import OutputErrorOptions, OutputErrorResult, refine_output_error
from .workflow._uncertainty import ParameterUncertainty, UncertaintyOptions, parameter_uncertainty

__version__ = "0.1.0"

__all__ = [
    "BenchmarkSplit", "CEEMOptions", "CEEMResult", "CeemError", "CheckpointError", "ChecksumError",
    "DatasetNotFoundError", "load_cascaded_tanks", "load_silverbox", "simulation_rms", "GeneratedEKF", "IterationRecord",
    "LearnResult", "Learner", "LearnerOptions", "Metrics", "ModelError", "ModelFileError", "Noise",
    "NonFiniteError", "Param", "ParameterError", "Parameters", "SavedModel", "ShapeError", "SmoothResult",
    "Smoother", "SmootherOptions", "SolverError", "StateSpaceModel", "Trajectories", "ValidationReport",
    "__version__", "ceem", "ceem_checkpointed", "fit_percent", "generate_ekf", "joint_log_density",
    "load_model", "nrmse", "rmse", "save_model", "simulate", "validation_report",
    "Status", "InitialStateResult", "estimate_initial_state", "rollout", "simulate_output",
    "OutputErrorOptions", "OutputErrorResult", "refine_output_error",
    "ParameterUncertainty", "UncertaintyOptions", "parameter_uncertainty",
]
__all__ += ["AdamLearner", "AdamLearnerOptions", "DataFileError", "MLP", "OptionsError", "baselines", "filtering",
            "io", "n4sid", "read_trajectories"]
__all__ += ["NoiseCalibrationOptions", "NoiseCalibrationResult", "NoiseLevelFit", "calibrate_noise"]
from .distributed._executors import Sharded  # noqa: E402  (CEEMOptions(executor=Sharded(client)); docs/scaling.md)

__all__ += ["Sharded"]
