"""The smoothing objective's cost, gradient and Hessian nonzeros evaluated in time chunks.

For long records (T = 10^5 ... 10^6) the plain formulation of :mod:`ceem_casadi.smoother` maps
the stage Functions over all T steps in one MX graph. CasADi then stores an explicit sparsity
pattern for every (k, k*T)-sized intermediate and a work vector holding all of them (single
Lorenz: ~180 doubles per time step for the Hessian; 6 states: ~740), i.e. GBs at T = 10^6.

Here the same stage Functions are mapped over a chunk of L block columns inside a small MX
Function, and that Function is mapped over the K = ceil(T / L) chunks: intermediates are
O(L), only inputs and outputs are O(T). Chunk i covers block columns a = iL ... a + L - 1 and
reads the state before and after it (``xl``, ``xr``) and the input before it (``ul``); the
dynamics stages outside the record (before t = 0, from t = T - 1 on, and the padding up to KL)
get weight 0 (their 1/sigma_w is multiplied by a constant 0/1 pattern), padded observations
mask 0. Every term is the same SX stage Function on the same numbers as in the plain
formulation: results agree to rounding (tested to 1e-10).
"""
from __future__ import annotations

import casadi as ca
import numpy as np


def _chunk_function(stages, L: int, band_column: ca.Function, cost_only: bool = False) -> ca.Function:
    """``(Xc, xl, xr, Uc, ul, Yc, Mc, on, p, iw, iv, rho) -> (cost, G (nx, L), nz (k, L), cost_sx)``,
    or ``-> cost`` alone with ``cost_only`` (a line search's evaluations: no derivatives)."""
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
    obs_cost, dyn_cost, obs_grad, dyn_grad, obs_hess, dyn_hess = stages.get(
        "obs_cost", "dyn_cost", "obs_x_grad", "dyn_x_grad", "obs_x_hess_triu", "dyn_x_hess_triu")
    # the cost counts stages 0 .. L-1 (stage L is the next chunk's stage 0); gradient and Hessian
    # take each half of stage L's derivatives in the column it belongs to
    cost = ca.sum2(obs_cost.map(L)(*obs_args)) + ca.sum2(dyn_cost.map(L + 1)(*dyn_args)[:, :L])
    if cost_only:
        return ca.Function(f"smooth_chunk_cost_{L}", [Xc, xl, xr, Uc, ul, Yc, Mc, on, p, iw, iv, rho], [cost])
    cost_sx = (ca.sum2(stages.obs_cost.map(L)(*obs_args))
               + ca.sum2(stages.dyn_cost.map(L + 1)(*dyn_args)[:, :L]))
    _, go = obs_grad.map(L)(*obs_args)
    _, gd = dyn_grad.map(L + 1)(*dyn_args)
    G = go + gd[nx:, :L] + gd[:nx, 1:]            # column j: stage j (second half), stage j+1 (first)
    ho = obs_hess.map(L)(*obs_args)
    hd = dyn_hess.map(L + 1)(*dyn_args)
    n2 = 2 * nx
    nz = band_column.map(L)(ho, hd[:, :n2 * L], hd[:, n2:], 2 * rho * ca.DM.ones(nx))
    return ca.Function(f"smooth_chunk_{L}", [Xc, xl, xr, Uc, ul, Yc, Mc, on, p, iw, iv, rho],
                       [cost, G, nz, cost_sx])


def stage_on_pattern(T: int, L: int) -> np.ndarray:
    """(1, K (L+1)) 0/1 weights of chunk i's dynamics stage s (between columns iL+s-1, iL+s)."""
    K = -(-T // L)
    i, s = np.meshgrid(np.arange(K), np.arange(L + 1), indexing="ij")
    left = i * L + s - 1
    return ((left >= 0) & (left + 1 <= T - 1)).astype(float).reshape(1, -1)


def chunked_terms(stages, band_column: ca.Function, X, U, Y, M, p, iw, iv, rho, L: int, cost_only: bool = False):
    """Stage parts of (cost, gradient (nx, T), Hessian band nonzeros (k, K L), SX cost) of one
    trajectory, evaluated in K chunks of ``L`` steps (see the module docstring); with
    ``cost_only`` the cost alone. The nonzeros' first block column still includes its (zero)
    block above, and columns T .. K L - 1 are padding: the caller drops them (no copy made
    here: at T = 10^6, nx = 6, the nonzeros are 460 MB)."""
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
    fun = _chunk_function(stages, L, band_column, cost_only).map(K)
    if cost_only:
        return ca.sum2(fun(Xp, XL, XR, Up, UL, Yp, Mp, on, p, iw, iv, rho))
    cost, G, nz, cost_sx = fun(Xp, XL, XR, Up, UL, Yp, Mp, on, p, iw, iv, rho)
    return ca.sum2(cost), G[:, :T], nz, ca.sum2(cost_sx)
