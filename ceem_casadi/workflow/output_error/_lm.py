"""A trust-region Levenberg-Marquardt engine for nonlinear least squares with equality constraints
and bounds on exact sparse CasADi Jacobians: the solver of output error and `solve_least_squares`
(docs/output_error.md)."""
from __future__ import annotations

import contextlib
import logging
import time
from collections import namedtuple

import casadi as ca
import numpy as np
import scipy.sparse as sps

from ...errors import OptionsError, ShapeError
from ...runtime._best import BestIterate, checked_status
from ...runtime._solve import deadline_after
from ...runtime._status import Status
from ._output_error_options import LeastSquaresResult, OutputErrorOptions, raise_if_failed
from ._trust_region import Subproblem, second_order_correction

logger = logging.getLogger(__name__)
_ACCEPT = 1e-4          # minimum ratio actual / predicted reduction of the merit
_ROUNDOFF_GTOL = 1e-6   # cosine test of a point where no step decreases the objective any more
EXPLODING = 100.0       # objective / that of predicting zero output above which a run is "diverged"
FLAT_TOL, FLAT_ITERS = 1e-5, 10   # flat valley: relative decrease of the objective over the last iterations
STAT_TOL = 0.01         # Gauss-Newton step left, in standard errors of the estimate, of a converged run
GEO_H, GEO_ALPHA = 0.1, 0.75   # geodesic acceleration: finite-difference step, largest 2 |a| / |v| accepted
D_MEMORY = 0.9          # scaling D = max(D_MEMORY D, column norms of J): More's, forgetting stale sensitivities


class LeastSquaresProblem:
    """Evaluations the engine needs: ``evaluate(w, jac)`` -> ``(r (m,), J (m, n) or None, c (q,), C (q, n) or
    None)`` or None when not finite; ``objective(w)`` -> the objective that ranks iterates (inf when the
    free run is not finite); ``c_scale`` (q,) divides the gaps."""

    n_con = 0
    c_scale = np.ones(0)

    def reference_cost(self) -> float | None:
        """Objective of predicting zero output (the exploding-run guard's yardstick); None: no guard."""
        return None

    def exploding_advice(self, w) -> str | None:
        """What to do when the free run from ``w`` explodes; None when this problem cannot tell."""
        return None

    def objective(self, w, r=None):  # default: the least-squares cost itself
        if r is None:
            out = self.evaluate(w, False)
            if out is None:
                return np.inf
            r = out[0]
        return half_squared_norm(r)


def _blas_single_thread():
    """One BLAS thread for the engine's dense products when threadpoolctl is installed (docs/output_error.md)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def levenberg_marquardt(prob: LeastSquaresProblem, w0: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                        opts: OutputErrorOptions, expires: float | None) -> LeastSquaresResult:
    """Trust-region Levenberg-Marquardt from ``w0`` (n,) within bounds (n,); returns the best iterate."""
    with _blas_single_thread():
        return _Engine(prob, lower, upper, opts, expires).run(w0)


# an accepted trial step: the new iterate, its evaluation and the numbers of the stopping tests
_Trial = namedtuple("_Trial", "w out ratio step small_step small_f")


class _Engine:
    """One run of the method (docs/output_error.md): the state of the iteration (scaling ``D``, trust
    radius, l1 penalty ``nu``, best iterate) and one method per piece of an iteration."""

    def __init__(self, prob, lower, upper, opts, expires):
        self.prob, self.lower, self.upper, self.opts, self.expires = prob, lower, upper, opts, expires
        self.q, self.cs = prob.n_con, prob.c_scale
        self.tol, self.gap_tol = opts.tol, max(opts.tol, 1e-12) * 100
        self.stat_tol = min(STAT_TOL, 1e8 * opts.tol)   # 0.01 at the default tol
        self.nu = 0.0
        self.radius = None
        self.it = self.evals = 0
        self.se = np.nan      # the last Gauss-Newton step in standard errors (statistical test)

    # -- budget and tests ------------------------------------------------------------------------
    def _expired(self) -> bool:
        return self.expires is not None and time.perf_counter() >= self.expires

    def _merit(self, r, c) -> float:
        """Scaled objective plus the l1 penalty of the scaled gaps."""
        return half_squared_norm(r) / self.norm + (self.nu * float(np.abs(c / self.cs).sum()) if self.q else 0.0)

    def _feasible(self, c) -> bool:
        return self.q == 0 or float(np.max(np.abs(c / self.cs), initial=0.0)) <= self.gap_tol

    def _tiny(self, w, Dsafe) -> float:
        """Trust radius (scaled) below which no step is tried any more."""
        return self.tol * (self.tol + np.linalg.norm(w * Dsafe))

    # -- one iteration -----------------------------------------------------------------------------
    def _scaled_model(self, w, r, J):
        """Scale the Jacobian (More's ``D``, residuals by the start's objective); return the free
        mask and whether the cosine test (``gtol``, single shooting) holds."""
        dense, s = isinstance(J, np.ndarray), 1.0 / np.sqrt(self.norm)
        self.rs = r * s
        colnorm = s * (np.sqrt(np.einsum("ij,ij->j", J, J)) if dense else
                       np.sqrt(np.asarray(J.multiply(J).sum(axis=0)).ravel()))
        self.D = np.maximum(D_MEMORY * self.D, colnorm)
        self.Dsafe = np.where(self.D > 0, self.D, 1.0)
        self.Jsc = J * (s / self.Dsafe) if dense else (J @ sps.diags(s / self.Dsafe)).tocsc()
        grad = np.asarray(self.Jsc.T @ self.rs).ravel()
        span = np.maximum(1.0, np.abs(w))
        free = ~(((w <= self.lower + 1e-12 * span) & (grad > 0)) | ((w >= self.upper - 1e-12 * span) & (grad < 0)))
        self.cosine = np.zeros(0)
        if self.q:
            return free, grad, False
        rn = np.sqrt(float(self.rs @ self.rs))
        self.cosine = np.abs(grad[free]) / np.maximum((colnorm / self.Dsafe)[free] * rn, 1e-300)
        return free, grad, bool(rn == 0.0 or self.cosine.size == 0 or float(np.max(self.cosine)) <= self.tol)

    def _statistical_test(self, sub):
        """Single shooting: the message of a converged run when the full Gauss-Newton step ``d0`` is below
        ``stat_tol`` standard errors, ``||J d0|| / s`` with ``s^2 = ||r||^2 / (m - n)`` (docs/output_error.md)."""
        if self.q or self.rs.size <= sub.n:
            return None
        try:
            d0 = sub.solve(np.inf)[0]
        except (np.linalg.LinAlgError, RuntimeError, ValueError):
            return None
        s2 = max(float(self.rs @ self.rs) / (self.rs.size - sub.n), 1e-300)
        se = self.se = float(np.sqrt(max(float(d0 @ (sub.H @ d0)), 0.0) / s2))
        return (f"statistical test: the Gauss-Newton step left is {se:.2g} standard errors"
                if se <= self.stat_tol else None)

    def _subproblem(self, free, grad, c, C):
        Jf = self.Jsc if free.all() else self.Jsc[:, free]
        self.Cs = self.Cf = self.cv = None
        if self.q:
            self.Cs = (sps.diags(1.0 / self.cs) @ C @ sps.diags(1.0 / self.Dsafe)).tocsc()
            self.Cf, self.cv = self.Cs[:, free], c / self.cs
        H = sps.csc_matrix(Jf.T @ Jf) if isinstance(Jf, np.ndarray) else (Jf.T @ Jf).tocsc()
        return Subproblem(H, grad[free], self.Cf, self.cv)

    def _evaluate_trial(self, w_try):
        """The trial's evaluation and whether it may be accepted (finite; stable free run when asked)."""
        out = self.prob.evaluate(w_try, False)
        self.evals += 1
        ok = out is not None
        if ok and self.q and np.isfinite(self.history[-1]):   # from a start whose free run overflows: merit only
            ok = bool(np.isfinite(self.prob.objective(w_try)))
        return out, ok

    def _second_order_correction(self, w, w_try, out_try, free, m_now, pred):
        """Second-order correction (Maratos effect, docs/output_error.md): the corrected trial or None."""
        soc = second_order_correction(self.Cf, out_try[2] / self.cs, free, w.size)
        if soc is None:
            return None
        w_soc = np.clip(w_try + soc / self.Dsafe, self.lower, self.upper)
        out_soc, ok_soc = self._evaluate_trial(w_soc)
        if not ok_soc:
            return None
        ratio_soc = (m_now - self._merit(out_soc[0], out_soc[2])) / pred
        return (w_soc, out_soc, ratio_soc) if ratio_soc >= _ACCEPT else None

    def _try_step(self, sub, w, r, c, free):
        """One trial of radius ``self.radius``: ``_Trial`` when accepted, else None (radius shrunk)."""
        dfree, mult = None, None
        with contextlib.suppress(np.linalg.LinAlgError, RuntimeError, ValueError):
            dfree, mult = sub.solve(self.radius)
        if dfree is None or not np.all(np.isfinite(dfree)):
            self.radius *= 0.25
            return None
        d = np.zeros(w.size)
        d[free] = dfree
        v, step_v = d, float(np.linalg.norm(d))
        a = self._acceleration(sub, w, v, free) if self.q == 0 and sub.used > 0 else None
        d = v if a is None else v + 0.5 * a     # a damped step bent along the valley
        w_try = np.clip(w + d / self.Dsafe, self.lower, self.upper)
        d_eff = (w_try - w) * self.Dsafe
        step = float(np.linalg.norm(d_eff))
        if self.q and mult is not None:   # the l1 penalty from this step's multipliers (docs/output_error.md)
            self.nu = 1.1 * float(np.max(np.abs(mult), initial=0.0))
        m_now = self._merit(r, c)
        lin_r = self.rs + self.Jsc @ (v if d is not v else d_eff)   # accelerated: the velocity's prediction
        pred = m_now - (0.5 * float(lin_r @ lin_r)
                        + (self.nu * float(np.abs(self.cv + self.Cs @ d_eff).sum()) if self.q else 0.0))
        out_try, ok = self._evaluate_trial(w_try)
        ratio = (m_now - self._merit(out_try[0], out_try[2])) / pred if ok and pred > 0 else -1.0
        if self.q and out_try is not None and pred > 0 and ratio < _ACCEPT:
            corrected = self._second_order_correction(w, w_try, out_try, free, m_now, pred)
            if corrected is not None:
                (w_try, out_try, ratio), ok = corrected, True
                step = float(np.linalg.norm((w_try - w) * self.Dsafe))
        if ratio < 0.25:
            self.radius = 0.5 * (step if ok and step > 0 else self.radius)
        elif ratio > 0.75 and min(step, step_v) >= 0.95 * self.radius:
            self.radius *= 2.0
        if ratio < _ACCEPT:
            return None
        actual = ratio * pred
        rel = max(m_now, 1e-300)
        return _Trial(w_try, out_try, ratio, step, step <= self._tiny(w, self.Dsafe),
                      abs(actual) <= self.tol * rel and pred <= self.tol * rel)

    def _acceleration(self, sub, w, v, free):
        """Geodesic acceleration (n,) of the damped scaled step ``v`` from one residual evaluation at
        ``w + GEO_H v`` (docs/output_error.md); None when not finite or ``2 |a| / |v| > GEO_ALPHA``."""
        w_h = np.clip(w + GEO_H * v / self.Dsafe, self.lower, self.upper)
        out = self.prob.evaluate(w_h, False)
        self.evals += 1
        if out is None:
            return None
        v_h = (w_h - w) * self.Dsafe / GEO_H   # r_vv by finite differences, then a = -(H + lambda I)^-1 J^T r_vv
        r_vv = (2.0 / GEO_H) * ((out[0] / np.sqrt(self.norm) - self.rs) / GEO_H - self.Jsc @ v_h)
        Jf, a = (self.Jsc if free.all() else self.Jsc[:, free]), np.zeros(w.size)
        with contextlib.suppress(np.linalg.LinAlgError, RuntimeError, ValueError):
            a[free] = sub.solve_lam(sub.used, np.asarray(Jf.T @ r_vv).ravel())[0]
        return a if np.all(np.isfinite(a)) and 2.0 * np.linalg.norm(a) <= GEO_ALPHA * np.linalg.norm(v) else None

    def _search(self, sub, w, r, c, free):
        """Shrink the trust region until a trial is accepted (``_Trial``), or None (time, radius at round-off)."""
        while not self._expired():
            trial = self._try_step(sub, w, r, c, free)
            if trial is not None or self.radius <= self._tiny(w, self.Dsafe):
                return trial
        return None

    def _no_step_status(self, sub, w, c):
        """Status when no step was accepted: a stationary point (converged) or a stall."""
        if self._expired():
            return Status.TIME_LIMIT, "time limit"
        if self.q == 0:
            stationary = float(np.max(self.cosine, initial=0.0)) <= _ROUNDOFF_GTOL
        else:  # feasible, and the undamped step is at round-off relative to the iterate
            d0 = np.full(1, np.inf)
            with contextlib.suppress(np.linalg.LinAlgError, RuntimeError, ValueError):
                d0 = sub.solve(np.inf)[0]
            stationary = self._feasible(c) and \
                float(np.linalg.norm(d0)) <= np.sqrt(_ROUNDOFF_GTOL) * (1.0 + np.linalg.norm(w * self.Dsafe))
        return (Status.CONVERGED, "no decrease left above round-off at a stationary point") \
            if stationary else (Status.STALLED, "no acceptable step in a trust region down to xtol")

    def _converged_after(self, trial, c):
        """Status of the stopping tests after an accepted step, or None to go on."""
        if not self._feasible(c):
            return None
        if trial.small_step or trial.small_f:
            return Status.CONVERGED, "step test (xtol)" if trial.small_step else "reduction test (ftol)"
        k, h = FLAT_ITERS, self.history
        if len(h) > k and 0.0 <= h[-k - 1] - h[-1] <= FLAT_TOL * abs(h[-1]):   # fell, and by little (not rose)
            return Status.CONVERGED, (f"flat valley: the objective fell by less than {FLAT_TOL:g} "
                                      f"(relative) over the last {k} iterations")
        return None

    def _iterate(self, w, out):
        """Iterations from the evaluated ``w``; returns ``(w, status, why)``."""
        r, J, c, C = out
        while True:
            if self._expired():
                return w, Status.TIME_LIMIT, "time limit"
            if self.it >= self.opts.max_iters:
                return w, Status.MAX_ITERS, f"iteration limit ({self.opts.max_iters})"
            self.it += 1
            free, grad, gradient_test = self._scaled_model(w, r, J)
            if gradient_test:
                return w, Status.CONVERGED, "gradient test (gtol)"
            sub = self._subproblem(free, grad, c, C)
            resolved = self._statistical_test(sub)
            if resolved is not None:
                return w, Status.CONVERGED, resolved
            if self.radius is None:
                self.radius = float(np.linalg.norm(w * self.Dsafe)) or 1.0
            trial = self._search(sub, w, r, c, free)
            if trial is None:
                return (w, *self._no_step_status(sub, w, c))
            w = trial.w
            out = self.prob.evaluate(w, True)
            if out is None:  # pragma: no cover - the trial was finite at this point
                return w, Status.SOLVER_FAILED, "the Jacobian is not finite at an accepted iterate"
            r, J, c, C = out
            honest = self.prob.objective(w, r if self.q == 0 else None)
            self.history.append(honest)
            logger.debug("iteration %d: objective %.10g, trust radius %.3g, ratio %.3g, scaled step %.3g, "
                         "Gauss-Newton step %.3g standard errors", self.it, honest, self.radius, trial.ratio,
                         trial.step, self.se)
            self.best.offer(w, honest, label=f"iteration {self.it}")
            stop = self._converged_after(trial, c)
            if stop is not None:
                return (w, *stop)

    def run(self, w0) -> LeastSquaresResult:
        t0 = time.perf_counter()
        w = np.clip(np.asarray(w0, float), self.lower, self.upper)
        out = self.prob.evaluate(w, True)
        self.norm = np.inf if out is None else half_squared_norm(out[0])   # the objective relative to the start's
        honest_start = self.prob.objective(w, out[0] if self.q == 0 else None) if np.isfinite(self.norm) else np.inf
        self.best = BestIterate(w, honest_start, label="the starting point")
        self.history = [honest_start]
        if not np.isfinite(self.norm):   # diverged when the free run's growth is measured, else failed (`_finish`)
            return self._finish(w, Status.SOLVER_FAILED, "the residuals or the objective are not finite at the start",
                                honest_start, t0)
        self.norm = max(self.norm, 1e-300)
        self.D = np.zeros(w.size)
        w, status, why = self._iterate(w, out)
        return self._finish(w, status, why, honest_start, t0)

    def _finish(self, w, status, why, honest_start, t0) -> LeastSquaresResult:
        """The best iterate (`BestIterate`), the exploding-run guard, the result."""
        last = self.history[-1]
        w_out, cost, note = self.best.choose(w, last, label="the last iterate")
        if note != "returning the last iterate":
            returned = "start" if self.best.is_start else "best"
        elif len(self.history) == 1:
            returned, note = "start", "returning the starting point (no step was accepted)"
        else:
            returned = "last"
        status, explodes, advice = exploding_guard(self.prob, status, cost, w_out)
        status, refused = checked_status(status, cost)   # never "converged" on a non-finite objective
        why = refused or (f"{why}, but {explodes}" if explodes else why)
        gap = 0.0
        if self.q:
            o = self.prob.evaluate(w_out, False)
            gap = float(np.max(np.abs(o[2]), initial=0.0)) if o is not None else np.inf
        msg = f"Levenberg-Marquardt: {status} ({why}) after {self.it} iterations, {self.evals} trial evaluations; {note}"
        msg += f". {advice}" if advice else ""
        return LeastSquaresResult(w_out, float(cost), float(honest_start), status, msg, self.it, self.evals,
                                  time.perf_counter() - t0, returned, gap, self.history, advice=advice)


def half_squared_norm(r) -> float:
    """``0.5 ||r||^2`` of the residual vector ``r``; ``inf`` without a warning when it overflows."""
    with np.errstate(over="ignore"):
        return 0.5 * float(r @ r)


def exploding_guard(prob, status, cost, w):
    """``(status, note, advice)`` of a run returning ``w`` (objective ``cost``): ``diverged`` when ``cost`` is not
    finite or above `EXPLODING` x that of predicting zero output (from a failed solver only when the free run's
    growth is measured), ``note`` saying so and ``advice`` what to try (``prob.exploding_advice``); else ``""``."""
    ref = prob.reference_cost()
    if status is Status.TIME_LIMIT or ref is None or not np.isfinite(ref) or cost <= EXPLODING * max(ref, 1e-300):
        return status, "", ""
    advice = prob.exploding_advice(w)
    if status is Status.SOLVER_FAILED and advice is None:
        return status, "", ""
    return Status.DIVERGED, (f"the objective {cost:.3g} is {cost / max(ref, 1e-300):.3g} times that of predicting "
                             f"zero output ({ref:.3g}): the free run explodes"), advice or Status.DIVERGED.advice


# --------------------------------------------------------------------------------------------------
# generic problems
class _GenericProblem(LeastSquaresProblem):
    def __init__(self, residual: ca.Function, p):
        if not isinstance(residual, ca.Function) or residual.n_out() < 1 or residual.n_in() not in (1, 2):
            raise OptionsError("residual: expected a casadi.Function r(x) or r(x, p) with the residual vector "
                               f"as its first output, got {residual!r}")
        x = ca.MX.sym("x", residual.sparsity_in(0))
        args, self.p = [x], None
        if residual.n_in() == 2:
            args.append(ca.MX.sym("p", residual.sparsity_in(1)))
            self.p = ca.DM(np.zeros(residual.sparsity_in(1).shape) if p is None else np.asarray(p, float))
        r = ca.vec(residual(*args) if residual.n_out() == 1 else residual(*args)[0])
        self.F = ca.Function("lm_r", args, [r])
        self.FJ = ca.Function("lm_rJ", args, [r, ca.jacobian(r, x)])
        self.n = x.numel()

    def evaluate(self, w, jac):
        args = [w] if self.p is None else [w, self.p]
        if jac:
            r, J = self.FJ(*args)
            r, J = np.asarray(r, float).ravel(), J.sparse()     # J: scipy CSC
            return (r, J, np.zeros(0), None) if np.all(np.isfinite(r)) and np.all(np.isfinite(J.data)) else None
        r = np.asarray(self.F(*args), float).ravel()
        return (r, None, np.zeros(0), None) if np.all(np.isfinite(r)) else None


def box_bounds(value, n, fill, name):
    v = np.asarray(fill if value is None else value, float)
    if v.size not in (1, n):
        raise ShapeError(f"{name}: expected a scalar or {n} entries, got shape {v.shape}")
    return np.broadcast_to(v.ravel() if v.size > 1 else v, (n,)).astype(float)


def solve_least_squares(residual: ca.Function, x0, *, p=None, lower=None, upper=None,
                        options: OutputErrorOptions = OutputErrorOptions()) -> LeastSquaresResult:
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
    options : OutputErrorOptions
        ``max_iters``, ``tol``, ``time_limit``, ``raise_on_failure`` (the fields of output error
        proper are refused).

    Returns
    -------
    LeastSquaresResult
        ``x``, ``cost`` (never above the start's), ``status``, ``message``.

    Raises
    ------
    OptionsError
        ``options`` sets a field of output error proper (``solver``, ``use_prior``, ...).
    SolverError
        With ``options.raise_on_failure``, when the fit fails (``solver_failed`` or ``diverged``; the result attached).

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
    oe_only = [f for f in ("solver", "use_prior", "x0_window", "x_lower", "x_upper")
               if getattr(options, f) != getattr(OutputErrorOptions, f)]
    if oe_only:
        raise OptionsError(f"solve_least_squares: options {oe_only} apply to output error only, got {options!r}")
    prob = _GenericProblem(residual, p)
    w0 = np.asarray(x0, float).ravel()
    if w0.size != prob.n:
        raise ShapeError(f"x0: expected {prob.n} entries (the residual's first input), got {w0.size}")
    lo, hi = box_bounds(lower, prob.n, -np.inf, "lower"), box_bounds(upper, prob.n, np.inf, "upper")
    if np.any(lo > hi):
        raise ShapeError("lower must not exceed upper")
    expires = deadline_after(options.time_limit)  # never beyond a deadline already in force
    res = levenberg_marquardt(prob, w0, lo, hi, options, expires)
    raise_if_failed("solve_least_squares", res, options)
    return res
