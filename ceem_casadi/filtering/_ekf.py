"""Extended Kalman filter and RTS smoother on a [`StateSpaceModel`][ceem_casadi.StateSpaceModel]: a Python loop or
one chunked ``mapaccum`` of an SX step, the same numbers (docs/model_learning_notes.md)."""
from __future__ import annotations

import logging

import casadi as ca
import numpy as np
from scipy.linalg.lapack import dtbtrs

from ..io._data import single_trajectory
from ..runtime import _policy as policy
from ..runtime._compile import compile_or_none, compiler
from ..runtime._linalg import BufferedCall
from ..runtime._solve import check_deadline
from ._kalman import forward, rts_smoother
from ._result import FilterResult, as_cov

log = logging.getLogger(__name__)


def _jacobian_functions(model):
    x, u, p = ca.SX.sym("x", model.nx), ca.SX.sym("u", model.nu), ca.SX.sym("p", model.params.size)
    fx, gx = model.f(x, u, p), model.g(x, u, p)
    F = ca.Function("f_jac", [x, u, p], [fx, ca.jacobian(fx, x)])
    G = ca.Function("g_jac", [x, u, p], [gx, ca.jacobian(gx, x)])
    return F, G


def ekf(model, theta_vec, y, u=None, *, x0, Sigma0, Q, R, smooth: bool = False,
        _fns=None) -> FilterResult:
    """Run the EKF (and optionally the RTS smoother) on one trajectory.

    Parameters
    ----------
    model : StateSpaceModel
        Its Jacobians are built here ([`EKF`][ceem_casadi.filtering.EKF] builds them once).
    theta_vec : numpy.ndarray
        (n_p,) flat parameter vector.
    y, u : numpy.ndarray
        (T, ny) observations, NaN = missing (entry-wise); (T, nu) inputs (None when nu = 0).
    x0 : numpy.ndarray
        (nx,) prior mean of the first state, ``x_{1|0}``.
    Sigma0, Q, R : float or numpy.ndarray
        Covariances of x[1], of the process and of the measurement noise: scalar, diagonal or matrix.
    smooth : bool
        Also run the Rauch-Tung-Striebel backward pass (``x_smooth``, ``P_smooth``).

    Returns
    -------
    FilterResult
        With the dynamics Jacobians ``A`` (T-1, nx, nx).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> from ceem_casadi.filtering import ekf
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [0.0], 20, u=np.ones((20, 1)), seed=0)
    >>> res = ekf(model, np.array([0.8]), data.y[0], data.inputs(0), x0=[0.0], Sigma0=1.0, Q=0.01, R=0.01)
    >>> res.x_filt.shape
    (20, 1)
    """
    nx, ny = model.nx, model.ny
    y, u = single_trajectory(model, y, u)
    Fj, Gj = _fns if _fns is not None else _jacobian_functions(model)
    Q, R, P = as_cov("Q", Q, nx), as_cov("R", R, ny), as_cov("Sigma0", Sigma0, nx)

    def observe(t, x):
        yp, C = Gj(x, u[t], theta_vec)
        return np.asarray(yp).ravel(), np.asarray(C)

    def advance(t, x):
        xn, A = Fj(x, u[t], theta_vec)
        return np.asarray(xn).ravel(), np.asarray(A)

    res = forward(y, np.asarray(x0, float).reshape(nx), P, Q, R, observe, advance)
    if smooth:
        rts_smoother(res)
    return res


def rts_gains(A, P_filt, P_pred_next) -> np.ndarray:
    """The RTS gains ``G_t = P_{t|t} A_t^T P_{t+1|t}^-1`` (k, nx, nx) of k steps from their (k, nx, nx) stacks."""
    return np.swapaxes(np.linalg.solve(P_pred_next, np.ascontiguousarray(A) @ np.ascontiguousarray(P_filt)), 1, 2)


def rts_means(xf, xp, G) -> np.ndarray:
    """The RTS smoothed means (T, nx) from the filtered and predicted means (T, nx) and the gains ``G`` (>= T-1, nx,
    nx; `rts_gains`) = ``rts_smoother(res).x_smooth``: banded triangular solves (docs/model_learning_notes.md)."""
    T, n = xf.shape
    # upper band storage: ab[u + i - j, j] = M[i, j], u = 2n - 1; M = I - blockdiag_sup(G), unit diagonal;
    # solved chunk by chunk from the end, each chunk with the next one's first state as its known last row
    u = 2 * n - 1
    out = np.array(xf, dtype=float)
    for a in reversed(range(0, T - 1, RTS_CHUNK)):
        b = min(a + RTS_CHUNK, T - 1)
        rhs = out[a:b + 1].copy()
        rhs[:b - a] -= (G[a:b] @ xp[a + 1:b + 1, :, None])[:, :, 0]
        ab = np.zeros((u + 1, (b - a + 1) * n), order="F")
        for i in range(n):  # M[t n + i, (t+1) n + j] = -G[t, i, j]: band row u - n + i - j, column (t+1) n + j
            for j in range(n):
                ab[u - n + i - j, n + j::n] = -G[a:b, i, j]
        x, info = dtbtrs(ab, rhs.reshape(-1, 1), uplo="U", trans="N", diag="U", overwrite_b=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"RTS means: banded triangular solve failed (info {info})")
        out[a:b] = x.reshape(-1, n)[:b - a]
    return out


RTS_CHUNK = 20_000  # steps per chunk of the RTS gains (bounded temporaries at T = 10^6)


def _step_function(model, fns) -> ca.Function:
    """One EKF step as an SX Function, entry-wise missing data by an exact 0/1 mask ``m`` (ny,)."""
    Fj, Gj = fns
    nx, ny = model.nx, model.ny
    x, P = ca.SX.sym("x", nx), ca.SX.sym("P", nx, nx)
    y, m = ca.SX.sym("y", ny), ca.SX.sym("m", ny)
    u, p = ca.SX.sym("u", model.nu), ca.SX.sym("p", model.params.size)
    Q, R = ca.SX.sym("Q", nx, nx), ca.SX.sym("R", ny, ny)
    yp, C = Gj(x, u, p)
    S = C @ P @ C.T + R
    M = ca.diag(m)
    Cm = M @ C
    Rm = M @ R @ M + ca.diag(1 - m)
    Sm = Cm @ P @ Cm.T + Rm
    e = m * (y - yp)
    K = ca.solve(Sm, Cm @ P).T  # P Cm^T Sm^-1
    xf = x + K @ e
    IKC = ca.SX.eye(nx) - K @ Cm
    Pf = IKC @ P @ IKC.T + K @ Rm @ K.T
    Pf = 0.5 * (Pf + Pf.T)
    xn, A = Fj(xf, u, p)
    Pn = A @ Pf @ A.T + Q
    Pn = 0.5 * (Pn + Pn.T)
    return ca.Function("ekf_step", [x, P, y, m, u, p, Q, R], [xn, Pn, yp, S, xf, Pf, A, Sm, e],
                       ["x_pred", "P_pred", "y", "mask", "u", "p", "Q", "R"],
                       ["x_next", "P_next", "y_pred", "S", "x_filt", "P_filt", "A", "S_obs", "e_obs"])


def _blocks(a, n: int, T: int) -> np.ndarray:
    """(n, n*T) horizontally stacked blocks -> (T, n, n)."""
    return np.asarray(a).reshape(n, T, n).transpose(1, 0, 2)


class EKF:
    """Reusable EKF for one model (the CasADi Jacobian Functions built once); ``run(..., engine="casadi")`` runs
    the forward pass as chunked ``mapaccum`` calls of an SX step (~10x faster per step, the same numbers).

    Parameters
    ----------
    model : StateSpaceModel
    compile : bool, optional
        ``engine="casadi"`` only: the step compiled to native code: always, never, or (None) when a C compiler
        exists and the work is large enough.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> from ceem_casadi.filtering import EKF
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [0.0], 20, u=np.ones((20, 1)), seed=0)
    >>> res = EKF(model, compile=False).run(np.array([0.8]), data.y[0], data.inputs(0), x0=[0.0], Sigma0=1.0,
    ...                                    Q=0.01, R=0.01, smooth=True)
    >>> res.x_smooth.shape
    (20, 1)
    """

    stop_at_deadline = False  # raise TimeLimitReached between chunks once the thread's deadline passed

    def __init__(self, model, compile: bool | None = None):
        self.model, self.compile = model, compile
        self._fns = _jacobian_functions(model)
        self._step = None
        self._native = None
        self._accum: dict[tuple[int, bool], BufferedCall] = {}

    def run(self, theta_vec, y, u=None, *, x0, Sigma0, Q, R, smooth: bool = False,
            engine: str = "python") -> FilterResult:
        """Filter (and optionally smooth) one trajectory: the arguments and result of
        [`ekf`][ceem_casadi.filtering.ekf]; ``engine`` ``"python"`` (a loop over time) or ``"casadi"``."""
        if engine == "casadi":
            return self._run_casadi(theta_vec, y, u, x0=x0, Sigma0=Sigma0, Q=Q, R=R, smooth=smooth)
        if engine != "python":
            raise ValueError(f"engine must be 'python' or 'casadi', got {engine!r}")
        return ekf(self.model, theta_vec, y, u, x0=x0, Sigma0=Sigma0, Q=Q, R=R, smooth=smooth,
                   _fns=self._fns)

    chunk = 4096  # steps per mapaccum, chained through (x, P): memory bounded in T, the same numbers

    def _native_step(self, T: int) -> bool:
        """Whether a pass over T steps runs the compiled step (compiled here on first use)."""
        from ..objective._stages import AUTO_COMPILE_WORK

        want = self.compile
        if want is None:
            want = compiler() is not None and T * self._step.n_instructions() >= AUTO_COMPILE_WORK
        if want and self._native is None:
            out = compile_or_none([self._step], f"ceem_ekf_{self.model.name}", log, "EKF step",
                                  strict=bool(self.compile))
            if out is None:
                self.compile = False  # no working compiler: the virtual machine from now on
                return False
            (self._native,) = out
        return bool(want)

    def _accumulator(self, n: int, native: bool) -> BufferedCall:
        if (n, native) not in self._accum:
            step = self._native if native else self._step
            acc = step.mapaccum(f"ekf_{n}", n, 2, {})
            # p, Q, R once (repeated inside the graph): the buffer interface takes exact shapes
            args = [ca.MX.sym(f"a{i}", step.size1_in(i), step.size2_in(i) * (n if 2 <= i <= 4 else 1))
                    for i in range(step.n_in())]
            outs = [ca.densify(o) for o in acc(*args)]  # dense: the flat outputs are reshaped
            self._accum[(n, native)] = BufferedCall(ca.Function(f"ekf_{n}_shared", args, outs))
        return self._accum[(n, native)]

    def _covariances(self, Q, R, Sigma0):
        """``(Q, R, Sigma0)`` as matrices (`as_cov`); builds the SX step on first use."""
        if self._step is None:
            self._step = _step_function(self.model, self._fns)
        nx = self.model.nx
        return as_cov("Q", Q, nx), as_cov("R", R, self.model.ny), as_cov("Sigma0", Sigma0, nx)

    def _run_casadi(self, theta_vec, y, u, *, x0, Sigma0, Q, R, smooth, means=False) -> FilterResult:
        y, u = single_trajectory(self.model, y, u)
        T = y.shape[0]
        Q, R, P = self._covariances(Q, R, Sigma0)
        mask = np.isfinite(y)
        Y, Mk, U, pv = np.where(mask, y, 0.0).T, mask.T.astype(float), u.T, np.asarray(theta_vec, float)
        x = np.asarray(x0, float).reshape(self.model.nx)
        out, loglik = self._empty(T, mask, means)
        native = self._native_step(T)
        for s in range(0, T, self.chunk):
            if s and self.stop_at_deadline:  # a fit's initial states on a long record: within its time limit
                check_deadline("the initial states (the EKF over the record)")
            e, n = min(s + self.chunk, T), min(self.chunk, T - s)
            # column-major flat outputs (overwritten by the next call: copied out below)
            flat = self._accumulator(n, native)(x, P, Y[:, s:e], Mk[:, s:e], U[:, s:e], pv, Q, R)
            x, P, ll = self._store(out, flat, s, e, x, P)
            loglik += ll
        return self._finish(out, loglik, smooth)

    def run_many(self, theta_vec, ys, us=None, *, x0, Sigma0, Q, R, smooth: bool = False,
                 means: bool = False) -> list[FilterResult]:
        """One `FilterResult` per trajectory of ``ys`` (T_b, ny) and ``us`` (T_b, nu; None when nu = 0): `run` with
        ``engine="casadi"`` on each, those of one length T <= ``chunk`` in one mapped call; the other arguments
        as for `run`, shared. ``means``: keep only ``x_pred``, ``x_filt`` and the RTS ``x_smooth`` (when the
        log-likelihood is finite), a third of the memory."""
        pairs = [single_trajectory(self.model, y, None if us is None else us[b]) for b, y in enumerate(ys)]
        res: list = [None] * len(pairs)
        groups: dict[int, list[int]] = {}
        for b, (y, _) in enumerate(pairs):
            groups.setdefault(y.shape[0], []).append(b)
        Qc, Rc, P0 = self._covariances(Q, R, Sigma0)
        x0, pv = np.asarray(x0, float).reshape(self.model.nx), np.asarray(theta_vec, float)
        for T, idx in groups.items():
            k = min(len(idx), max(1, policy.CALL_COLUMNS // T))
            if T > self.chunk or k == 1:
                for b in idx:
                    res[b] = self._run_casadi(pv, *pairs[b], x0=x0, Sigma0=P0, Q=Qc, R=Rc, smooth=smooth, means=means)
                continue
            call = self._mapped(T, k, self._native_step(T * len(idx)))  # compiled for the whole group's work
            for a in range(0, len(idx), k):
                part = idx[a:a + k]
                part = part + [part[0]] * (k - len(part))            # padded with copies of the first
                masks = [np.isfinite(pairs[b][0]) for b in part]
                Y = np.hstack([np.where(m, pairs[b][0], 0.0).T for m, b in zip(masks, part)])
                Mk = np.hstack([m.T.astype(float) for m in masks])
                U = np.hstack([pairs[b][1].T for b in part])
                flat = call(x0, P0, Y, Mk, U, pv, Qc, Rc)
                per = [np.reshape(f, (k, -1)) for f in flat]          # trajectory j's block is contiguous
                for j, b in enumerate(idx[a:a + k]):
                    out, loglik = self._empty(T, masks[j], means)
                    _, _, ll = self._store(out, [f[j] for f in per], 0, T, x0, P0)
                    res[b] = self._finish(out, loglik + ll, smooth)
        return res

    def _mapped(self, T: int, k: int, native: bool) -> BufferedCall:
        """The accumulator over T steps mapped over k trajectories (x0, P0, p, Q, R shared)."""
        key = ("many", T, k, native)
        if key not in self._accum:
            fun = self._accumulator(T, native).fun
            shared = [True, True, False, False, False, True, True, True]
            self._accum[key] = BufferedCall(fun.map(k, shared, [False] * fun.n_out()))
        return self._accum[key]

    def _empty(self, T: int, mask: np.ndarray, means: bool = False) -> tuple[dict, float]:
        nx, ny = self.model.nx, self.model.ny
        # written in place chunk by chunk; ``means``: the RTS gains G (T, nx, nx) instead of covariances and Jacobians
        out = dict(x_pred=np.empty((T, nx)), x_filt=np.empty((T, nx)))
        out.update(dict(G=np.empty((T, nx, nx))) if means else
                   dict(P_pred=np.empty((T, nx, nx)), y_pred=np.empty((T, ny)), S=np.empty((T, ny, ny)),
                        P_filt=np.empty((T, nx, nx)), A=np.empty((T, nx, nx))))
        return out, -0.5 * mask.sum() * np.log(2 * np.pi)

    def _store(self, out: dict, flat, s: int, e: int, x, P):
        """Copy one chunk's flat accumulator outputs (steps s .. e-1, started from x, P) into
        ``out``; returns the next (x, P) and the chunk's log-likelihood terms."""
        nx, ny, n = self.model.nx, self.model.ny, e - s
        rows = (nx, nx, ny, ny, nx, nx, nx, ny, ny)
        xn, Pn, yp, S, xf, Pf, A, Sm, r = (np.asarray(a).reshape(-1, k).T for a, k in zip(flat, rows))
        Pn, Pf, A = _blocks(Pn, nx, n), _blocks(Pf, nx, n), _blocks(A, nx, n)
        out["x_pred"][s], out["x_pred"][s + 1:e], out["x_filt"][s:e] = x, xn[:, :-1].T, xf.T
        if "G" in out:  # the last step's gain (towards a prediction past the record) is not used
            out["G"][s:e] = rts_gains(A, Pf, Pn)
        else:
            out["P_pred"][s], out["P_pred"][s + 1:e], out["P_filt"][s:e], out["A"][s:e] = P, Pn[:-1], Pf, A
            out["y_pred"][s:e], out["S"][s:e] = yp.T, _blocks(S, ny, n)
        L = np.linalg.cholesky(_blocks(Sm, ny, n))
        alpha = np.linalg.solve(L, r.T[:, :, None])[:, :, 0]
        ll = -0.5 * np.sum(alpha ** 2) - np.log(np.diagonal(L, axis1=1, axis2=2)).sum()
        return xn[:, -1].copy(), Pn[-1].copy(), ll

    @staticmethod
    def _finish(out: dict, loglik: float, smooth: bool) -> FilterResult:
        if "G" in out:
            G = out.pop("G")
            x_smooth = rts_means(out["x_filt"], out["x_pred"], G) if np.isfinite(loglik) else None
            return FilterResult(None, None, P_pred=None, P_filt=None, loglik=float(loglik), x_smooth=x_smooth, **out)
        out["A"] = out["A"][:-1]
        res = FilterResult(loglik=float(loglik), **out)
        if smooth:
            rts_smoother(res)
        return res
