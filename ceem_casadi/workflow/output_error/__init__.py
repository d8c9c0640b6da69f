"""Output-error (simulation-error) identification: one problem (the weighted residuals of the free
runs of every trajectory, single or multiple shooting), one options type
([`OutputErrorOptions`][ceem_casadi.OutputErrorOptions]) and the solvers behind it: the
Levenberg-Marquardt engine (default; variable projection of the parameters that enter the
output linearly) and IPOPT. Public names are re-exported by `ceem_casadi.workflow` (and
`refine_output_error`, `OutputErrorOptions` by `ceem_casadi`)."""
from ._lm import solve_least_squares
from ._output_error import refine_output_error
from ._output_error_options import LeastSquaresOptions, LeastSquaresResult, OutputErrorOptions, OutputErrorResult

__all__ = ["LeastSquaresOptions", "LeastSquaresResult", "OutputErrorOptions", "OutputErrorResult",
           "refine_output_error", "solve_least_squares"]
