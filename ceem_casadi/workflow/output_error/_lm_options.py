"""Options and result of the Levenberg-Marquardt engine of simulation error (`solve_least_squares`,
`output_error_least_squares`)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from ...runtime._result import Result
from ...runtime._schema import check_fields, renamed, require
from ...runtime._status import Status

DEFAULT_MAX_ITER = 200   # the one default iteration limit of output error (refine_output_error, identify)


@renamed(max_iter="max_iters")
@dataclass(frozen=True)
class LeastSquaresOptions:
    """Options of the Levenberg-Marquardt engine (`solve_least_squares`, `output_error_least_squares`).

    Parameters
    ----------
    max_iters : int
        Jacobian evaluations (outer iterations), default `DEFAULT_MAX_ITER` = 200 (the one default
        of output error: `refine_output_error` and `identify` share it).
    ftol : float
        Stop when both the actual and the predicted relative reduction of the objective are below
        ``ftol`` (MINPACK's test), default 1e-10.
    xtol : float
        Stop when the scaled step is below ``xtol`` times the scaled iterate, default 1e-10.
    gtol : float
        Stop when every free column's cosine with the residual vector, ``|J_i^T r| / (||J_i|| ||r||)``,
        is below ``gtol`` (single shooting only), default 1e-10.
    flat_tol, flat_iter : float, int
        Stop (converged) when the objective fell by less than ``flat_tol`` (relative) over the last
        ``flat_iter`` iterations (default 1e-5 over 10): a flat valley where full Gauss-Newton steps
        keep creeping (measured: the 100,000-sample Wiener-Hammerstein bench crept on for 400
        iterations at a relative decrease of 1e-6 per step after settling in 25, its RMS unchanged
        to four digits). The message says when this test stopped the run.
    gap_tol : float
        Multiple shooting: largest continuity gap (relative to each state's spread over the nodes)
        of a converged iterate, default 1e-8.
    time_limit : float, optional
        Wall-clock seconds for the whole call (all starts), or ``None``.
    variable_projection : bool
        Output error, single shooting: eliminate the parameter entries that enter the output
        linearly (polynomial coefficients, an MLP's output layer; detected symbolically) by a
        linear least-squares solve at every evaluation and run the engine on the others
        (`ceem_casadi.workflow.output_error._varpro`). Default False (measured in
        `scripts/bench_output_error_solvers.py`: fewer iterations on polynomial block-oriented
        models, e.g. 50 against 500 unconverged on a badly conditioned Wiener-Hammerstein
        record, the same on Cascaded Tanks and Silverbox, more on a tanh MLP nonlinearity).
    use_prior : bool
        Include the parameters' Gaussian priors (output error only).
    reject_unstable : bool
        Multiple shooting: reject a trial whose free run from its initial state is not finite
        (default True).
    compile : bool, optional
        Output error: compile the sensitivity step (the model's step and its Jacobians, one small
        SX Function) to native code with the library's cached compiler, as ``compile`` of every
        options class; ``None`` (default: the library decides) when the data have at least 20,000
        samples (``"auto"`` is the deprecated spelling of ``None``). Falls back to CasADi's
        virtual machine, with a warning, when no compiler works.
    x0_window : int, optional
        Samples of [`estimate_initial_state`][ceem_casadi.estimate_initial_state] for initial states
        that are not given (output error only).
    x_lower, x_upper : float or sequence of float, optional
        Bounds on the initial states and nodes (scalar or (nx,)).
    raise_on_failure : bool
        Raise [`SolverError`][ceem_casadi.SolverError] when the status is ``"solver_failed"``.

    Examples
    --------
    >>> from ceem_casadi.workflow import LeastSquaresOptions
    >>> LeastSquaresOptions(max_iters=50, time_limit=10.0).max_iters
    50
    """

    max_iters: int = DEFAULT_MAX_ITER
    ftol: float = 1e-10
    xtol: float = 1e-10
    gtol: float = 1e-10
    gap_tol: float = 1e-8
    flat_tol: float = 1e-5
    flat_iter: int = 10
    time_limit: float | None = None
    variable_projection: bool = False
    use_prior: bool = True
    reject_unstable: bool = True
    compile: bool | None = None
    x0_window: int | None = None
    x_lower: object = None
    x_upper: object = None
    raise_on_failure: bool = False

    def __post_init__(self):
        if self.compile == "auto":  # the deprecated spelling of None (one meaning of compile)
            warnings.warn("LeastSquaresOptions(compile='auto') is deprecated: use compile=None", DeprecationWarning,
                          stacklevel=3)
            object.__setattr__(self, "compile", None)
        check_fields(self)
        require(isinstance(self.max_iters, int) and not isinstance(self.max_iters, bool) and self.max_iters >= 0,
               f"max_iters must be an int >= 0, got {self.max_iters!r}")
        require(isinstance(self.flat_iter, int) and self.flat_iter >= 1, f"flat_iter must be an int >= 1, got {self.flat_iter!r}")
        require(isinstance(self.variable_projection, bool),
                f"variable_projection must be True or False, got {self.variable_projection!r}")
        for name in ("ftol", "xtol", "gtol", "gap_tol", "flat_tol"):
            v = getattr(self, name)
            require(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v > 0,
                   f"{name} must be a finite number > 0, got {v!r}")
        t = self.time_limit
        require(t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and np.isfinite(t) and t > 0),
               f"time_limit must be None or a finite number of seconds > 0, got {t!r}")
        require(self.x0_window is None or (isinstance(self.x0_window, int) and self.x0_window >= 1),
               f"x0_window must be None or an int >= 1, got {self.x0_window!r}")


@dataclass(repr=False)
class LeastSquaresResult(Result):
    """Outcome of the engine.

    Attributes
    ----------
    x : numpy.ndarray
        (n,) the returned unknowns (for output error: free parameters, then the nodes).
    cost : float
        Objective ``0.5 ||r||^2`` (+ prior) at ``x``; for multiple shooting the single-shooting
        (free-run) objective.
    initial_cost : float
        The same at the start.
    status : Status
        How the run ended (``status.advice`` says what to try).
    message : str
        What happened, and which iterate is returned.
    iterations : int
        Jacobian evaluations.
    evaluations : int
        Residual evaluations (trials included).
    wall_s : float
        Seconds.
    returned : str
        ``"last"`` (the final iterate), ``"best"`` (an earlier iterate with a lower objective) or
        ``"start"``.
    constraint_violation : float
        Largest absolute continuity gap at ``x`` (0 for single shooting).
    history : list of float
        Objective after every accepted step.
    starts : list of dict
        Multi-start: one row per start (``start``, ``initial_cost``, ``cost``, ``status``,
        ``iterations``, ``wall_s``); the result is the row with the lowest ``cost``.

    Examples
    --------
    >>> from ceem_casadi.workflow import LeastSquaresResult
    >>> import casadi as ca
    >>> from ceem_casadi.workflow import solve_least_squares
    >>> x = ca.SX.sym("x")
    >>> res = solve_least_squares(ca.Function("r", [x], [ca.vertcat(x - 2, 0.5 * (x - 2))]), [0.0])
    >>> res.returned, round(res.cost, 12), res.to_dict()["status"]
    ('last', 0.0, 'converged')
    """

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

    def __repr__(self) -> str:
        return (f"LeastSquaresResult(status={self.status}, cost={self.cost:.6g}, initial_cost={self.initial_cost:.6g}, "
                f"iterations={self.iterations}, returned={self.returned!r}, wall_s={self.wall_s:.3g})")

    @property
    def success(self) -> bool:
        """Whether ``status`` gives a regular estimate."""
        return self.status.usable

    def table(self) -> str:
        """One line per start (a single line without multi-start)."""
        rows = self.starts or [dict(start=0, initial_cost=self.initial_cost, cost=self.cost, status=str(self.status),
                                    iterations=self.iterations, wall_s=self.wall_s)]
        out = [f"{'start':>5}  {'initial cost':>14}  {'cost':>14}  {'status':<13}  {'iter':>5}  {'wall s':>7}"]
        for r in rows:
            out.append(f"{r['start']:>5}  {r['initial_cost']:14.7g}  {r['cost']:14.7g}  {r['status']:<13}  "
                       f"{r['iterations']:>5}  {r['wall_s']:7.2f}")
        return "\n".join(out)

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        d = dict(x=self.x.tolist(), cost=self.cost, initial_cost=self.initial_cost, status=str(self.status),
                 message=self.message, iterations=self.iterations, evaluations=self.evaluations, wall_s=self.wall_s,
                 returned=self.returned, constraint_violation=self.constraint_violation, history=list(self.history),
                 starts=list(self.starts))
        if self.theta is not None:
            d["theta"] = {k: np.asarray(v).tolist() for k, v in self.theta.items()}
            d["x0"] = np.asarray(self.x0).tolist()
        return d
