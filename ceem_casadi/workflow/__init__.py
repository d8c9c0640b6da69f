"""Everything around a fit: initial states, output-error refinement, noise calibration, parameter
uncertainty and identifiability, validation metrics, optimal experiment design,
the best-linear-approximation initialiser of block-oriented models (and the nonparametric BLA of periodic data), the least-squares engine of output error and the recommended pipeline (`identify`, with its
structure search and multi-starts)."""
from ._augment import Augmentation
from ._bands import Band, SimulationBands, simulation_bands
from ._bla import bla_initialise
from ._experiment_design import DesignOptions, InputDesign, design_input, fisher_information
from ._frf import FRF, estimate_frf
from ._frf_fit import FRFFit, fit_frf
from ._identify import IdentifyResult, StageFit, identify
from ._initial_state import InitialStateResult, estimate_initial_state
from ._metrics import Metrics, ValidationReport, fit_percent, nrmse, rmse, validation_report
from ._noise_calibration import calibrate_noise
from ._noise_calibration_options import NoiseCalibrationOptions, NoiseCalibrationResult, NoiseLevelFit
from ._residuals import ResidualAnalysis, ResidualCorrelations, residual_analysis
from ._search_options import SearchOptions, SearchResult
from ._starts import log_uniform_starts
from ._structures import StructureComparison, compare_structures
from ._uncertainty import parameter_uncertainty
from ._uncertainty_options import ParameterUncertainty, UncertaintyOptions
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
