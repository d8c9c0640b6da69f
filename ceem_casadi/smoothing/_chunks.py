"""The smoothing objective's cost, gradient and Hessian evaluated in time chunks of L steps, no CasADi
intermediate of size T (docs/long_records.md, "Chunked smoothing objective")."""
from __future__ import annotations

import copy
import logging

import casadi as ca
import numpy as np

from ..objective._stages import SMOOTHER_STAGES
from ..runtime._compile import compile_or_none
from ..runtime._linalg import BufferedCall
from ._banded import band_patterns, release_heap

log = logging.getLogger(__name__)


def _chunk_function(stages, L: int, band_column: ca.Function, outputs: str = "ipopt", raw: bool = False) -> ca.Function:
    """``(Xc, xl, xr, Uc, ul, Yc, Mc, on, p, iw, iv, rho) -> (cost, G (nx, L), nz (k, L), cost_sx)``;
    ``outputs="newton"``: without ``cost_sx``; ``"cost"``: the cost alone (no derivatives); ``raw``: with the SX
    stage Functions (to be compiled whole), else `StageFunctions.get`'s."""
    model = stages.model
    nx, nu, ny, npar = model.nx, model.nu, model.ny, model.params.size
    Xc, xl, xr = ca.MX.sym("Xc", nx, L), ca.MX.sym("xl", nx), ca.MX.sym("xr", nx)
    Uc, ul = ca.MX.sym("Uc", nu, L), ca.MX.sym("ul", nu)
    Yc, Mc, on = ca.MX.sym("Yc", ny, L), ca.MX.sym("Mc", ny, L), ca.MX.sym("on", 1, L + 1)
    p, iw, iv, rho = ca.MX.sym("p", npar), ca.MX.sym("iw", nx), ca.MX.sym("iv", ny), ca.MX.sym("rho")
    Xe = ca.horzcat(xl, Xc, xr)                  # columns a-1 .. a+L
    iw_s = ca.mtimes(iw, on)                      # (nx, L+1): 0 for stages outside the record
    obs_args = [Xc, Uc, Yc, Mc, p, iv]
    dyn_args = [Xe[:, :-1], Xe[:, 1:], ca.horzcat(ul, Uc), p, iw_s]  # stage s: (x_{a-1+s}, x_{a+s})
    funs = [getattr(stages, name) for name in SMOOTHER_STAGES] if raw else stages.get(*SMOOTHER_STAGES)
    obs_cost, dyn_cost, obs_grad, dyn_grad, obs_hess, dyn_hess = funs
    # the cost counts stages 0 .. L-1 (stage L is the next chunk's stage 0); gradient and Hessian
    # take each half of stage L's derivatives in the column it belongs to
    cost = ca.sum2(obs_cost.map(L)(*obs_args)) + ca.sum2(dyn_cost.map(L + 1)(*dyn_args)[:, :L])
    ins = [Xc, xl, xr, Uc, ul, Yc, Mc, on, p, iw, iv, rho]
    if outputs == "cost":
        return ca.Function(f"smooth_chunk_cost_{L}", ins, [cost])
    cost_sx = (ca.sum2(stages.obs_cost.map(L)(*obs_args))
               + ca.sum2(stages.dyn_cost.map(L + 1)(*dyn_args)[:, :L]))
    _, go = obs_grad.map(L)(*obs_args)
    _, gd = dyn_grad.map(L + 1)(*dyn_args)
    G = go + gd[nx:, :L] + gd[:nx, 1:]            # column j: stage j (second half), stage j+1 (first)
    ho = obs_hess.map(L)(*obs_args)
    hd = dyn_hess.map(L + 1)(*dyn_args)
    n2 = 2 * nx
    nz = band_column.map(L)(ho, hd[:, :n2 * L], hd[:, n2:], 2 * rho * ca.DM.ones(nx))
    if outputs == "newton":  # nz as LAPACK band storage (nx, 2 nx) per column: a contiguous copy (`ChunkedObjective.newton`)
        cols, rows = band_patterns(nx)
        place = ca.DM(ca.Sparsity.triplet(n2 * nx, cols.size, (cols * n2 + rows).tolist(), list(range(cols.size))), 1.0)
        return ca.Function(f"smooth_chunk_newton_{L}", ins, [cost, G, ca.densify(ca.mtimes(place, nz))])
    return ca.Function(f"smooth_chunk_{L}", ins, [cost, G, nz, cost_sx])


def _newton_and_cost(stages, L: int, band_column: ca.Function, T: int) -> list[ca.Function]:
    """The ``"newton"`` and ``"cost"`` chunk Functions of a record of T steps, each compiled whole with its stage
    Functions when `StageFunctions.get` would compile those for T stages (docs/long_records.md)."""
    compiled = stages.to_compile(SMOOTHER_STAGES, T) and compile_or_none(
        [_chunk_function(stages, L, band_column, kind, True) for kind in ("newton", "cost")],
        f"ceem_{stages.model.name}", log, "chunked smoothing objective")
    return compiled or [_chunk_function(stages, L, band_column, kind) for kind in ("newton", "cost")]


def stage_on_pattern(T: int, L: int) -> np.ndarray:
    """(1, K (L+1)) 0/1 weights of chunk i's dynamics stage s (between columns iL+s-1, iL+s)."""
    K = -(-T // L)
    i, s = np.meshgrid(np.arange(K), np.arange(L + 1), indexing="ij")
    left = i * L + s - 1
    return ((left >= 0) & (left + 1 <= T - 1)).astype(float).reshape(1, -1)


def chunked_terms(stages, band_column: ca.Function, X, U, Y, M, p, iw, iv, rho, L: int, cost_only: bool = False):
    """Stage parts of (cost, gradient (nx, T), Hessian band nonzeros (k, K L), SX cost) of one trajectory in K chunks
    of ``L`` steps (``cost_only``: the cost alone); the first block column's zero block above and the padding columns
    T .. K L - 1 of the nonzeros are left to the caller (no copy of them here)."""
    nx, T = X.shape
    nu = U.shape[0]
    K = -(-T // L)
    pad = K * L - T

    def padded(A):
        return A if pad == 0 else ca.horzcat(A, ca.MX.zeros(A.shape[0], pad))

    Xp, Up, Yp, Mp = padded(X), padded(U), padded(Y), padded(M)
    xz, uz = ca.MX.zeros(nx, 1), ca.MX.zeros(nu, 1)
    XL = ca.horzcat(xz, Xp[:, [i * L - 1 for i in range(1, K)]]) if K > 1 else xz
    XR = ca.horzcat(Xp[:, [i * L for i in range(1, K)]], xz) if K > 1 else xz
    UL = ca.horzcat(uz, Up[:, [i * L - 1 for i in range(1, K)]]) if K > 1 else uz
    on = ca.DM(stage_on_pattern(T, L))
    fun = _chunk_function(stages, L, band_column, "cost" if cost_only else "ipopt").map(K)
    if cost_only:
        return ca.sum2(fun(Xp, XL, XR, Up, UL, Yp, Mp, on, p, iw, iv, rho))
    cost, G, nz, cost_sx = fun(Xp, XL, XR, Up, UL, Yp, Mp, on, p, iw, iv, rho)
    return ca.sum2(cost), G[:, :T], nz, ca.sum2(cost_sx)


class ChunkedObjective:
    """The smoothing objective of one trajectory (T, L: its length and chunk length) for the banded solver: the
    chunk Functions called on K = ceil(T / L) slices of numpy arrays, the trust region and x_1 prior in numpy;
    ``band_column``: `band_column_functions`' column Function."""

    def __init__(self, stages, band_column: ca.Function, T: int, L: int):
        model = stages.model
        self.nx, self.nu, self.ny, self.T, self.L = model.nx, model.nu, model.ny, T, L
        self.K = -(-T // L)
        self._newton, self._cost = (BufferedCall(f) for f in _newton_and_cost(stages, L, band_column, T))
        self._on = stage_on_pattern(T, L).reshape(self.K, L + 1)
        self.sizes = [model.params.size, self.nu * T, self.ny * T, self.ny * T, self.nx * T, 1, self.nx, self.nx,
                      self.nx, self.ny]

    def bind(self, P: np.ndarray) -> ChunkedObjective:
        """A copy of this objective using the NLP parameter vector ``P`` (`TrajectorySmoother.parameter_vector`),
        released with the copy, not kept between smoothing steps."""
        T, bound = self.T, copy.copy(self)
        p, U, Y, M, Xprev, rho, mu1, w1, iw, iv = np.split(np.asarray(P, float), np.cumsum(self.sizes)[:-1])
        bound.p, bound.iw, bound.iv, bound.rho = p, iw, iv, rho
        bound.U, bound.Y, bound.M = U.reshape(T, self.nu), Y.reshape(T, self.ny), M.reshape(T, self.ny)
        bound.Xprev, bound.mu1, bound.w1 = Xprev.reshape(T, self.nx), mu1, w1
        return bound

    def _chunks(self, x: np.ndarray):
        """Each chunk's arguments (flat, column-major) and its column range [a, b)."""
        L, T = self.L, self.T
        zx, zu = np.zeros(self.nx), np.zeros(self.nu)
        for i in range(self.K):
            a, b = i * L, min((i + 1) * L, T)

            def cols(A, a=a, b=b):
                piece = A[a:b].reshape(-1)
                return piece if b - a == L else np.concatenate([piece, np.zeros((L - (b - a)) * A.shape[1])])

            args = [cols(x), x[a - 1] if a else zx, x[b] if b < T else zx, cols(self.U),
                    self.U[a - 1] if a else zu, cols(self.Y), cols(self.M), self._on[i], self.p, self.iw,
                    self.iv, self.rho]
            yield args, a, b

    def _regulariser(self, x, g=None) -> float:
        """The trust-region and x_1-prior terms at x (T, nx), chunk by chunk (no temporaries of size T);
        their gradient is added into ``g`` (T, nx) when given."""
        total, d1 = 0.0, self.w1 * (x[0] - self.mu1)
        for a in range(0, self.T, self.L):
            dx = x[a:a + self.L] - self.Xprev[a:a + self.L]
            total += float(np.sum(dx * dx))
            if g is not None:
                g[a:a + self.L] += 2 * self.rho[0] * dx
        if g is not None:
            g[0] += self.w1 ** 2 * (x[0] - self.mu1)
        return float(self.rho[0] * total + 0.5 * np.sum(d1 * d1))

    def cost(self, x: np.ndarray) -> float:
        """The objective at x (T nx,) (stage costs + trust region + x_1 prior)."""
        x = np.asarray(x, float).reshape(self.T, self.nx)
        total = sum(float(self._cost(*args)[0][0]) for args, _, _ in self._chunks(x))
        return total + self._regulariser(x)

    def newton(self, x: np.ndarray):
        """``(f, g (T nx,), band (T, nx, 2 nx), d0 (nx,))``: objective, gradient, the Hessian in LAPACK band storage
        written chunk by chunk, and the x_1 prior's addition to the first diagonal block."""
        x = np.asarray(x, float).reshape(self.T, self.nx)
        release_heap(x.size * 2 * self.nx)
        g, band, f = np.empty((self.T, self.nx)), np.zeros((self.T, self.nx, 2 * self.nx)), 0.0
        for args, a, b in self._chunks(x):
            c, G, H = self._newton(*args)
            f += float(c[0])
            g[a:b] = G.reshape(self.L, self.nx)[:b - a]
            band[a:b] = H.reshape(self.L, self.nx, 2 * self.nx)[:b - a]
        return f + self._regulariser(x, g), g.reshape(-1), band, self.w1 ** 2
