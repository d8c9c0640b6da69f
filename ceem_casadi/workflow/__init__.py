"""Everything around a fit, one subpackage a concept: `output_error` (the simulation-error problem
and its solvers), `initialisation` (the FRF and the BLA initialiser of block-oriented models),
`design` (optimal experiment design) and `assessment` (validation metrics, residual analysis,
simulation bands, parameter uncertainty); here the recommended pipeline (`identify`, with its
structure search, multi-starts and noise-calibration stage) and the initial states every piece uses."""
from ._augment import Augmentation
from ._identify import IdentifyResult, StageFit, identify
from ._initial_state import InitialStateResult, estimate_initial_state
from ._noise_calibration import calibrate_noise
from ._noise_calibration_options import NoiseCalibrationOptions, NoiseCalibrationResult, NoiseLevelFit
from ._search_options import SearchOptions, SearchResult
from ._starts import log_uniform_starts
from ._structures import StructureComparison, compare_structures
from .assessment import (
    Band,
    Metrics,
    ParameterUncertainty,
    ResidualAnalysis,
    ResidualCorrelations,
    SimulationBands,
    UncertaintyOptions,
    ValidationReport,
    fit_percent,
    nrmse,
    parameter_uncertainty,
    residual_analysis,
    rmse,
    simulation_bands,
    validation_report,
)
from .design import DesignOptions, InputDesign, design_input, fisher_information
from .initialisation import FRF, FRFFit, bla_initialise, estimate_frf, fit_frf
from .output_error import (
    LeastSquaresOptions,
    LeastSquaresResult,
    OutputErrorOptions,
    OutputErrorResult,
    refine_output_error,
    solve_least_squares,
)

__all__ = ["Augmentation", "SearchOptions", "SearchResult", "log_uniform_starts", "DesignOptions", "FRF", "FRFFit", "bla_initialise", "estimate_frf", "fit_frf", "IdentifyResult", "InitialStateResult", "InputDesign", "LeastSquaresOptions",
           "LeastSquaresResult", "StageFit", "StructureComparison", "compare_structures", "identify",
           "solve_least_squares", "design_input", "fisher_information", "Metrics", "NoiseCalibrationOptions", "NoiseCalibrationResult", "NoiseLevelFit",
           "OutputErrorOptions", "OutputErrorResult", "ParameterUncertainty", "UncertaintyOptions",
           "ValidationReport", "calibrate_noise", "estimate_initial_state", "fit_percent", "nrmse",
           "parameter_uncertainty", "refine_output_error", "residual_analysis", "ResidualAnalysis",
           "ResidualCorrelations", "rmse", "validation_report", "Band", "SimulationBands", "simulation_bands"]
