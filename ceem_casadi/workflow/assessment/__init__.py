"""Assessment of an identified model before it is trusted: validation metrics, residual analysis, simulation
bands and parameter uncertainty (docs/validation.md, docs/uncertainty.md); re-exported by `ceem_casadi.workflow`."""
from ._bands import Band, SimulationBands, simulation_bands
from ._metrics import Metrics, ValidationReport, fit_percent, nrmse, rmse, validation_report
from ._residuals import ResidualAnalysis, ResidualCorrelations, residual_analysis
from ._uncertainty import parameter_uncertainty
from ._uncertainty_options import ParameterUncertainty, UncertaintyOptions

__all__ = ["Band", "Metrics", "ParameterUncertainty", "ResidualAnalysis", "ResidualCorrelations", "SimulationBands",
           "UncertaintyOptions", "ValidationReport", "fit_percent", "nrmse", "parameter_uncertainty",
           "residual_analysis", "rmse", "simulation_bands", "validation_report"]
