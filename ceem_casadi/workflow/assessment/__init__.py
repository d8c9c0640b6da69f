"""Assessment of an identified model before it is trusted: validation metrics of free runs and
k-step predictions (`validation_report`), residual analysis (whiteness and independence of the
inputs, `residual_analysis`), simulation bands from the parameter covariance (`simulation_bands`)
and the parameter uncertainty itself (`parameter_uncertainty`). Public names are re-exported by
`ceem_casadi.workflow`."""
from ._bands import Band, SimulationBands, simulation_bands
from ._metrics import Metrics, ValidationReport, fit_percent, nrmse, rmse, validation_report
from ._residuals import ResidualAnalysis, ResidualCorrelations, residual_analysis
from ._uncertainty import parameter_uncertainty
from ._uncertainty_options import ParameterUncertainty, UncertaintyOptions

__all__ = ["Band", "Metrics", "ParameterUncertainty", "ResidualAnalysis", "ResidualCorrelations", "SimulationBands",
           "UncertaintyOptions", "ValidationReport", "fit_percent", "nrmse", "parameter_uncertainty",
           "residual_analysis", "rmse", "simulation_bands", "validation_report"]
