"""A Levenberg-Marquardt engine for simulation (output) error, with exact sparse CasADi Jacobians.

The problem is the one of [`refine_output_error`][ceem_casadi.refine_output_error]: with the
free parameter entries ``z``, the shooting nodes ``s`` (one initial state per trajectory for single
shooting, one state every ``k`` samples for multiple shooting) and the weighted output residuals
``r(z, s)`` of the segments' free runs,

    min_{z, s}  0.5 ||r(z, s)||^2 + 0.5 ||(z - mu_p) / s_p||^2   s.t.  c(z, s) = 0,  lower <= (z, s) <= upper

with ``c`` the continuity gaps of multiple shooting (none for single shooting). Every iteration
evaluates ``r``, ``c`` and their exact sparse Jacobians ``J``, ``C`` with ONE call of a CasADi
Function (AD of the mapped ``mapaccum`` rollouts: no per-sample Python), then takes a damped
Gauss-Newton (Levenberg-Marquardt) step

    min_d  0.5 ||r + J d||^2 + 0.5 lambda ||D d||^2   s.t.  c + C d = 0,  d_i = 0 for active bounds

solved by a dense Cholesky / LU of the (bordered) normal equations, or by a sparse LU when the
unknowns are many (multiple shooting with many nodes). The scaling is automatic:

- parameters: ``D = diag`` of the largest column norms of ``J`` seen so far (More's scaling, as
  MINPACK), so the step and ``lambda`` do not depend on the units of the parameters;
- residuals: the objective is divided by its value at the start, and every stopping test is
  relative (MINPACK's ``ftol``, ``xtol`` and the cosine test ``gtol``), so multiplying ``y`` by
  100 changes nothing; the continuity gaps are divided by the spread of each state over the nodes.

A trial step is accepted when it reduces the merit ``f + nu ||c||_1`` by at least 1e-4 of the
reduction its linear model predicts; otherwise, and whenever the trial simulation is not finite (or,
with multiple shooting, the free run of the trial model from its initial state is not finite),
``lambda`` grows tenfold. The engine keeps the best iterate measured by the single-shooting
objective (the free run from the initial state, the quantity a user validates): whatever stops it
(tolerance, iteration or time limit, damping at its limit, a failure), it returns that iterate and
the message says which one (``"last"``, ``"best"`` or ``"start"``); the returned objective is never
above the start's. A ``KeyboardInterrupt`` propagates.

``starts=`` runs the engine from several starting parameter sets (multi-start) within the time
budget and returns the lowest objective, with one table row per start.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import casadi as ca
import numpy as np
import scipy.linalg as sla
import scipy.sparse as sps
import scipy.sparse.linalg as spla

from ..errors import OptionsError, ParameterError, ShapeError, SolverError
from ..io._data import Trajectories
from ..runtime._linalg import BufferedCall
from ..runtime._solve import deadline
from ..runtime._status import Status
from ._shooting import ShootingLayout

__all__ = ["LeastSquaresOptions", "LeastSquaresResult", "OutputErrorLeastSquares", "output_error_least_squares",
           "output_error_problem", "solve_least_squares"]

_ACCEPT = 1e-4          # minimum ratio actual / predicted reduction of the merit
logger = logging.getLogger(__name__)
_ROUNDOFF_GTOL = 1e-6   # cosine test of a point where no step decreases the objective any more
_SENS_MAX = 3e7      # doubles of forward sensitivities above which CasADi's reverse/forward AD is used
_DENSE_MAX = 600        # unknowns + constraints up to which the step is solved densely


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise OptionsError(msg)


@dataclass(frozen=True)
class LeastSquaresOptions:
    """Options of the Levenberg-Marquardt engine (`solve_least_squares`, `output_error_least_squares`).

    Parameters
    ----------
    max_iter : int
        Jacobian evaluations (outer iterations), default 200.
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
    initial_damping : float
        ``lambda`` of the first step relative to the scaled normal matrix (unit diagonal), default 1e-3.
    max_damping : float
        ``lambda`` beyond which no step can be found (status ``"stalled"``), default 1e12.
    use_prior : bool
        Include the parameters' Gaussian priors (output error only).
    reject_unstable : bool
        Multiple shooting: reject a trial whose free run from its initial state is not finite
        (default True).
    compile : bool or "auto"
        Output error: compile the sensitivity step (the model's step and its Jacobians, one small
        SX Function) to native code with the library's cached compiler (`ceem_casadi.compile`);
        ``"auto"`` (default) when the data have at least 20,000 samples. Falls back to CasADi's
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
    >>> LeastSquaresOptions(max_iter=50, time_limit=10.0).max_iter
    50
    """

    max_iter: int = 200
    ftol: float = 1e-10
    xtol: float = 1e-10
    gtol: float = 1e-10
    gap_tol: float = 1e-8
    flat_tol: float = 1e-5
    flat_iter: int = 10
    time_limit: float | None = None
    initial_damping: float = 1e-3
    max_damping: float = 1e12
    use_prior: bool = True
    reject_unstable: bool = True
    compile: object = "auto"
    x0_window: int | None = None
    x_lower: object = None
    x_upper: object = None
    raise_on_failure: bool = False

    def __post_init__(self):
        _check(isinstance(self.max_iter, int) and not isinstance(self.max_iter, bool) and self.max_iter >= 0,
               f"max_iter must be an int >= 0, got {self.max_iter!r}")
        _check(isinstance(self.flat_iter, int) and self.flat_iter >= 1, f"flat_iter must be an int >= 1, got {self.flat_iter!r}")
        for name in ("ftol", "xtol", "gtol", "gap_tol", "flat_tol", "initial_damping", "max_damping"):
            v = getattr(self, name)
            _check(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v > 0,
                   f"{name} must be a finite number > 0, got {v!r}")
        t = self.time_limit
        _check(t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and np.isfinite(t) and t > 0),
               f"time_limit must be None or a finite number of seconds > 0, got {t!r}")
        _check(self.compile in (True, False, "auto"), f"compile must be True, False or 'auto', got {self.compile!r}")
        _check(self.x0_window is None or (isinstance(self.x0_window, int) and self.x0_window >= 1),
               f"x0_window must be None or an int >= 1, got {self.x0_window!r}")


@dataclass
class LeastSquaresResult:
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


# --------------------------------------------------------------------------------------------------
# the engine
def _to_csc(m: ca.DM) -> sps.csc_matrix:
    sp = m.sparsity()
    colind, row = sp.get_ccs()
    return sps.csc_matrix((np.asarray(m.nonzeros(), float), np.asarray(row), np.asarray(colind)), shape=m.shape)


class _Problem:
    """Evaluations the engine needs (the output-error and the generic problems implement them).

    ``evaluate(w, jac)`` -> ``(r (m,), J (m, n) csc or None, c (q,), C (q, n) csc or None)`` or None
    when not finite; ``objective(w)`` -> the honest objective used to rank iterates (inf when the
    free run is not finite); ``c_scale`` (q,) divides the gaps."""

    n_con = 0
    c_scale = np.ones(0)

    def objective(self, w, r=None):  # default: the least-squares cost itself
        if r is None:
            out = self.evaluate(w, False)
            if out is None:
                return np.inf
            r = out[0]
        return 0.5 * float(r @ r)


def _blas_single_thread():
    """One BLAS thread for the engine's small dense products when threadpoolctl is installed (an
    optional extra): on a loaded 2-core machine the 100,000 x 28 Gram matrix took 4 ms or 1.5 s
    depending on whether OpenBLAS's threads had to be woken against other processes."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def _lm(prob: _Problem, w0: np.ndarray, lower: np.ndarray, upper: np.ndarray, opts: LeastSquaresOptions,
        expires: float | None) -> LeastSquaresResult:
    """Trust-region Levenberg-Marquardt (module docstring) from ``w0``; returns the best iterate."""
    with _blas_single_thread():
        return _lm_run(prob, w0, lower, upper, opts, expires)


def _lm_run(prob: _Problem, w0: np.ndarray, lower: np.ndarray, upper: np.ndarray, opts: LeastSquaresOptions,
            expires: float | None) -> LeastSquaresResult:
    t0 = time.perf_counter()
    w = np.clip(np.asarray(w0, float), lower, upper)
    out = prob.evaluate(w, True)
    if out is None:
        return LeastSquaresResult(w, np.inf, np.inf, Status.SOLVER_FAILED,
                                  "the residuals are not finite at the start; start inside the model's domain",
                                  0, 1, time.perf_counter() - t0, "start")
    r, J, c, C = out
    norm = max(0.5 * float(r @ r), 1e-300)      # residual scaling: the objective relative to the start's
    honest_start = prob.objective(w, r if prob.n_con == 0 else None)
    best = (honest_start, w.copy(), 0)
    history = [honest_start]
    q, cs = prob.n_con, prob.c_scale
    nu = 0.0
    D = np.zeros(w.size)
    radius = None
    status, why = None, ""
    it = evals = 0

    def merit(r_, c_):
        return 0.5 * float(r_ @ r_) / norm + (nu * float(np.abs(c_ / cs).sum()) if q else 0.0)

    while True:
        if expires is not None and time.perf_counter() >= expires:
            status, why = Status.TIME_LIMIT, "time limit"
            break
        if it >= opts.max_iter:
            status, why = Status.MAX_ITERS, f"iteration limit ({opts.max_iter})"
            break
        it += 1
        dense = isinstance(J, np.ndarray)
        Js, rs = J / np.sqrt(norm), r / np.sqrt(norm)
        colnorm = np.sqrt(np.einsum("ij,ij->j", Js, Js)) if dense else \
            np.sqrt(np.asarray(Js.multiply(Js).sum(axis=0)).ravel())
        D = np.maximum(D, colnorm)   # More's scaling
        Dsafe = np.where(D > 0, D, 1.0)
        Jsc = Js / Dsafe if dense else (Js @ sps.diags(1.0 / Dsafe)).tocsc()
        grad = np.asarray(Jsc.T @ rs).ravel()
        span = np.maximum(1.0, np.abs(w))
        free = ~(((w <= lower + 1e-12 * span) & (grad > 0)) | ((w >= upper - 1e-12 * span) & (grad < 0)))
        if q == 0:
            rn = np.sqrt(float(rs @ rs))
            colsc = (colnorm / Dsafe)[free]
            cosine = np.abs(grad[free]) / np.maximum(colsc * rn, 1e-300)
            if rn == 0.0 or cosine.size == 0 or float(np.max(cosine)) <= opts.gtol:
                status, why = Status.CONVERGED, "gradient test (gtol)"
                break
        Jf = Jsc[:, free]
        gf = grad[free]
        Cs = Cf = cv = None
        if q:
            Cs = (sps.diags(1.0 / cs) @ C @ sps.diags(1.0 / Dsafe)).tocsc()
            Cf, cv = Cs[:, free], c / cs
        sub = _Subproblem(sps.csc_matrix(Jf.T @ Jf) if dense else (Jf.T @ Jf).tocsc(), gf, Cf, cv)
        if radius is None:
            radius = float(np.linalg.norm(w * Dsafe)) or 1.0
        accepted = False
        while not accepted:  # shrink the trust region until a trial is accepted
            if expires is not None and time.perf_counter() >= expires:
                break
            try:
                dfree, mult = sub.solve(radius)
            except (np.linalg.LinAlgError, RuntimeError, ValueError):
                dfree, mult = None, None
            if dfree is not None and np.all(np.isfinite(dfree)):
                d = np.zeros(w.size)
                d[free] = dfree
                w_try = np.clip(w + d / Dsafe, lower, upper)
                d_eff = (w_try - w) * Dsafe
                step = float(np.linalg.norm(d_eff))
                if q and mult is not None:
                    # the l1 penalty from this step's multipliers (not the largest seen: a penalty
                    # kept from early iterations rejected good steps for their O(|d|^2) gaps and
                    # stalled the oscillator of tests/test_cli_workflow.py at 68x the optimum)
                    nu = 1.1 * float(np.max(np.abs(mult), initial=0.0))
                m_now = merit(r, c)
                lin_r = rs + Jsc @ d_eff
                pred = m_now - (0.5 * float(lin_r @ lin_r) + (nu * float(np.abs(cv + Cs @ d_eff).sum()) if q else 0.0))
                out_try = prob.evaluate(w_try, False)
                evals += 1
                ok = out_try is not None
                if ok and q and opts.reject_unstable:
                    ok = bool(np.isfinite(prob.objective(w_try)))
                ratio = (m_now - merit(out_try[0], out_try[2])) / pred if ok and pred > 0 else -1.0
                if q and out_try is not None and pred > 0 and ratio < _ACCEPT:
                    # second-order correction (Maratos effect: the l1 merit rejects good steps for the
                    # O(|d|^2) continuity gaps they open): least-norm step back onto c = 0, then retry
                    soc = _second_order_correction(Cf, out_try[2] / cs, free, w.size)
                    if soc is not None:
                        w_soc = np.clip(w_try + soc / Dsafe, lower, upper)
                        out_soc = prob.evaluate(w_soc, False)
                        evals += 1
                        ok_soc = out_soc is not None and (not opts.reject_unstable
                                                          or bool(np.isfinite(prob.objective(w_soc))))
                        if ok_soc:
                            ratio_soc = (m_now - merit(out_soc[0], out_soc[2])) / pred
                            if ratio_soc >= _ACCEPT:
                                w_try, out_try, ok, ratio = w_soc, out_soc, True, ratio_soc
                                d_eff = (w_try - w) * Dsafe
                                step = float(np.linalg.norm(d_eff))
                if ratio < 0.25:
                    radius = 0.25 * (step if ok and step > 0 else radius)
                elif ratio > 0.75 and step >= 0.95 * radius:
                    radius *= 2.0
                if ratio >= _ACCEPT:
                    actual = ratio * pred
                    small_step = step <= opts.xtol * (opts.xtol + np.linalg.norm(w * Dsafe))
                    rel = max(m_now, 1e-300)
                    small_f = abs(actual) <= opts.ftol * rel and pred <= opts.ftol * rel
                    w = w_try
                    accepted = True
                    break
            else:
                radius *= 0.25
            if radius <= opts.xtol * (opts.xtol + np.linalg.norm(w * Dsafe)):
                break
        if not accepted:
            if expires is not None and time.perf_counter() >= expires:
                status, why = Status.TIME_LIMIT, "time limit"
            else:  # the model predicts decreases that round-off swallows: a first-order point or a stall
                if q == 0:
                    stationary = float(np.max(cosine, initial=0.0)) <= _ROUNDOFF_GTOL
                else:  # feasible, and the undamped step is at round-off relative to the iterate
                    try:
                        d0 = sub.solve(np.inf)[0]
                    except (np.linalg.LinAlgError, RuntimeError, ValueError):
                        d0 = np.full(1, np.inf)
                    stationary = float(np.max(np.abs(c / cs), initial=0.0)) <= opts.gap_tol and \
                        float(np.linalg.norm(d0)) <= np.sqrt(_ROUNDOFF_GTOL) * (1.0 + np.linalg.norm(w * Dsafe))
                status, why = (Status.CONVERGED, "no decrease left above round-off at a stationary point") \
                    if stationary else (Status.STALLED, "no acceptable step in a trust region down to xtol")
            break
        out = prob.evaluate(w, True)
        if out is None:  # pragma: no cover - the trial was finite at this point
            status, why = Status.SOLVER_FAILED, "the Jacobian is not finite at an accepted iterate"
            break
        r, J, c, C = out
        honest = prob.objective(w, r if q == 0 else None)
        history.append(honest)
        logger.debug("iteration %d: objective %.10g, trust radius %.3g, ratio %.3g, scaled step %.3g",
                     it, honest, radius, ratio, step)
        if honest < best[0]:
            best = (honest, w.copy(), it)
        feasible = q == 0 or float(np.max(np.abs(c / cs), initial=0.0)) <= opts.gap_tol
        if feasible and (small_step or small_f):
            status, why = Status.CONVERGED, "step test (xtol)" if small_step else "reduction test (ftol)"
            break
        k = opts.flat_iter
        if feasible and len(history) > k and history[-k - 1] - history[-1] <= opts.flat_tol * abs(history[-1]):
            status, why = Status.CONVERGED, (f"flat valley: the objective fell by less than {opts.flat_tol:g} "
                                             f"(relative) over the last {k} iterations")
            break
    last = history[-1]
    if best[0] < last:
        w_out, cost, returned = best[1], best[0], ("start" if best[2] == 0 else "best")
        note = (f"returning the {'starting point' if best[2] == 0 else f'iterate of iteration {best[2]}'} "
                f"(lowest objective seen, {cost:.6g}; the last iterate had {last:.6g})")
    else:
        w_out, cost, returned = w, last, ("start" if len(history) == 1 else "last")
        note = "returning the last iterate (the lowest objective seen)" if returned == "last" else \
            "returning the starting point (no step was accepted)"
    gap = 0.0
    if q:
        o = prob.evaluate(w_out, False)
        gap = float(np.max(np.abs(o[2]), initial=0.0)) if o is not None else np.inf
    msg = f"Levenberg-Marquardt: {status} ({why}) after {it} iterations, {evals} trial evaluations; {note}"
    return LeastSquaresResult(w_out, float(cost), float(honest_start), status, msg, it, evals,
                              time.perf_counter() - t0, returned, gap, history)


class _Subproblem:
    """The scaled trust-region subproblem ``min 0.5 d^T H d + g^T d`` s.t. ``||d|| <= radius`` (and
    ``C d = -c``): solved exactly through an eigendecomposition of H when small and unconstrained,
    else through the Levenberg-Marquardt parameter ``lambda`` of ``(H + lambda I) d = -g - C^T y``,
    searched on a log scale until ``||d||`` is at most the radius."""

    def __init__(self, H, g, C, c):
        self.H, self.g, self.C, self.c = H, g, C, c
        self.n = H.shape[0]
        self.q = 0 if C is None else C.shape[0]
        self.eig = None
        if self.q == 0 and self.n <= _DENSE_MAX:
            S, V = np.linalg.eigh(H.toarray())
            self.eig = (np.maximum(S, 0.0), V, V.T @ g)
        self.lam = 0.0

    def _solve_lam(self, lam):
        if self.eig is not None:
            S, V, gt = self.eig
            return -V @ (gt / np.maximum(S + lam, 1e-14 * max(float(S.max(initial=0.0)), 1e-300))), None
        return _step(self.H, self.g, lam, self.C, self.c)

    def solve(self, radius):
        d, y = self._solve_lam(0.0)
        if np.linalg.norm(d) <= radius:
            return d, y
        if self.eig is not None:  # secular equation 1/||d(lam)|| = 1/radius by Newton (More-Sorensen)
            S, V, gt = self.eig
            lam = 1e-14 * max(float(S.max(initial=0.0)), 1e-300)   # S >= 0; a zero eigenvalue needs lam > 0
            for _ in range(50):
                den = S + lam
                dn = np.sqrt(float(np.sum(gt ** 2 / den ** 2)))
                if abs(dn - radius) <= 1e-3 * radius:
                    break
                dphi = float(np.sum(gt ** 2 / den ** 3)) / dn ** 3
                lam = max(lam + (1.0 / radius - 1.0 / dn) / dphi, 0.5 * lam + 1e-300)
            return -V @ (gt / (S + lam)), None
        lo, hi = 0.0, max(self.lam, 1e-8 * max(float(self.H.diagonal().max(initial=0.0)), 1e-300))
        while True:  # bracket
            d, y = _step(self.H, self.g, hi, self.C, self.c)
            if np.linalg.norm(d) <= radius or hi > 1e30:
                break
            lo, hi = hi, hi * 10.0
        for _ in range(6):  # refine on a log scale; keep a step inside the region
            mid = np.sqrt(max(lo, hi * 1e-3) * hi)
            dm, ym = _step(self.H, self.g, mid, self.C, self.c)
            if np.linalg.norm(dm) <= radius:
                hi, d, y = mid, dm, ym
            else:
                lo = mid
        self.lam = hi
        if np.linalg.norm(d) > radius and self.q == 0:
            d = d * (radius / np.linalg.norm(d))
        return d, y


def _second_order_correction(Cf, c_scaled, free, n):
    """Least-norm scaled correction ``d`` (n,) with ``C_f d_free = -c`` (None when it fails)."""
    try:
        M = (Cf @ Cf.T).tocsc()
        y = spla.splu(M + 1e-14 * max(float(M.diagonal().max(initial=0.0)), 1e-300)
                      * sps.identity(M.shape[0], format="csc")).solve(-c_scaled)
    except (RuntimeError, ValueError):
        return None
    d = np.zeros(n)
    d[free] = np.asarray(Cf.T @ y).ravel()
    return d if np.all(np.isfinite(d)) else None


def _step(H, g, lam, C, c):
    """Damped Gauss-Newton step (and multipliers) of the scaled problem: ``(H + lam I) d + C^T y = -g``,
    ``C d = -c``."""
    n = H.shape[0]
    q = 0 if C is None else C.shape[0]
    if q == 0:
        A = H + lam * sps.identity(n, format="csc")
        if n <= _DENSE_MAX:
            A = A.toarray()
            try:
                return sla.cho_solve(sla.cho_factor(A, lower=False, check_finite=True), -g), None
            except np.linalg.LinAlgError:
                return np.linalg.lstsq(A, -g, rcond=None)[0], None
        return spla.spsolve(A.tocsc(), -g), None
    # sparse LU of the bordered system (dense LAPACK of a few hundred unknowns was 50x slower on a
    # loaded 2-core machine: BLAS threads); a singular H at lam = 0 gets a round-off-sized damping
    lam = max(lam, 1e-12 * max(float(H.diagonal().max(initial=0.0)), 1e-300))
    K = sps.bmat([[H + lam * sps.identity(n, format="csc"), C.T], [C, None]], format="csc")
    sol = spla.splu(K).solve(np.concatenate([-g, -c]))
    return sol[:n], sol[n:]


# --------------------------------------------------------------------------------------------------
# generic problems
class _GenericProblem(_Problem):
    def __init__(self, residual: ca.Function, p):
        if not isinstance(residual, ca.Function) or residual.n_out() < 1 or residual.n_in() not in (1, 2):
            raise OptionsError("residual: expected a casadi.Function r(x) or r(x, p) with the residual vector "
                               f"as its first output, got {residual!r}")
        x = ca.MX.sym("x", residual.sparsity_in(0))
        args = [x]
        if residual.n_in() == 2:
            pp = ca.MX.sym("p", residual.sparsity_in(1))
            args.append(pp)
            self.p = ca.DM(np.zeros(residual.sparsity_in(1).shape) if p is None else np.asarray(p, float))
        else:
            self.p = None
        r = ca.vec(residual(*args) if residual.n_out() == 1 else residual(*args)[0])
        self.F = ca.Function("lm_r", args, [r])
        self.FJ = ca.Function("lm_rJ", args, [r, ca.jacobian(r, x)])
        self.n = x.numel()

    def evaluate(self, w, jac):
        args = [w] if self.p is None else [w, self.p]
        if jac:
            r, J = self.FJ(*args)
            r = np.asarray(r, float).ravel()
            J = _to_csc(J)
            if not (np.all(np.isfinite(r)) and np.all(np.isfinite(J.data))):
                return None
            return r, J, np.zeros(0), None
        r = np.asarray(self.F(*args), float).ravel()
        return (r, None, np.zeros(0), None) if np.all(np.isfinite(r)) else None


def _box(value, n, fill, name):
    v = np.asarray(fill if value is None else value, float)
    if v.size not in (1, n):
        raise ShapeError(f"{name}: expected a scalar or {n} entries, got shape {v.shape}")
    return np.broadcast_to(v.ravel() if v.size > 1 else v, (n,)).astype(float)


def solve_least_squares(residual: ca.Function, x0, *, p=None, lower=None, upper=None,
                        options: LeastSquaresOptions = LeastSquaresOptions()) -> LeastSquaresResult:
    """Minimise ``0.5 ||r(x)||^2`` subject to ``lower <= x <= upper`` with the engine of this module.

    Parameters
    ----------
    residual : casadi.Function
        ``r(x)`` or ``r(x, p)``: the residual vector (m,) (first output) of the unknowns (n,); its
        exact sparse Jacobian is built by CasADi AD once.
    x0 : array_like
        (n,) start.
    p : array_like, optional
        Value of the second input of ``residual``.
    lower, upper : float or array_like, optional
        Bounds (scalar or (n,)), default unbounded.
    options : LeastSquaresOptions
        Tolerances and limits (the output-error fields are ignored).

    Returns
    -------
    LeastSquaresResult
        ``x``, ``cost`` (never above the start's), ``status``, ``message``.

    Examples
    --------
    >>> import casadi as ca
    >>> from ceem_casadi.workflow import solve_least_squares
    >>> x = ca.SX.sym("x", 2)
    >>> rosenbrock = ca.Function("r", [x], [ca.vertcat(10 * (x[1] - x[0] ** 2), 1 - x[0])])
    >>> res = solve_least_squares(rosenbrock, [-1.2, 1.0])
    >>> str(res.status), [round(float(v), 6) for v in res.x]
    ('converged', [1.0, 1.0])
    """
    prob = _GenericProblem(residual, p)
    w0 = np.asarray(x0, float).ravel()
    if w0.size != prob.n:
        raise ShapeError(f"x0: expected {prob.n} entries (the residual's first input), got {w0.size}")
    lo, hi = _box(lower, prob.n, -np.inf, "lower"), _box(upper, prob.n, np.inf, "upper")
    if np.any(lo > hi):
        raise ShapeError("lower must not exceed upper")
    expires = None if options.time_limit is None else time.perf_counter() + options.time_limit
    res = _lm(prob, w0, lo, hi, options, expires)
    if options.raise_on_failure and res.status is Status.SOLVER_FAILED:
        raise SolverError(f"solve_least_squares: {res.message}. {res.status.advice}", res)
    return res


# --------------------------------------------------------------------------------------------------
# output error
class OutputErrorLeastSquares(_Problem):
    """Residuals, continuity gaps and their exact sparse Jacobians of the output-error problem for
    one model, set of trajectory lengths and shooting (built once per key, cached on the model:
    use `output_error_problem`).

    ``evaluate(w, jac)`` returns the weighted residuals (prior rows appended), their Jacobian (dense
    for single shooting with few unknowns, else sparse CSC), the continuity gaps and their sparse
    Jacobian; ``w`` = (free parameters, nodes (n_nodes, nx) row by row). The Jacobian comes from
    forward sensitivities ``S_x``, ``S_z`` propagated with the state in one mapped SX rollout.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from ceem_casadi.workflow import output_error_problem
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5)), measurement_std=1.0)
    >>> data = cc.Trajectories([np.ones((4, 1))], [np.zeros((4, 1))])
    >>> prob = output_error_problem(model, data.lengths, None)
    >>> prob.set_data(model, np.array([0.5]), data, use_prior=False)
    >>> r, J, g, C = prob.evaluate(np.array([0.5, 1.0]), True)
    >>> r.round(3).tolist(), J.shape
    ([0.0, 0.5, 0.75, 0.875], (4, 2))
    """

    def __init__(self, model, lengths, shooting, compiled: bool = False):
        from ..model._simulation import rollout

        self.compiled = bool(compiled)
        self.model, self.lengths, self.shooting = model, tuple(lengths), shooting
        nx, nu, ny = model.nx, model.nu, model.ny
        self.free = model.params.free_index
        nf = self.free.size
        layout = ShootingLayout.of(self.lengths, shooting)
        self.segs, self.groups, n_u, n_obs = layout.segs, layout.groups, layout.n_u, layout.n_obs
        n_nodes = len(self.segs)
        w = ca.MX.sym("w", nf + nx * n_nodes)
        z, nodes = w[:nf], ca.reshape(w[nf:], nx, n_nodes)
        npar = model.params.size
        syms = dict(p_base=ca.MX.sym("p_base", npar), U=ca.MX.sym("U", nu, n_u), Y=ca.MX.sym("Y", ny, n_obs),
                    M=ca.MX.sym("M", ny, n_obs), iv=ca.MX.sym("iv", ny))
        self._names = list(syms)
        E = ca.DM(ca.Sparsity.triplet(npar, nf, self.free.tolist(), list(range(nf))), 1.0)
        pvec = syms["p_base"] + ca.mtimes(E, z)
        yhat, gaps, u_col = [], [], 0
        for L, idx in self.groups:
            Yh, Xh = rollout(model, L).map(len(idx))(nodes[:, idx], syms["U"][:, u_col:u_col + L * len(idx)], pvec)
            u_col += L * len(idx)
            for j, i in enumerate(idx):
                _, _, n, nxt = self.segs[i]
                yhat.append(Yh[:, j * L:j * L + n])
                if nxt:
                    gaps.append(Xh[:, j * L + n] - nodes[:, i + 1])
        r = ca.vec(syms["M"] * ca.repmat(syms["iv"], 1, n_obs) * (syms["Y"] - ca.horzcat(*yhat)))
        g = ca.vertcat(*gaps) if gaps else ca.MX(0, 1)
        ins = [w, *syms.values()]
        self.F = ca.Function("oe_residuals", ins, [r, g])
        n_total = sum(L * len(idx) for L, idx in self.groups)
        # forward sensitivities in one mapped SX rollout (fast), unless they would not fit in memory
        self.sensitivity = n_total * nx * (nx + nf + 1) <= _SENS_MAX
        self._sens = None          # built at the first Jacobian (a problem used for values only never builds it)
        if not self.sensitivity:
            self.FJ = ca.Function("oe_residuals_jac", ins, [r, ca.jacobian(r, w), g, ca.jacobian(g, w)])
        self.n_con = int(g.numel())
        self.nw = int(w.numel())
        self.c_scale = np.ones(self.n_con)
        self._data = None
        self._single = None
        self._prior = (np.zeros(nf), np.zeros(nf))

    def _build_sensitivities(self, model, nf):
        """``x[t+1] = f``, ``S_x[t+1] = f_x S_x``, ``S_z[t+1] = f_x S_z + f_p E`` as one SX step mapped
        over time (``mapaccum``) and over the segments of every length (``map``), and the index
        arrays that scatter ``dy/dx0``, ``dy/dz`` and the gaps' derivatives into J and C."""
        nx, nu, npar = model.nx, model.nu, model.params.size
        x, u = ca.SX.sym("x", nx), ca.SX.sym("u", nu)
        Sx, Sz = ca.SX.sym("Sx", nx, nx), ca.SX.sym("Sz", nx, nf)
        pb, z = ca.SX.sym("pb", npar), ca.SX.sym("z", nf)
        E = ca.DM(ca.Sparsity.triplet(npar, nf, self.free.tolist(), list(range(nf))), 1.0)
        p = pb + ca.mtimes(E, z)
        fx_, gx_ = model.f(x, u, p), model.g(x, u, p)
        fx, fp = ca.jacobian(fx_, x), ca.jacobian(fx_, z)       # d/dz = d/dp E (p = pb + E z)
        gx, gp = ca.jacobian(gx_, x), ca.jacobian(gx_, z)
        xa = ca.vertcat(x, ca.vec(Sx), ca.vec(Sz))
        step = ca.Function("oe_sens_step", [xa, u, pb, z],
                           [ca.vertcat(fx_, ca.vec(ca.mtimes(fx, Sx)), ca.vec(ca.mtimes(fx, Sz) + fp))])
        out = ca.Function("oe_sens_out", [xa, u, pb, z],
                          [ca.vertcat(gx_, ca.vec(ca.mtimes(gx, Sx)), ca.vec(ca.mtimes(gx, Sz) + gp))])
        na = xa.numel()
        if self.compiled:
            try:
                from ..runtime._compile import compile_functions

                step, out = compile_functions([step, out], name=f"oe_sens_{model.name}")
            except RuntimeError as exc:  # no compiler, or it failed: the SX virtual machine
                logger.warning("output error: the sensitivity step was not compiled (%s); using CasADi's VM", exc)
                self.compiled = False
        self._sens = []
        x0m = ca.MX.sym("x0", nx)
        pbm, zm = ca.MX.sym("pb", npar), ca.MX.sym("z", nf)
        xa0 = ca.vertcat(x0m, ca.vec(ca.DM.eye(nx)), ca.DM.zeros(nx * nf))
        for L, idx in self.groups:
            Um = ca.MX.sym("U", nu, L)
            Xa = xa0 if L == 1 else ca.horzcat(xa0, step.mapaccum(L - 1)(xa0, Um[:, :L - 1], pbm, zm))
            Ya = out.map(L)(Xa, Um, pbm, zm)
            one = ca.Function(f"oe_sens_L{L}", [x0m, Um, pbm, zm], [Ya, Xa[:, L - 1]])
            self._sens.append(BufferedCall(one.map(len(idx), [False, False, True, True], [False, False])
                                           if len(idx) > 1 else one))
        self._na = na
        # scatter indices: residual rows (obs column c, output j) -> r index c * ny + j
        cols_node, tcols = [], []
        u_col = 0
        for L, idx in self.groups:
            for jj, i in enumerate(idx):
                n = self.segs[i][2]
                cols_node.append(np.full(n, i))
                tcols.append(u_col + jj * L + np.arange(n))        # column of the group's outputs
            u_col += L * len(idx)
        self._obs_node = np.concatenate(cols_node)
        self._obs_src = np.concatenate(tcols)                      # column in the concatenated group outputs
        self._gap_list = [(i, gi, jj) for gi, (L, idx) in enumerate(self.groups)
                          for jj, i in enumerate(idx) if self.segs[i][3]]

    def _jacobian(self, w):
        """``(r, J, g, C)`` from the forward sensitivities (see `_build_sensitivities`)."""
        nx, ny = self.model.nx, self.model.ny
        nf = self.free.size
        if self._sens is None:
            self._build_sensitivities(self.model, nf)
        z = w[:nf]
        nodes = w[nf:].reshape(-1, nx)
        pb = self._pbase
        Ys, ends = [], []
        u_col = 0
        U = self._U
        for (L, idx), fun in zip(self.groups, self._sens):
            Ya, Xe = fun(nodes[idx].T, U[:, u_col:u_col + L * len(idx)], pb, z)
            Ys.append(Ya.reshape(-1, L * len(idx), order="F"))
            ends.append(Xe.reshape(self._na, -1, order="F").copy())
            u_col += L * len(idx)
        Ya = (np.hstack(Ys) if len(Ys) > 1 else Ys[0])[:, self._obs_src]                      # (ny (1 + nx + nf), n_obs)
        n_obs = Ya.shape[1]
        wgt = self._M * self._iv[:, None]                          # (ny, n_obs)
        r = (wgt * (self._Y - Ya[:ny])).ravel(order="F")
        if not np.all(np.isfinite(Ya)):
            return None
        dx0 = Ya[ny:ny + ny * nx].reshape(nx, ny, n_obs)           # [k, j, c] = dy_j/dx0_k
        dz = Ya[ny + ny * nx:].reshape(nf, ny, n_obs)
        vz = -(wgt[None] * dz)                                     # (nf, ny, n_obs)
        vx = -(wgt[None] * dx0)
        if self.shooting is None and self.nw <= _DENSE_MAX and n_obs * ny * self.nw <= 5e7:   # dense: cheaper
            J = np.zeros((n_obs, ny, self.nw))
            J[:, :, :nf] = vz.transpose(2, 1, 0)
            for b_node in np.unique(self._obs_node):
                sel = self._obs_node == b_node
                J[sel, :, nf + b_node * nx:nf + (b_node + 1) * nx] = vx[:, :, sel].transpose(2, 1, 0)
            J = J.reshape(n_obs * ny, self.nw)
        else:
            rows = (np.arange(n_obs)[None, :] * ny + np.arange(ny)[:, None])  # (ny, n_obs): r index
            R1 = np.broadcast_to(rows[None], (nf, ny, n_obs))
            C1 = np.broadcast_to(np.arange(nf)[:, None, None], (nf, ny, n_obs))
            R2 = np.broadcast_to(rows[None], (nx, ny, n_obs))
            C2 = nf + self._obs_node[None, None, :] * nx + np.arange(nx)[:, None, None]
            J = sps.csc_matrix((np.concatenate([vz.ravel(), vx.ravel()]),
                                (np.concatenate([R1.ravel(), R2.ravel()]),
                                 np.concatenate([C1.ravel(), np.broadcast_to(C2, R2.shape).ravel()]))),
                               shape=(n_obs * ny, self.nw))
        q = len(self._gap_list)
        g = np.zeros(q * nx)
        Cr, Cc, Cv = [], [], []
        for k, (i, gi, jj) in enumerate(self._gap_list):
            xa = ends[gi][:, jj]
            g[k * nx:(k + 1) * nx] = xa[:nx] - nodes[i + 1]
            Sx = xa[nx:nx + nx * nx].reshape(nx, nx, order="F")
            Sz = xa[nx + nx * nx:].reshape(nx, nf, order="F")
            rr = k * nx + np.arange(nx)
            Cr += [np.repeat(rr, nf), np.repeat(rr, nx), rr]
            Cc += [np.tile(np.arange(nf), nx), np.tile(nf + i * nx + np.arange(nx), nx), nf + (i + 1) * nx + np.arange(nx)]
            Cv += [Sz.ravel(), Sx.ravel(), -np.ones(nx)]
        G = sps.csc_matrix((np.concatenate(Cv), (np.concatenate(Cr), np.concatenate(Cc))), shape=(q * nx, self.nw)) \
            if q else sps.csc_matrix((0, self.nw))
        if not (np.all(np.isfinite(g)) and np.all(np.isfinite(G.data))):
            return None
        return r, J, g, G

    # -- data ---------------------------------------------------------------------------------
    def set_data(self, model, theta_vec, data: Trajectories, use_prior: bool) -> None:
        """Bind the data (segment order), weights and base parameters (free entries zeroed)."""
        base = np.asarray(theta_vec, float).copy()
        base[self.free] = 0.0
        U, Y = [], []
        for L, idx in self.groups:
            for i in idx:
                b, s0, n, _ = self.segs[i]
                U.append(data.inputs(b)[s0:s0 + L].T)
                Y.append(data.y[b][s0:s0 + n].T)
        Y = np.hstack(Y)
        mask = np.isfinite(Y)
        self._U, self._Y, self._M = np.hstack(U), np.where(mask, Y, 0.0), mask.astype(float)
        self._pbase = base
        self._iv = np.asarray(model.noise.inv_measurement_std, float)
        self._data = [ca.DM(base), ca.DM(np.hstack(U)), ca.DM(np.where(mask, Y, 0.0)), ca.DM(mask.astype(float)),
                      ca.DM(np.asarray(model.noise.inv_measurement_std, float))]
        mean, wp = model.params.prior
        self._prior = (np.asarray(mean, float)[self.free], (np.asarray(wp, float) if use_prior
                                                            else np.zeros(model.params.size))[self.free])
        if self.shooting is not None:
            self._single = output_error_problem(model, self.lengths, None)
            self._single.set_data(model, theta_vec, data, use_prior)

    def evaluate(self, w, jac):
        nf = self.free.size
        mu, wp = self._prior
        rp = wp * (w[:nf] - mu)
        if jac and self.sensitivity:
            with np.errstate(all="ignore"):
                out = self._jacobian(w)
            if out is None:
                return None
            r, J, g, G = out
            if np.any(wp):
                Jp = sps.csc_matrix((wp, (np.arange(nf), np.arange(nf))), shape=(nf, self.nw))
                r = np.concatenate([r, rp])
                J = np.vstack([J, Jp.toarray()]) if isinstance(J, np.ndarray) else sps.vstack([J, Jp], format="csc")
            return r, J, g, G
        if jac:
            r, J, g, G = self.FJ(w, *self._data)
            r, g = np.asarray(r, float).ravel(), np.asarray(g, float).ravel()
            J, G = _to_csc(J), _to_csc(G)
            if not (np.all(np.isfinite(r)) and np.all(np.isfinite(J.data)) and np.all(np.isfinite(g))
                    and np.all(np.isfinite(G.data))):
                return None
            if np.any(wp):
                Jp = sps.csc_matrix((wp, (np.arange(nf), np.arange(nf))), shape=(nf, self.nw))
                r, J = np.concatenate([r, rp]), sps.vstack([J, Jp], format="csc")
            return r, J, g, G
        r, g = self.F(w, *self._data)
        r, g = np.asarray(r, float).ravel(), np.asarray(g, float).ravel()
        if not (np.all(np.isfinite(r)) and np.all(np.isfinite(g))):
            return None
        return (np.concatenate([r, rp]) if np.any(wp) else r), None, g, None

    def first_nodes(self) -> list[int]:
        """Index of every trajectory's first node."""
        return [i for i, (_, s0, _, _) in enumerate(self.segs) if s0 == 0]

    def objective(self, w, r=None):
        """Single-shooting objective (free run from every trajectory's first node)."""
        if self.shooting is None:
            return _Problem.objective(self, w, r)
        nf, nx = self.free.size, self.model.nx
        nodes = w[nf:].reshape(-1, nx)
        ws = np.concatenate([w[:nf], nodes[self.first_nodes()].ravel()])
        with np.errstate(all="ignore"):
            return self._single.objective(ws)

    def initial_nodes(self, model, theta_vec, data: Trajectories, x0: np.ndarray) -> np.ndarray:
        """(n_nodes, nx): the free run from x0 at the nodes (EKF/RTS states where it is not finite)."""
        from ..model._simulation import run
        from ..smoothing._initial_states import eks_states

        runs = []
        for b in range(len(data)):
            with np.errstate(all="ignore"):
                x = run(model, theta_vec, x0[b], data.inputs(b))[1]
            if self.shooting is not None and not np.all(np.isfinite(x)):
                x = eks_states(model, theta_vec, data[b])[0]
                x[0] = x0[b]
            runs.append(x)
        return np.array([runs[b][s0] for b, s0, _, _ in self.segs])


def output_error_problem(model, lengths, shooting, compiled: bool = False) -> OutputErrorLeastSquares:
    """The cached `OutputErrorLeastSquares` of ``model`` for these lengths and shooting (``compiled``:
    the sensitivity step compiled to native code, see `LeastSquaresOptions.compile`)."""
    cache = model.__dict__.setdefault("_output_error_least_squares", {})
    key = (tuple(int(t) for t in lengths), None if shooting is None else int(shooting), bool(compiled))
    if key not in cache:
        cache[key] = OutputErrorLeastSquares(model, *key)
    return cache[key]


def output_error_least_squares(model, data: Trajectories, theta: Mapping[str, Any], *, shooting: int | None = None,
                               x0=None, starts: Sequence[Mapping[str, Any]] | None = None,
                               options: LeastSquaresOptions = LeastSquaresOptions()) -> LeastSquaresResult:
    """Output-error fit of the free parameters and initial states by Levenberg-Marquardt (module docstring).

    Parameters
    ----------
    model : StateSpaceModel
        The model (its ``measurement_std`` weights the outputs).
    data : Trajectories
        B trajectories, NaN = missing output.
    theta : dict
        Starting parameters, name -> array (all names; fixed entries stay as given).
    shooting : int, optional
        ``None`` (single shooting) or the segment length k >= 1 of multiple shooting.
    x0 : array_like, optional
        Starting initial states (B, nx) or (nx,); default
        [`estimate_initial_state`][ceem_casadi.estimate_initial_state] per start.
    starts : sequence of dict, optional
        More starting parameter sets (each may give only some names; the others come from
        ``theta``): the engine runs from ``theta`` and from each, within ``options.time_limit``, and
        returns the lowest objective; ``result.starts`` has one row per start.
    options : LeastSquaresOptions
        Tolerances, limits, bounds on the states.

    Returns
    -------
    LeastSquaresResult
        ``theta`` (dict), ``x0`` (B, nx), ``x`` (free parameters then nodes), ``cost`` (the
        single-shooting objective, never above the start's), ``status``, ``message``, ``starts``.

    Raises
    ------
    SolverError
        Only with ``options.raise_on_failure`` when the status is ``"solver_failed"``.

    Examples
    --------
    >>> import casadi as ca, numpy as np, ceem_casadi as cc
    >>> from ceem_casadi.workflow import output_error_least_squares
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5)), measurement_std=0.1)
    >>> u = np.sin(0.3 * np.arange(50))[:, None]
    >>> y = cc.simulate_output(model, {"a": 0.8}, u, np.zeros(1))
    >>> res = output_error_least_squares(model, cc.Trajectories([y], [u]), {"a": 0.5}, x0=np.zeros(1))
    >>> str(res.status), round(float(res.theta["a"]), 6)
    ('converged', 0.8)
    """
    if not isinstance(options, LeastSquaresOptions):
        raise OptionsError(f"options must be a LeastSquaresOptions, got {type(options).__name__}")
    if not isinstance(data, Trajectories):
        raise ShapeError(f"data must be a Trajectories, got {type(data).__name__}")
    t0 = time.perf_counter()
    data.check_model(model)
    if shooting is not None and (int(shooting) != shooting or shooting < 1):
        raise ShapeError(f"shooting: expected None (single shooting) or a segment length >= 1, got {shooting!r}")
    base = model.params.validate(theta)
    candidates = [base]
    for i, s in enumerate(starts or ()):
        if not isinstance(s, Mapping):
            raise ParameterError(f"starts[{i}]: expected a dict of parameter values, got {type(s).__name__}")
        candidates.append(model.params.validate({**base, **s}))
    nx = model.nx
    lo_x, hi_x = _box(options.x_lower, nx, -np.inf, "x_lower"), _box(options.x_upper, nx, np.inf, "x_upper")
    if x0 is not None:
        x0 = np.asarray(x0, float)
        x0 = np.tile(x0, (len(data), 1)) if x0.ndim == 1 else x0
        if x0.shape != (len(data), nx) or not np.all(np.isfinite(x0)):
            raise ShapeError(f"x0: expected finite initial states ({len(data)}, {nx}) or ({nx},), got {x0.shape}")
    expires = None if options.time_limit is None else t0 + options.time_limit
    compiled = options.compile is True or (options.compile == "auto" and sum(data.lengths) >= 20000)
    prob = output_error_problem(model, data.lengths, shooting, compiled)
    free = prob.free
    n_nodes = len(prob.segs)
    lower = np.concatenate([model.params.lower[free], np.tile(lo_x, n_nodes)])
    upper = np.concatenate([model.params.upper[free], np.tile(hi_x, n_nodes)])
    rows, results = [], []
    for k, th in enumerate(candidates):
        if k > 0 and expires is not None and time.perf_counter() >= expires:
            rows.append(dict(start=k, initial_cost=float("nan"), cost=float("nan"), status="not run",
                             iterations=0, wall_s=0.0))
            continue
        ts = time.perf_counter()
        tv = model.params.to_vector(th)
        xs = x0
        if xs is None:
            from ._initial_state import estimate_initial_state

            try:
                with deadline(expires):
                    xs = estimate_initial_state(model, data, tv, window=options.x0_window, x_lower=lo_x, x_upper=hi_x)
            except SolverError as exc:
                rows.append(dict(start=k, initial_cost=float("nan"), cost=float("nan"), status="solver_failed",
                                 iterations=0, wall_s=time.perf_counter() - ts, message=str(exc)))
                continue
        prob.set_data(model, tv, data, options.use_prior)
        nodes = np.clip(prob.initial_nodes(model, tv, data, xs), lo_x, hi_x)
        if prob.n_con:
            spread = np.std(nodes, axis=0) if n_nodes > 1 else np.abs(nodes[0])
            spread = np.maximum(spread, 1e-6 * max(float(np.max(spread)), 1e-300))
            prob.c_scale = np.tile(np.where(spread > 0, spread, 1.0), n_nodes - len(data))
        w0 = np.concatenate([tv[free], nodes.ravel()])
        res = _lm(prob, w0, lower, upper, options, expires)
        res.initial_cost = float(res.initial_cost) if prob.n_con == 0 else prob.objective(w0)
        out = tv.copy()
        out[free] = res.x[:free.size]
        res.theta = model.params.from_vector(out)
        res.x0 = res.x[free.size:].reshape(n_nodes, nx)[prob.first_nodes()]
        rows.append(dict(start=k, initial_cost=float(res.initial_cost), cost=float(res.cost), status=str(res.status),
                         iterations=res.iterations, wall_s=time.perf_counter() - ts))
        results.append((k, res))
    if not results:
        raise SolverError("output_error_least_squares: no start could be run: "
                          + "; ".join(r.get("message", r["status"]) for r in rows))
    k, best = min(results, key=lambda kr: (not np.isfinite(kr[1].cost), kr[1].cost))
    best.starts = rows if len(candidates) > 1 else []
    if len(candidates) > 1:
        best.message += f"; start {k} of {len(candidates)} gave the lowest objective"
    if k != 0:
        best.initial_cost = results[0][1].initial_cost if results[0][0] == 0 else best.initial_cost
    best.wall_s = time.perf_counter() - t0
    if options.raise_on_failure and best.status is Status.SOLVER_FAILED:
        raise SolverError(f"output_error_least_squares: {best.message}. {best.status.advice}", best)
    return best
