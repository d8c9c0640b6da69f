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
from .ceem import ceem
from .checkpoint import CheckpointError, ceem_checkpointed
from .codegen import GeneratedEKF, generate_ekf
from .data import Trajectories, simulate
from .datasets import (
                       BenchmarkSplit,
                       ChecksumError,
                       DatasetNotFoundError,
                       load_cascaded_tanks,
                       load_silverbox,
                       simulation_rms,
)
from .errors import CeemError, ModelError, NonFiniteError, OptionsError, ParameterError, ShapeError, SolverError
from .initial_state import InitialStateResult, estimate_initial_state
from .io import DataFileError, read_trajectories
from .learner import Learner, LearnResult
from .learner_adam import AdamLearner, AdamLearnerOptions
from .metrics import Metrics, ValidationReport, fit_percent, nrmse, rmse, validation_report
from .model import Noise, StateSpaceModel
from .modelfile import ModelFileError, SavedModel, load_model, save_model
from .nn import MLP
from .noise_calibration import NoiseCalibrationOptions, NoiseCalibrationResult, NoiseLevelFit, calibrate_noise
from .objective import joint_log_density
from .options import CEEMOptions, LearnerOptions, SmootherOptions
from .output_error import OutputErrorOptions, OutputErrorResult, refine_output_error
from .params import Param, Parameters
from .results import CEEMResult, IterationRecord
from .simulation import rollout, simulate_output
from .smoother import Smoother, SmoothResult
from .status import Status
from .uncertainty import ParameterUncertainty, UncertaintyOptions, parameter_uncertainty

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
from .identify import IdentifyResult, StageFit, StructureComparison, compare_structures, identify  # noqa: E402
from .least_squares import LeastSquaresOptions, LeastSquaresResult, solve_least_squares  # noqa: E402

__all__ += ["IdentifyResult", "StageFit", "StructureComparison", "compare_structures", "identify",
            "LeastSquaresOptions", "LeastSquaresResult", "solve_least_squares"]
from .distributed import Sharded  # noqa: E402  (CEEMOptions(executor=Sharded(client)); docs/scaling.md)

__all__ += ["Sharded"]
