"""Options and result of output-error identification ([`refine_output_error`][ceem_casadi.refine_output_error])."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...model._params import Theta
from ...runtime._result import Result, format_table, theta_rows
from ...runtime._schema import BOUND, HESSIANS, check_bounds, check_fields, check_time_limit, renamed, require
from ...runtime._status import Status
from ._lm_options import DEFAULT_MAX_ITER, LeastSquaresOptions

__all__ = ["OutputErrorOptions", "OutputErrorResult"]


@renamed(max_iter="max_iters")
@dataclass(frozen=True)
class OutputErrorOptions:
    """Options of [`refine_output_error`][ceem_casadi.refine_output_error].

    One options type for both solvers of the one output-error problem. A field that applies to
    one solver only (``hessian``: IPOPT; ``variable_projection``: Levenberg-Marquardt) is refused
    under the other with an [`OptionsError`][ceem_casadi.OptionsError]: no field is accepted and
    ignored.

    Parameters
    ----------
    max_iters : int
        Iteration limit (default `DEFAULT_MAX_ITER` = 200, shared with
        [`identify`][ceem_casadi.identify]'s output-error stage).
    tol : float
        Tolerance (default 1e-10): IPOPT's ``tol``; for ``solver="lm"`` the ``gtol`` (cosine test)
        of [`LeastSquaresOptions`][ceem_casadi.workflow.LeastSquaresOptions], its ``ftol`` and
        ``xtol`` at ``max(tol, 1e-8)`` (MINPACK's sqrt(eps) scale).
    solver : str
        ``"lm"`` (default): the Levenberg-Marquardt engine (exact sparse Jacobian, automatic
        scaling, rejection of non-finite or unstable trials, never returns an iterate worse than
        its start, status ``"diverged"`` with advice when the free run explodes). ``"ipopt"``: one
        IPOPT NLP (interior point, continuity as constraints).
    hessian : str, optional
        ``solver="ipopt"`` only: ``"gauss-newton"`` (the default there: ``J^T J`` of the output
        residuals, constraint curvature ignored) or ``"exact"`` (CasADi's exact Hessian of the
        Lagrangian; 2-5x slower per iteration). With multiple shooting on very short segments
        (``shooting=1``) Gauss-Newton can stall; use segments of a few samples, or ``"exact"``.
    variable_projection : bool, optional
        ``solver="lm"`` only: eliminate the parameters that enter the output linearly (polynomial
        coefficients, an MLP's output layer; found symbolically) by linear least squares at every
        evaluation (single shooting; separable least squares, Golub-Pereyra with Kaufman's
        Jacobian). Default ``None``: off (see
        [`LeastSquaresOptions`][ceem_casadi.workflow.LeastSquaresOptions] for the measurements).
    use_prior : bool
        Include the parameters' Gaussian priors.
    time_limit : float, optional
        Wall-clock budget in seconds for the whole call (initial states included), or ``None``;
        when spent, the solver stops at its next iteration and the result has status
        ``"time_limit"``.
    x0_window : int, optional
        Samples used to estimate initial states that are not given (default as in
        [`estimate_initial_state`][ceem_casadi.estimate_initial_state]).
    x_lower, x_upper : float or sequence of float, optional
        Bounds on the initial states and shooting nodes (scalar or (nx,)).
    raise_on_failure : bool
        Raise [`SolverError`][ceem_casadi.SolverError] instead of returning status ``"solver_failed"``.

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
    ...     cc.OutputErrorOptions(hessian="exact")
    ... except cc.OptionsError as err:
    ...     print(err)
    hessian applies to solver='ipopt' only (the Levenberg-Marquardt engine is Gauss-Newton by construction), got hessian='exact' with solver='lm'
    """

    max_iters: int = DEFAULT_MAX_ITER
    tol: float = 1e-10
    solver: str = "lm"
    hessian: str | None = None
    variable_projection: bool | None = None
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
        require(isinstance(self.max_iters, int) and self.max_iters >= 1, f"max_iters must be an int >= 1, got {self.max_iters!r}")
        require(np.isfinite(self.tol) and self.tol > 0, f"tol must be finite and > 0, got {self.tol!r}")
        require(self.hessian is None or self.hessian in HESSIANS,
                f"hessian must be None, 'gauss-newton' or 'exact', got {self.hessian!r}")
        require(self.variable_projection is None or isinstance(self.variable_projection, bool),
                f"variable_projection must be None, True or False, got {self.variable_projection!r}")
        require(self.solver == "ipopt" or self.hessian is None,
                "hessian applies to solver='ipopt' only (the Levenberg-Marquardt engine is Gauss-Newton by "
                f"construction), got hessian={self.hessian!r} with solver='lm'")
        require(self.solver == "lm" or self.variable_projection is None,
                "variable_projection applies to solver='lm' only, got "
                f"variable_projection={self.variable_projection!r} with solver='ipopt'")
        check_time_limit(self.time_limit)
        require(self.x0_window is None or (isinstance(self.x0_window, int) and self.x0_window >= 1),
                 f"x0_window must be None or an int >= 1, got {self.x0_window!r}")

    @property
    def ipopt_hessian(self) -> str:
        """The Hessian of the IPOPT NLP (``hessian``, default ``"gauss-newton"``)."""
        return self.hessian or "gauss-newton"

    def least_squares(self) -> LeastSquaresOptions:
        """The engine's `LeastSquaresOptions` for ``solver="lm"`` (IPOPT's ``tol`` is a scaled KKT
        error; the engine's relative reduction and step tests stop at MINPACK's sqrt(eps) scale at
        most: at 1e-10, 100,000 samples crept on for 400 iterations after the fit had settled in
        its first 25, same RMS to 4 digits)."""
        tol = self.tol
        return LeastSquaresOptions(max_iters=self.max_iters, ftol=max(tol, 1e-8), xtol=max(tol, 1e-8), gtol=tol,
                                   gap_tol=max(tol, 1e-12) * 100, time_limit=self.time_limit,
                                   use_prior=self.use_prior, x0_window=self.x0_window, x_lower=self.x_lower,
                                   x_upper=self.x_upper, raise_on_failure=self.raise_on_failure,
                                   variable_projection=bool(self.variable_projection))


@dataclass(repr=False)
class OutputErrorResult(Result):
    """Outcome of [`refine_output_error`][ceem_casadi.refine_output_error].

    Attributes
    ----------
    theta : dict
        Parameters, name -> array.
    x0 : numpy.ndarray
        (B, nx) initial state per trajectory.
    cost : float
        The minimised objective (module docstring) at the returned point.
    status : Status
        ``status.advice`` says what to try.
    message : str
        IPOPT's return status and more.
    iterations : int
        IPOPT iterations.
    wall_s : float
        Seconds for the whole call.
    initial_cost : float
        The objective at the start.
    constraint_violation : float
        Max |continuity gap| of multiple shooting (0 for single shooting).
    solver : str
        ``"lm"`` or ``"ipopt"``.
    returned : str
        ``solver="lm"``: which iterate came back (``"last"``, ``"best"``, ``"start"``).
    starts : list of dict
        ``solver="lm"`` with ``starts=``: one row per start.

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


    def table(self) -> str:
        """Status, iterations and the parameters as text (one row per parameter entry)."""
        head = f"{type(self).__name__}: {Status(self.status).value} after {self.iterations} iterations"
        return head + "\n" + format_table(["parameter", "value"], theta_rows(self.theta))
    @property
    def success(self) -> bool:
        """Whether ``status`` gives a regular estimate."""
        return self.status.usable
