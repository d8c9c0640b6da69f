"""Smoothing step (E-step): the MAP state trajectory for fixed theta, one `TrajectorySmoother` per trajectory
length (IPOPT on the block-tridiagonal NLP, or banded Newton steps); the NLP: docs/algorithms.md."""
from __future__ import annotations

import time

import casadi as ca
import numpy as np

from ..model._columns import check_columnwise
from ..objective._log_density import log_normalisers
from ..objective._stages import SMOOTHER_STAGES, StageFunctions
from ..runtime import _policy as policy
from ..runtime._solve import grad_f_function, hess_lag_function, ipopt_options, solve
from ..smoothing._options import SmootherOptions
from ._banded import BandedNewton
from ._batched import batched_costs, smooth_batched
from ._chunks import ChunkedObjective, chunked_terms
from ._structure import SmoothResult, band_column_functions, block_tridiagonal_upper


def chunk_length(option, T: int) -> int:
    """Chunk length for ``SmootherOptions.chunk`` (None: auto, 0: never, else steps) at length T;
    0 = not chunked."""
    if option is None:
        return policy.CHUNK_LENGTH if T >= policy.CHUNK_FROM else 0
    return min(int(option), T) if option and T > 1 else 0


def solver_kind(options: SmootherOptions, T: int) -> str:
    """``"banded"`` or ``"ipopt"`` for ``SmootherOptions.solver`` at length T (None: banded for long
    records without state bounds, the same threshold as chunking)."""
    if options.solver is not None:  # one trajectory of the batched solver: the banded one
        return "banded" if options.solver == "batched" else options.solver
    bounded = options.x_lower is not None or options.x_upper is not None
    return "banded" if T >= policy.CHUNK_FROM and not bounded else "ipopt"


class TrajectorySmoother:
    """Smoothing solver for one model and one trajectory length T (built once): IPOPT, or banded
    Newton steps (`ceem_casadi.smoothing._banded`, ``solver_kind == "banded"``, then ``solver``
    is None)."""

    def __init__(self, stages: StageFunctions, T: int, options: SmootherOptions = SmootherOptions()):
        self.T, self.nx, self.options = T, stages.model.nx, options
        t0 = time.perf_counter()
        self.solver_kind = solver_kind(options, T)
        if self.solver_kind == "banded":  # chunk by chunk from Python: nothing T-sized in CasADi
            L = chunk_length(options.chunk, T) or T
            self._objective = ChunkedObjective(stages, band_column_functions(self.nx)[1], T, L)
            self._newton = BandedNewton(self.nx, T, options.max_iters, options.tol)
            self.solver = None
        else:
            self._build_ipopt(stages, T, options)
        self.build_s = time.perf_counter() - t0

    def cost_function(self, xv, P):
        """The objective at the flat states ``xv`` (nx T,) for the NLP parameter ``P``."""
        if self.solver is None:
            return self._objective.bind(P).cost(xv)
        return self._cost_function(xv, P)

    def _build_ipopt(self, stages: StageFunctions, T: int, options: SmootherOptions) -> None:
        model = stages.model
        nx, nu, ny, npar = model.nx, model.nu, model.ny, model.params.size
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
        obs_cost, dyn_cost, obs_grad, dyn_grad, obs_hess, dyn_hess = stages.get(*SMOOTHER_STAGES)
        dx1 = X[:, 0] - mu1
        regulariser = rho * ca.sumsqr(X - Xprev) + 0.5 * ca.sumsqr(w1 * dx1)
        # costs: summed by the map itself, with p, iv, iw shared (not repeated T times); for the
        # gradient and Hessian maps that layout needed MORE work memory (T = 10^4: 301 vs 216
        # doubles per step), so they are mapped plainly
        def obs_map(f, total=False):
            return f.map(T, [False] * 4 + [True] * 2, [True] * f.n_out()) if total else f.map(T)

        def dyn_map(f, total=False):
            return f.map(T - 1, [False] * 3 + [True] * 2, [True] * f.n_out()) if total else f.map(T - 1)

        L = chunk_length(options.chunk, T)
        _, column = band_column_functions(nx)
        d = 2 * rho * ca.DM.ones(nx)
        if L:
            cost_st, G_st, nz, cost_sx_st = chunked_terms(stages, column, X, U, Y, M, p, iw, iv, rho, L)
            cost, cost_sx = cost_st + regulariser, cost_sx_st + regulariser
            G = (G_st + 2 * rho * (X - Xprev) + ca.horzcat(w1 ** 2 * dx1, ca.MX(nx, T - 1)))
            # cost alone (line searches, J): the chunk Function with derivatives computes them all
            line_cost = chunked_terms(stages, column, X, U, Y, M, p, iw, iv, rho, L, cost_only=True) + regulariser
        else:
            cost = obs_map(obs_cost, True)(*obs_args) + dyn_map(dyn_cost, True)(*dyn_args) + regulariser
            line_cost = cost
            # the NLP's own objective expression must be differentiable by CasADi (it builds, but
            # never calls, derivative Functions of it): use the SX stage costs there
            cost_sx = (obs_map(stages.obs_cost, True)(*obs_args) + dyn_map(stages.dyn_cost, True)(*dyn_args)
                       + regulariser)
            _, go = obs_map(obs_grad)(*obs_args)
            _, gd = dyn_map(dyn_grad)(*dyn_args)
            zcol = ca.MX(nx, 1)
            G = (go + ca.horzcat(gd[:nx, :], zcol) + ca.horzcat(zcol, gd[nx:, :]) + 2 * rho * (X - Xprev)
                 + ca.horzcat(w1 ** 2 * dx1, ca.MX(nx, T - 1)))
            ho = obs_map(obs_hess)(*obs_args)
            hd = dyn_map(dyn_hess)(*dyn_args)
        self._cost_function = ca.Function("smooth_cost", [xv, P], [line_cost])
        H = self._chunked_hessian(nz, w1, T) if L else self._plain_hessian(ho, hd, d, w1, T)
        opts = ipopt_options(options.max_iters, options.tol, grad_f=grad_f_function(xv, P, cost, ca.vec(G)),
                             hess_lag=hess_lag_function(xv, P, H))
        self.solver = ca.nlpsol(f"smoother_T{T}", "ipopt", {"x": xv, "p": P, "f": cost_sx}, opts)
        lo, hi = options.state_bounds(nx)  # OptionsError for a list of another length than nx
        self._lbx = np.tile(lo, T)
        self._ubx = np.tile(hi, T)

    @staticmethod
    def _plain_hessian(ho, hd, d, w1, T) -> ca.MX:
        """Upper triangle of the Hessian (IPOPT's) from the stage Hessians mapped over all T."""
        nx = ho.shape[0]
        first, column = band_column_functions(nx)
        z2 = ca.MX.zeros(2 * nx, 2 * nx)
        nz0 = first(ho[:, :nx], hd[:, :2 * nx] if T > 1 else z2, d + w1 ** 2)
        if T > 1:
            rest = column.map(T - 1)(ho[:, nx:], hd, ca.horzcat(hd[:, 2 * nx:], z2), d)
            nz0 = ca.vertcat(nz0, ca.vec(rest))
        return ca.MX(block_tridiagonal_upper(nx, T), nz0)

    @staticmethod
    def _chunked_hessian(nz, w1, T) -> ca.MX:
        """Upper triangle of the Hessian (IPOPT's) from the chunked band nonzeros (k, >= T)."""
        nx = w1.shape[0]
        nzv, k = ca.vec(nz), nx * nx + nx * (nx + 1) // 2
        own, off = [], 0  # block column 0 has no block above: keep its own entries, add w1^2
        for j in range(nx):
            own += [nzv[off + nx + i] + (w1[j] ** 2 if i == j else 0) for i in range(j + 1)]
            off += nx + j + 1
        nz0 = ca.vertcat(*own, nzv[k:k * T]) if T > 1 else ca.vertcat(*own)
        return ca.MX(block_tridiagonal_upper(nx, T), nz0)

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
        if self.solver is None:
            out = self._newton.solve(x_init.ravel(), self._objective.bind(P))
            return SmoothResult.of(out.x.reshape(self.T, self.nx), out.cost, out.status, out.iterations,
                                   time.perf_counter() - t0)
        sol = solve(self.solver, x0=x_init.ravel(), p=P, lbx=self._lbx, ubx=self._ubx)
        st = self.solver.stats()
        return SmoothResult.of(np.asarray(sol["x"]).reshape(self.T, self.nx), sol["f"], st["return_status"],
                               st["iter_count"], time.perf_counter() - t0)


class Smoother:
    """Smoothing step (E-step) for a model: one `TrajectorySmoother` per trajectory length.

    Parameters
    ----------
    model : StateSpaceModel
    options : SmootherOptions
    stages : StageFunctions, optional
        Stage Functions to share with a learner (built from the model when None).
    observe : callable, optional
        ``g`` written for (nx, N) state and (nu, N) input matrices (columns = samples), checked against
        ``model.g``: the batched solver with the Gauss-Newton Hessian then evaluates the observation terms
        by numpy ([`ObservationColumns`][ceem_casadi.smoothing.ObservationColumns]); the same optimum.

    Raises
    ------
    ModelError
        ``observe`` fails on matrices or differs from ``model.g``.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> data, x = cc.simulate(model, {"a": 0.8}, [0.0], 40, u=np.ones((40, 1)), seed=0)
    >>> sm = cc.smoothing.Smoother(model, cc.SmootherOptions(compile=False))
    >>> (res,) = sm.solve(np.array([0.8]), data, [np.zeros((40, 1))])
    >>> bool(np.abs(res.x - x[0]).max() < 0.3)          # near the true states
    True
    """

    def __init__(self, model, options: SmootherOptions = SmootherOptions(), stages: StageFunctions | None = None,
                 *, observe=None):
        self.model, self.options = model, options
        if observe is not None:
            check_columnwise(model, "observe", observe, model.g)
        self.observe = observe
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
        """Smooth every trajectory of ``data`` (sequentially, or those of a length together:
        `ceem_casadi.smoothing._batched.smooth_batched`), warm-started at ``x_init``.

        Parameters
        ----------
        theta_vec : numpy.ndarray
            (n_p,) flat parameter vector.
        data : Trajectories
        x_init : list of numpy.ndarray
            Warm starts and trust-region centres (T_b, nx).

        Returns
        -------
        list of SmoothResult
        """
        return smooth_batched(self, theta_vec, data, x_init)  # one by one where it does not batch

    def joint_log_density(self, theta_vec: np.ndarray, data, xs: list[np.ndarray]) -> float:
        """The joint log-density J(x, theta) of the paper, all Gaussian constants included, summed over the
        trajectories' observed entries (this smoother's cost Functions, no trust-region term).

        Parameters
        ----------
        theta_vec : numpy.ndarray
            (n_p,) flat parameter vector.
        data : Trajectories
        xs : list of numpy.ndarray
            The states (T_b, nx) of each trajectory.

        Returns
        -------
        float
        """
        total = 0.0
        batched = batched_costs(self, theta_vec, data, xs)  # None where the trajectories are not batched
        for b, (y, x) in enumerate(zip(data.y, xs)):
            cost = batched[b]
            if cost is None:
                ts = self.for_length(y.shape[0])
                P = ts.parameter_vector(self.model, theta_vec, y, data.inputs(b), x, 0.0)
                cost = float(ts.cost_function(x.ravel(), P))
            total += -cost + log_normalisers(self.model, y)
        return total
