"""Output-error (simulation-error) identification: one problem, one options type
([`OutputErrorOptions`][ceem_casadi.OutputErrorOptions]), the Levenberg-Marquardt engine (default)
and IPOPT (docs/output_error.md)."""
from ._lm import solve_least_squares
from ._output_error import refine_output_error
from ._output_error_options import LeastSquaresOptions, LeastSquaresResult, OutputErrorOptions, OutputErrorResult

__all__ = ["LeastSquaresOptions", "LeastSquaresResult", "OutputErrorOptions", "OutputErrorResult",
           "refine_output_error", "solve_least_squares"]
