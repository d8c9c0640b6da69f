"""A Levenberg-Marquardt (trust-region) engine for nonlinear least squares with equality
constraints and bounds, on exact sparse CasADi Jacobians: the solver behind output error
(`output_error_least_squares`) and `solve_least_squares` (module docstring of
`ceem_casadi.workflow._least_squares` for the method)."""
from __future__ import annotations

import contextlib
import logging
import time

import casadi as ca
import numpy as np
import scipy.linalg as sla
import scipy.sparse as sps
import scipy.sparse.linalg as spla

from ..errors import OptionsError, ShapeError, SolverError
from ..runtime._status import Status
from ._lm_options import LeastSquaresOptions, LeastSquaresResult

logger = logging.getLogger(__name__)
_ACCEPT = 1e-4          # minimum ratio actual / predicted reduction of the merit
_ROUNDOFF_GTOL = 1e-6   # cosine test of a point where no step decreases the objective any more
DENSE_MAX = 600         # unknowns + constraints up to which the step is solved densely


def to_csc(m: ca.DM) -> sps.csc_matrix:
    sp = m.sparsity()
    colind, row = sp.get_ccs()
    return sps.csc_matrix((np.asarray(m.nonzeros(), float), np.asarray(row), np.asarray(colind)), shape=m.shape)


class LeastSquaresProblem:
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


def levenberg_marquardt(prob: LeastSquaresProblem, w0: np.ndarray, lower: np.ndarray, upper: np.ndarray, opts: LeastSquaresOptions,
        expires: float | None) -> LeastSquaresResult:
    """Trust-region Levenberg-Marquardt (module docstring) from ``w0``; returns the best iterate."""
    with _blas_single_thread():
        return _lm_run(prob, w0, lower, upper, opts, expires)


def _lm_run(prob: LeastSquaresProblem, w0: np.ndarray, lower: np.ndarray, upper: np.ndarray, opts: LeastSquaresOptions,
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
        if it >= opts.max_iters:
            status, why = Status.MAX_ITERS, f"iteration limit ({opts.max_iters})"
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
        if self.q == 0 and self.n <= DENSE_MAX:
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
        if n <= DENSE_MAX:
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
class _GenericProblem(LeastSquaresProblem):
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
            J = to_csc(J)
            if not (np.all(np.isfinite(r)) and np.all(np.isfinite(J.data))):
                return None
            return r, J, np.zeros(0), None
        r = np.asarray(self.F(*args), float).ravel()
        return (r, None, np.zeros(0), None) if np.all(np.isfinite(r)) else None


def box_bounds(value, n, fill, name):
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
    lo, hi = box_bounds(lower, prob.n, -np.inf, "lower"), box_bounds(upper, prob.n, np.inf, "upper")
    if np.any(lo > hi):
        raise ShapeError("lower must not exceed upper")
    expires = None if options.time_limit is None else time.perf_counter() + options.time_limit
    res = levenberg_marquardt(prob, w0, lo, hi, options, expires)
    if options.raise_on_failure and res.status is Status.SOLVER_FAILED:
        raise SolverError(f"solve_least_squares: {res.message}. {res.status.advice}", res)
    return res
