"""Options and result of output-error identification ([`refine_output_error`][ceem_casadi.refine_output_error])."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from ...errors import SolverError
from ...model._params import Theta
from ...runtime._result import Result, format_table, theta_rows
from ...runtime._schema import BOUND, check_bounds, check_fields, check_time_limit, renamed, require
from ...runtime._status import Status

__all__ = ["LeastSquaresOptions", "LeastSquaresResult", "OutputErrorOptions", "OutputErrorResult"]


DEFAULT_MAX_ITER = 200   # the one default iteration limit of output error (refine_output_error, identify)


def _tol_alias(value, kwargs):
    """Use tol= (the one tolerance of every stopping test)."""
    kwargs["tol"] = min(value, kwargs.get("tol", value))


def _removed(name, why, accepted=()):
    """The deprecation hook of a removed field: refuses every value but ``accepted`` ones (OptionsError)."""
    def refuse(value, kwargs):
        require(value in accepted, f"OutputErrorOptions: {name} was removed ({why}), got {name}={value!r}")
    refuse.__doc__ = f"removed: {why}"
    return refuse


@renamed(max_iter="max_iters", ftol=_tol_alias, xtol=_tol_alias, gtol=_tol_alias, gap_tol=_tol_alias,
         hessian=_removed("hessian", "IPOPT's Hessian is Gauss-Newton from the engine's sensitivities; the exact one "
                          "never won: docs/output_error.md", (None, "gauss-newton")),
         **{k: _removed(k, "the flat-valley test is a fixed statistical test") for k in ("flat_tol", "flat_iter")},
         reject_unstable=_removed("reject_unstable", "trials whose free run is not finite are rejected once it is"),
         compile=_removed("compile", "the library compiles from 20,000 samples"),
         variable_projection=_removed("variable_projection", "slower or ending higher than the engine alone on every "
                                      "measured record: docs/output_error.md", (False,)))
@dataclass(frozen=True)
class OutputErrorOptions:
    """Options of [`refine_output_error`][ceem_casadi.refine_output_error], of
    [`identify`][ceem_casadi.identify]'s output-error stages and of
    [`solve_least_squares`][ceem_casadi.workflow.solve_least_squares]: the one options type of
    output error (docs/output_error.md). A field of one solver is refused under the other.

    Parameters
    ----------
    max_iters : int
        Iteration limit (Jacobian evaluations of the Levenberg-Marquardt engine), default 200.
    tol : float
        Relative tolerance of every stopping test (default 1e-10; IPOPT's ``tol``). The engine also
        stops (converged) when the Gauss-Newton step left is below ``min(0.01, 1e8 tol)`` standard
        errors of the estimate (docs/output_error.md). ``ftol``, ``xtol``, ``gtol``, ``gap_tol``:
        deprecated aliases.
    solver : str
        ``"lm"`` (default): the Levenberg-Marquardt engine; ``"ipopt"``: one IPOPT NLP (Gauss-Newton
        Hessian; ``hessian``: removed).
    use_prior : bool
        Include the parameters' Gaussian priors.
    time_limit : float, optional
        Seconds for the whole call (initial states and all starts included), then status ``"time_limit"``.
    x0_window : int, optional
        Samples used to estimate initial states that are not given
        ([`estimate_initial_state`][ceem_casadi.estimate_initial_state]).
    x_lower, x_upper : float or sequence of float, optional
        Bounds on the initial states and shooting nodes (scalar or (nx,)).
    raise_on_failure : bool
        Raise [`SolverError`][ceem_casadi.SolverError] (advice in its message, ``result`` attached) instead
        of returning a failed fit, status ``"solver_failed"`` or ``"diverged"``; other statuses return.

    Raises
    ------
    OptionsError
        A value out of range, or a field of the other solver (also a ``ValueError``).

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> opts = cc.OutputErrorOptions(max_iters=100, time_limit=5.0)
    >>> opts.max_iters, opts.solver, opts.time_limit
    (100, 'lm', 5.0)
    >>> try:
    ...     cc.OutputErrorOptions(max_iters=0, solver="ipopt")
    ... except cc.OptionsError as err:
    ...     print(err)
    max_iters must be >= 1 with solver='ipopt'
    """

    max_iters: int = DEFAULT_MAX_ITER
    tol: float = 1e-10
    solver: str = "lm"
    use_prior: bool = True
    time_limit: float | None = None
    x0_window: int | None = None
    x_lower: object = field(default=None, metadata=BOUND)
    x_upper: object = field(default=None, metadata=BOUND)
    raise_on_failure: bool = False

    def __post_init__(self):
        check_fields(self)
        check_bounds(self.x_lower, self.x_upper)
        require(self.solver in ("lm", "ipopt"), f"solver must be 'lm' or 'ipopt', got {self.solver!r}")
        require(isinstance(self.max_iters, int) and self.max_iters >= 0,
                f"max_iters must be an int >= 0, got {self.max_iters!r}")
        require(np.isfinite(self.tol) and self.tol > 0, f"tol must be finite and > 0, got {self.tol!r}")
        require(self.solver == "lm" or self.max_iters >= 1, "max_iters must be >= 1 with solver='ipopt'")
        check_time_limit(self.time_limit)
        require(self.x0_window is None or (isinstance(self.x0_window, int) and self.x0_window >= 1),
                f"x0_window must be None or an int >= 1, got {self.x0_window!r}")


def LeastSquaresOptions(**kwargs) -> OutputErrorOptions:
    """Deprecated: the [`OutputErrorOptions`][ceem_casadi.OutputErrorOptions] of ``kwargs`` (the
    engine's options type was folded into it).

    Parameters
    ----------
    **kwargs
        Fields of `OutputErrorOptions` (``ftol``, ``xtol``, ``gtol``, ``gap_tol`` map onto ``tol``).

    Returns
    -------
    OutputErrorOptions
        The options (with a ``DeprecationWarning``).

    Examples
    --------
    >>> import warnings
    >>> from ceem_casadi.workflow import LeastSquaresOptions
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     LeastSquaresOptions(max_iters=50, ftol=1e-8).tol
    1e-08
    """
    warnings.warn("LeastSquaresOptions is deprecated: use OutputErrorOptions (one options type of output error)",
                  DeprecationWarning, stacklevel=2)
    return OutputErrorOptions(**kwargs)


@dataclass(repr=False)
class OutputErrorResult(Result):
    """Outcome of [`refine_output_error`][ceem_casadi.refine_output_error].

    Attributes
    ----------
    theta, x0 : dict, numpy.ndarray
        Parameters (name -> array) and (B, nx) initial state per trajectory.
    cost, initial_cost : float
        The objective (docs/output_error.md) at the returned point and at the start.
    status : Status
        How the fit ended (``status.advice`` says what to try); ``message`` says what happened.
    iterations : int
        Iterations of the solver (``solver``: ``"lm"`` or ``"ipopt"``).
    wall_s : float
        Seconds for the whole call.
    constraint_violation : float
        Max |continuity gap| of multiple shooting (0 for single shooting).
    returned : str
        ``solver="lm"``: which iterate came back (``"last"``, ``"best"``, ``"start"``).
    starts : list of dict
        ``solver="lm"`` with ``starts=``: one row per start.
    advice : str
        Status ``diverged``: what to try, measured (the segment length of multiple shooting); else ``""``.

    Examples
    --------
    >>> import numpy as np
    >>> import ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1,
    ...                                          measurement_std=0.1)
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [1.0], 40, u=np.random.default_rng(0).normal(size=(40, 1)), seed=1)
    >>> res = cc.refine_output_error(model, data, {"a": 0.5}, x0=np.array([[1.0]]))
    >>> str(res.status), round(float(res.theta["a"]), 1), bool(res.cost < res.initial_cost)
    ('converged', 0.8, True)
    """

    SUMMARY = ('status', 'iterations', 'initial_cost', 'cost', 'theta')

    theta: Theta
    x0: np.ndarray
    cost: float
    status: Status
    message: str
    iterations: int
    wall_s: float
    initial_cost: float = float("nan")
    constraint_violation: float = 0.0
    solver: str = "ipopt"
    returned: str = ""
    starts: list = field(default_factory=list, repr=False)
    advice: str = ""

    def table(self) -> str:
        """Status, iterations and the parameters as text (one row per parameter entry)."""
        head = f"{type(self).__name__}: {Status(self.status).value} after {self.iterations} iterations"
        return head + "\n" + format_table(["parameter", "value"], theta_rows(self.theta))

    @property
    def success(self) -> bool:
        """Whether ``status`` gives a regular estimate."""
        return self.status.usable


@dataclass(repr=False)
class LeastSquaresResult(Result):
    """Outcome of [`solve_least_squares`][ceem_casadi.workflow.solve_least_squares] (and of the
    engine inside [`refine_output_error`][ceem_casadi.refine_output_error]).

    Attributes
    ----------
    x : numpy.ndarray
        (n,) the returned unknowns (output error: free parameters, then the nodes).
    cost, initial_cost : float
        ``0.5 ||r||^2`` (+ prior) at ``x`` and at the start (multiple shooting: the free-run objective).
    status : Status
        How the run ended (``status.advice`` says what to try); ``message`` says what happened.
    iterations, evaluations : int
        Jacobian evaluations; residual evaluations (trials included).
    wall_s : float
        Seconds.
    returned : str
        ``"last"``, ``"best"`` (an earlier iterate with a lower objective) or ``"start"``.
    constraint_violation : float
        Largest absolute continuity gap at ``x`` (0 for single shooting).
    history : list of float
        Objective after every accepted step.
    starts : list of dict
        Multi-start: one row per start; the result is the row with the lowest ``cost``.
    theta, x0 : dict, numpy.ndarray
        Output error: the parameters and (B, nx) initial states.
    advice : str
        Status ``diverged``: what to try, measured (the segment length of multiple shooting); else ``""``.

    Examples
    --------
    >>> import casadi as ca
    >>> from ceem_casadi.workflow import solve_least_squares
    >>> x = ca.SX.sym("x")
    >>> res = solve_least_squares(ca.Function("r", [x], [ca.vertcat(x - 2, 0.5 * (x - 2))]), [0.0])
    >>> res.returned, round(res.cost, 12), res.to_dict()["status"]
    ('last', 0.0, 'converged')
    """

    SUMMARY = ("status", "cost", "initial_cost", "iterations", "returned", "wall_s")

    x: np.ndarray
    cost: float
    initial_cost: float
    status: Status
    message: str
    iterations: int
    evaluations: int
    wall_s: float
    returned: str = "last"
    constraint_violation: float = 0.0
    history: list = field(default_factory=list, repr=False)
    starts: list = field(default_factory=list, repr=False)
    theta: dict | None = field(default=None, repr=False)
    x0: np.ndarray | None = field(default=None, repr=False)
    advice: str = ""

    @property
    def success(self) -> bool:
        """Whether ``status`` gives a regular estimate."""
        return self.status.usable


def raise_if_failed(where: str, res, options) -> None:
    """Raise `SolverError` carrying ``res`` when ``options.raise_on_failure`` and the fit failed (``solver_failed``,
    or ``diverged``: its message ends with the advice); ``max_iters``, ``time_limit`` and the others return."""
    if options.raise_on_failure and res.status in (Status.SOLVER_FAILED, Status.DIVERGED):
        raise SolverError(f"{where}: {res.message}" + ("" if res.advice else f". {res.status.advice}"), res)
