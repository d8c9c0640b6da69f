"""Smoothing step (E-step): the maximum-a-posteriori state trajectory for fixed theta.

For one trajectory of length T, with X = [x_1 ... x_T] (nx, T), the NLP is

    min_X  sum_t 0.5||r_o[t](x_t)||^2 + sum_t 0.5||r_d[t](x_t, x_{t+1})||^2
           + 0.5||(x_1 - mu_1)/s_1||^2 + rho_x ||X - X_prev||^2

(see :mod:`ceem_casadi.stages`). Its Hessian is block tridiagonal with (nx, nx) blocks. The
stage Functions give dense stage gradients and Hessians, mapped over time; the Hessian's
upper triangle is assembled from them by a constant index gather, so building the solver
does not depend on T and IPOPT (MUMPS) factorises a banded matrix with O(nx^2 T) nonzeros.

One :class:`TrajectorySmoother` is built per trajectory length and reused across EM
iterations; theta, the data and X_prev are NLP parameters.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import casadi as ca
import numpy as np

from ._ipopt import ACCEPTABLE, grad_f_function, hess_lag_function, ipopt_options, solve
from .objective import log_normalisers
from .options import SmootherOptions
from .stages import StageFunctions


@dataclass
class SmoothResult:
    """Outcome of smoothing one trajectory.

    Attributes
    ----------
    x : numpy.ndarray
        (T, nx) smoothed states.
    cost : float
        Final objective: -J without its constants, trust-region term included.
    status : str
        IPOPT return status.
    success : bool
        An acceptable IPOPT status and finite states.
    iterations : int
        IPOPT iterations.
    wall_s : float
        Wall-clock seconds of the solve.
    """

    x: np.ndarray
    cost: float
    status: str
    success: bool
    iterations: int
    wall_s: float


def block_tridiagonal_gather(nx: int, T: int):
    """Sparsity of the upper triangle of a block-tridiagonal (nx*T)^2 matrix and the gather
    indices that assemble its nonzeros from the stacked stage Hessians.

    The stacked vector is ``[vec(H_obs) ; vec(H_dyn) ; 0]`` with ``H_obs`` (nx, nx*T) and
    ``H_dyn`` (2nx, 2nx*(T-1)) (column-major ``vec``). Returns ``(sparsity, idx)`` where
    ``idx`` (3, nnz) holds for every nonzero the positions of its (up to three) summands;
    absent summands point to the final zero.
    """
    n, N = nx, nx * T
    off_d = n * n * T
    zero = off_d + 4 * n * n * (T - 1)
    c = np.arange(N)
    bc, j = c // n, c % n
    # rows per column: n rows of the block above (if any), then rows 0..j of the own block
    n_above = np.where(bc > 0, n, 0)
    counts = n_above + j + 1
    colind = np.concatenate([[0], np.cumsum(counts)])
    col_of = np.repeat(c, counts)
    k_in_col = np.arange(colind[-1]) - colind[col_of]
    bcol, jcol = bc[col_of], j[col_of]
    above = k_in_col < n_above[col_of]
    i = np.where(above, k_in_col, k_in_col - n_above[col_of])  # row within its block
    rows = np.where(above, (bcol - 1) * n + i, bcol * n + i)
    two = 2 * n
    idx = np.full((3, rows.size), zero, dtype=np.int64)
    # off-diagonal block (bc-1, bc): dynamics stage s = bc-1, local (a, b) = (i, n + j)
    s = bcol - 1
    idx[0] = np.where(above, off_d + (s * two + n + jcol) * two + i, idx[0])
    diag = ~above
    # diagonal block: observation stage bc
    idx[0] = np.where(diag, (bcol * n + jcol) * n + i, idx[0])
    # diagonal block: dynamics stage bc (first half), if bc < T-1
    ok = diag & (bcol < T - 1)
    idx[1] = np.where(ok, off_d + (bcol * two + jcol) * two + i, idx[1])
    # diagonal block: dynamics stage bc-1 (second half), if bc > 0
    ok = diag & (bcol > 0)
    idx[2] = np.where(ok, off_d + (s * two + n + jcol) * two + n + i, idx[2])
    sp = ca.Sparsity(N, N, colind.tolist(), rows.tolist())
    return sp, idx


class TrajectorySmoother:
    """IPOPT smoothing solver for one model and one trajectory length T (built once)."""

    def __init__(self, stages: StageFunctions, T: int, options: SmootherOptions = SmootherOptions()):
        model = stages.model
        nx, nu, ny, npar = model.nx, model.nu, model.ny, model.params.size
        self.T, self.nx, self.options = T, nx, options
        t0 = time.perf_counter()
        X = ca.MX.sym("X", nx, T)
        p, U = ca.MX.sym("p", npar), ca.MX.sym("U", nu, T)
        Y, M = ca.MX.sym("Y", ny, T), ca.MX.sym("M", ny, T)
        Xprev, rho = ca.MX.sym("Xprev", nx, T), ca.MX.sym("rho")
        mu1, w1 = ca.MX.sym("mu1", nx), ca.MX.sym("w1", nx)
        iw, iv = ca.MX.sym("iw", nx), ca.MX.sym("iv", ny)
        par_syms = [p, U, Y, M, Xprev, rho, mu1, w1, iw, iv]
        self._par_sizes = [s.numel() for s in par_syms]
        P = ca.vertcat(*[ca.vec(s) for s in par_syms])
        xv = ca.vec(X)
        # reconstruct every symbol from the flat parameter vector P
        parts = ca.vertsplit(P, np.concatenate([[0], np.cumsum(self._par_sizes)]).tolist())
        p, U, Y, M, Xprev, rho, mu1, w1, iw, iv = [
            ca.reshape(part, s.shape[0], s.shape[1]) for part, s in zip(parts, par_syms)]
        X = ca.reshape(xv, nx, T)
        X0, X1, U0 = X[:, :-1], X[:, 1:], U[:, :-1]

        obs_args, dyn_args = [X, U, Y, M, p, iv], [X0, X1, U0, p, iw]
        obs_cost, dyn_cost, obs_grad, dyn_grad, obs_hess, dyn_hess = stages.get(
            "obs_cost", "dyn_cost", "obs_x_grad", "dyn_x_grad", "obs_x_hess", "dyn_x_hess")
        dx1 = X[:, 0] - mu1
        regulariser = rho * ca.sumsqr(X - Xprev) + 0.5 * ca.sumsqr(w1 * dx1)
        cost = ca.sum2(obs_cost.map(T)(*obs_args)) + ca.sum2(dyn_cost.map(T - 1)(*dyn_args)) + regulariser
        # the NLP's own objective expression must be differentiable by CasADi (it builds, but
        # never calls, derivative Functions of it): use the SX stage costs there
        cost_sx = (ca.sum2(stages.obs_cost.map(T)(*obs_args)) + ca.sum2(stages.dyn_cost.map(T - 1)(*dyn_args))
                   + regulariser)
        _, go = obs_grad.map(T)(*obs_args)
        _, gd = dyn_grad.map(T - 1)(*dyn_args)
        zcol = ca.MX(nx, 1)
        G = (go + ca.horzcat(gd[:nx, :], zcol) + ca.horzcat(zcol, gd[nx:, :]) + 2 * rho * (X - Xprev)
             + ca.horzcat(w1 ** 2 * dx1, ca.MX(nx, T - 1)))
        ho = obs_hess.map(T)(*obs_args)
        hd = dyn_hess.map(T - 1)(*dyn_args)
        sp, idx = block_tridiagonal_gather(nx, T)
        v = ca.vertcat(ca.vec(ho), ca.vec(hd), 0)
        nz = v[idx[0].tolist()] + v[idx[1].tolist()] + v[idx[2].tolist()]
        diag = 2 * rho + ca.vertcat(w1 ** 2, ca.MX(nx * (T - 1), 1))
        H = ca.MX(sp, nz) + ca.diag(diag)

        opts = ipopt_options(options.max_iter, options.tol,
                             grad_f=grad_f_function(xv, P, cost, ca.vec(G)),
                             hess_lag=hess_lag_function(xv, P, H))
        self.solver = ca.nlpsol(f"smoother_T{T}", "ipopt", {"x": xv, "p": P, "f": cost_sx}, opts)
        self.cost_function = ca.Function("smooth_cost", [xv, P], [cost])
        lo = -np.inf if options.x_lower is None else options.x_lower
        hi = np.inf if options.x_upper is None else options.x_upper
        self._lbx = np.tile(np.broadcast_to(np.asarray(lo, float), (nx,)), T)
        self._ubx = np.tile(np.broadcast_to(np.asarray(hi, float), (nx,)), T)
        self.build_s = time.perf_counter() - t0

    def parameter_vector(self, model, theta_vec, y, u, x_prev, rho) -> np.ndarray:
        """Flatten (theta vector, y (T, ny), u (T, nu), x_prev (T, nx), rho) into the NLP parameter."""
        noise = model.noise
        mask = np.isfinite(y)
        mu1 = np.zeros(model.nx) if noise.x1_mean is None else noise.x1_mean
        w1 = np.zeros(model.nx) if noise.x1_std is None else noise.inv_x1_std
        return np.concatenate([theta_vec, u.ravel(), np.where(mask, y, 0.0).ravel(), mask.ravel().astype(float),
                               x_prev.ravel(), [rho], mu1, w1, noise.inv_process_std, noise.inv_measurement_std])

    def solve(self, model, theta_vec, y, u, x_init, rho_x: float | None = None) -> SmoothResult:
        """Smooth one trajectory: ``y`` (T, ny) with NaN = missing, ``u`` (T, nu), ``x_init`` (T, nx)
        (also the trust-region centre). Returns the states (T, nx)."""
        rho = self.options.rho_x if rho_x is None else rho_x
        P = self.parameter_vector(model, theta_vec, y, u, x_init, rho)
        t0 = time.perf_counter()
        sol = solve(self.solver, x0=x_init.ravel(), p=P, lbx=self._lbx, ubx=self._ubx)
        wall = time.perf_counter() - t0
        st = self.solver.stats()
        x = np.asarray(sol["x"]).reshape(self.T, self.nx)
        status = st["return_status"]
        return SmoothResult(x, float(sol["f"]), status, status in ACCEPTABLE and np.all(np.isfinite(x)),
                            int(st["iter_count"]), wall)


class Smoother:
    """Smoothing step (E-step) for a model: one :class:`TrajectorySmoother` per trajectory length.

    Parameters
    ----------
    model : StateSpaceModel
        The model.
    options : SmootherOptions
        Trust region, Hessian, IPOPT limits, state bounds, compilation.
    stages : StageFunctions, optional
        Stage Functions to share with a learner (built from the model when None).
    """

    def __init__(self, model, options: SmootherOptions = SmootherOptions(), stages: StageFunctions | None = None):
        self.model, self.options = model, options
        self.stages = stages if stages is not None else StageFunctions(model, options.hessian, options.compile)
        self._solvers: dict[int, TrajectorySmoother] = {}
        self.build_s = 0.0

    def for_length(self, T: int) -> TrajectorySmoother:
        """The solver for trajectories of ``T`` samples (built on first use, then cached)."""
        if T not in self._solvers:
            self._solvers[T] = TrajectorySmoother(self.stages, T, self.options)
            self.build_s += self._solvers[T].build_s
        return self._solvers[T]

    def solve(self, theta_vec: np.ndarray, data, x_init: list[np.ndarray]) -> list[SmoothResult]:
        """Smooth every trajectory of ``data`` (sequentially), warm-started at ``x_init``.

        Parameters
        ----------
        theta_vec : numpy.ndarray
            (n_p,) flat parameter vector.
        data : Trajectories
            The B trajectories.
        x_init : list of numpy.ndarray
            Warm starts and trust-region centres (T_b, nx).

        Returns
        -------
        list of SmoothResult
        """
        out = []
        for b, (y, T) in enumerate(zip(data.y, data.lengths)):
            out.append(self.for_length(T).solve(self.model, theta_vec, y, data.inputs(b), x_init[b]))
        return out

    def joint_log_density(self, theta_vec: np.ndarray, data, xs: list[np.ndarray]) -> float:
        """The joint log-density J(x, theta) of the paper, all Gaussian constants included.

        ``J = log p(x_1) + sum_t log p_v(y_t - g(x_t)) + sum_t log p_w(x_{t+1} - f(x_t))`` summed
        over the trajectories, observed entries only; evaluated with this smoother's cost
        Functions (no trust-region term).

        Parameters
        ----------
        theta_vec : numpy.ndarray
            (n_p,) flat parameter vector.
        data : Trajectories
            The B trajectories.
        xs : list of numpy.ndarray
            The states (T_b, nx) of each trajectory.

        Returns
        -------
        float
        """
        total = 0.0
        for b, (y, x) in enumerate(zip(data.y, xs)):
            ts = self.for_length(y.shape[0])
            P = ts.parameter_vector(self.model, theta_vec, y, data.inputs(b), x, 0.0)
            total += -float(ts.cost_function(x.ravel(), P)) + log_normalisers(self.model, y)
        return total
