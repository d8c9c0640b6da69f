"""The objectives of many trajectories of one length evaluated together (`solve_many`'s; docs/algorithms.md)."""
from __future__ import annotations

import logging

import casadi as ca
import numpy as np

from ..runtime import _policy as policy
from ..runtime._linalg import BufferedCall
from ._columns import ObservationColumns
from ._structure import band_column_functions

log = logging.getLogger(__name__)

# the stage Functions one batched evaluation uses (costs for line searches; cost, gradient and
# Hessian triangle in one program each for the Newton steps)
BATCHED_STAGES = ("obs_cost", "dyn_cost", "obs_x_newton", "dyn_x_newton")


def _shared(fun: ca.Function, names=("p", "iv")) -> list[bool]:
    """``reduce_in`` of a stage map: the inputs ``names`` are the same for every step."""
    return [n in names for n in fun.name_in()]


def batch_functions(stages, band_column: ca.Function, n: int, T: int,
                    obs_given: bool = False, work_columns: int | None = None) -> tuple[ca.Function, ca.Function]:
    """``(newton, cost)`` of n trajectories of length T stacked as N = n T columns: ``newton(X (nx, N), U, Y, M, p,
    iw (nx,), iv (ny,), rho) -> (costs (1, n), G (nx, N), nz (k, N))`` (stage parts; nz in `band_storage` order with the
    trust region's 2 rho), ``cost(X, U, Y, M, p, iw, iv) -> costs``; ``obs_given``: observation terms ``co (1, N), go
    (nx, N), ho (nx, nx N)`` as inputs (`ObservationColumns`); ``work_columns``: stages per round (compilation)."""
    model = stages.model
    nx, nu, ny, npar = model.nx, model.nu, model.ny, model.params.size
    N = n * T
    X, U = ca.MX.sym("X", nx, N), ca.MX.sym("U", nu, N)
    Y, M = ca.MX.sym("Y", ny, N), ca.MX.sym("M", ny, N)
    p, iw, iv, rho = ca.MX.sym("p", npar), ca.MX.sym("iw", nx), ca.MX.sym("iv", ny), ca.MX.sym("rho")
    on = np.ones((1, N))
    on[0, T - 1::T] = 0.0                        # no dynamics stage from a trajectory's last step
    Xn = ca.horzcat(X[:, 1:], ca.MX.zeros(nx, 1))
    iw_s = ca.mtimes(iw, ca.DM(on))              # (nx, N)
    obs_args, dyn_args = [X, U, Y, M, p, iv], [X, Xn, U, p, iw_s]

    def per_trajectory(c):                       # (1, N) stage costs -> (1, n) sums
        return ca.sum1(ca.reshape(c, T, n))

    ins, names = [X, U, Y, M, p, iw, iv], ["X", "U", "Y", "M", "p", "iw", "iv"]
    wanted = BATCHED_STAGES[1::2] if obs_given else BATCHED_STAGES        # dyn_cost, dyn_x_newton
    got = dict(zip(wanted, stages.get(*wanted, columns=max(N, work_columns or 0))))
    dyn_cost, dyn_newton = got["dyn_cost"], got["dyn_x_newton"]
    if obs_given:
        co, go, ho = ca.MX.sym("co", 1, N), ca.MX.sym("go", nx, N), ca.MX.sym("ho", nx, nx * N)
        obs_costs, extra_cost, extra_newton = co, [co], [co, go, ho]
    else:
        obs_costs = got["obs_cost"].map(N, _shared(got["obs_cost"]), [False])(*obs_args)
        extra_cost, extra_newton = [], []
        obs_newton = got["obs_x_newton"]
        co, go, ho = obs_newton.map(N, _shared(obs_newton), [False] * 3)(*obs_args)
    costs = obs_costs + dyn_cost.map(N, _shared(dyn_cost), [False])(*dyn_args)
    cost = ca.Function(f"smooth_batch_cost_{n}x{T}", ins + extra_cost, [per_trajectory(costs)],
                       names + ["co"] * bool(extra_cost), ["costs"])
    cd, gd, hd = dyn_newton.map(N, _shared(dyn_newton), [False] * 3)(*dyn_args)
    G = go + gd[:nx, :] + ca.horzcat(ca.MX.zeros(nx, 1), gd[nx:, :-1])
    n2 = 2 * nx
    hd_prev = ca.horzcat(ca.MX.zeros(n2, n2), hd[:, :-n2])
    nz = band_column.map(N, [False, False, False, True], [False])(ho, hd_prev, hd, 2 * rho * ca.DM.ones(nx))
    newton = ca.Function(f"smooth_batch_newton_{n}x{T}", ins + [rho] + extra_newton, [per_trajectory(co + cd), G, nz],
                         names + ["rho"] + ["co", "go", "ho"][:len(extra_newton)], ["costs", "G", "nz"])
    return newton, cost


class BatchObjective:
    """The smoothing objectives of B trajectories of length T (the ``objective`` of `solve_many`): `bind` the
    data, then ask any subset in one call; the mapped Functions are built per number of trajectories and cached."""

    def __init__(self, stages, T: int, observe=None):
        self.stages, self.T = stages, T
        # observation terms by numpy from a matrix-valued observe (Gauss-Newton only)
        self.observe = observe if stages.hessian == "gauss-newton" else None
        self._columns: dict[int, ObservationColumns] = {}
        model = stages.model
        self.nx, self.nu, self.ny = model.nx, model.nu, model.ny
        self._column = band_column_functions(self.nx)[1]
        self.k = self._column.nnz_out(0)
        self._calls: dict[int, tuple[BufferedCall, BufferedCall]] = {}
        self.work_columns = T  # stages per round of the solves (set by bind / BatchedSmoother.prepare)
        self.speculate = True
        self._ahead: dict[int, tuple] = {}   # trajectory -> (x, newton result) evaluated by cost_many
        self._fresh: set[int] = set()        # trajectories whose last request was newton_many

    def functions(self, n: int) -> tuple[BufferedCall, BufferedCall]:
        """The buffered (newton, cost) evaluations of n trajectories (`batch_functions`), cached."""
        if n not in self._calls:
            if self.observe is not None and n * self.T not in self._columns:
                try:
                    self._columns[n * self.T] = ObservationColumns(self.stages.model, self.observe, n * self.T)
                except NotImplementedError as exc:  # an operation numpy does not replay: scalar programs
                    log.info("batched smoother: observe= not evaluated by numpy (%s)", exc)
                    self.observe = None
                    self._calls.clear()
            newton, cost = batch_functions(self.stages, self._column, n, self.T, obs_given=self.observe is not None,
                                           work_columns=self.work_columns)
            self._calls[n] = BufferedCall(newton), BufferedCall(cost)
        return self._calls[n]

    def _obs(self, args, newton: bool) -> list:
        """The observation terms the Functions take as inputs (none without ``observe``)."""
        if self.observe is None:
            return []
        X, U, Y, M, p, _, iv = args
        N = X.size // self.nx
        cols = self._columns[N]
        shaped = (np.reshape(X, (self.nx, N), order="F"), np.reshape(U, (self.nu, N), order="F"),
                  np.reshape(Y, (self.ny, N), order="F"), np.reshape(M, (self.ny, N), order="F"), p, iv)
        return list(cols.newton(*shaped)) if newton else [cols.cost(*shaped)]

    def bind(self, model, theta_vec, ys, us, x_prevs, rho: float) -> BatchObjective:
        """Use the data: outputs ``ys`` (T, ny) with NaN = missing, inputs ``us`` (T, nu), trust-region centres
        ``x_prevs`` (T, nx), parameters ``theta_vec`` (np,), trust-region weight ``rho`` >= 0."""
        noise = model.noise
        masks = [np.isfinite(y) for y in ys]
        self.Y = [np.where(m, y, 0.0).ravel() for m, y in zip(masks, ys)]
        self.M = [m.astype(float).ravel() for m in masks]
        self.U = [np.asarray(u, float).ravel() for u in us]
        self.Xprev = [np.asarray(x, float).reshape(self.T, self.nx) for x in x_prevs]
        self.p, self.rho = np.asarray(theta_vec, float), float(rho)
        self.work_columns = max(self.work_columns, len(ys) * self.T)
        self.iw, self.iv = noise.inv_process_std, noise.inv_measurement_std
        self.mu1 = np.zeros(self.nx) if noise.x1_mean is None else np.asarray(noise.x1_mean, float)
        self.w1 = np.zeros(self.nx) if noise.x1_std is None else noise.inv_x1_std
        self._ahead.clear()
        self._fresh.clear()
        return self

    @property
    def per_call(self) -> int:
        """Trajectories per call (``policy.CALL_COLUMNS`` steps, at least one)."""
        return max(1, policy.CALL_COLUMNS // self.T)

    def _calls_of(self, idx, xs):
        """``(n, padded idx, padded xs)`` per call of at most `per_call` trajectories, padded with its first entry to
        the next power of two: Functions are built for O(log per_call) sizes only."""
        step = self.per_call
        for a in range(0, len(idx), step):
            i, x = list(idx[a:a + step]), list(xs[a:a + step])
            size = min(1 << (len(i) - 1).bit_length(), step)
            yield len(i), i + [i[0]] * (size - len(i)), x + [x[0]] * (size - len(x))

    def _args(self, idx, xs):
        return [np.concatenate([np.ravel(x) for x in xs]), np.concatenate([self.U[i] for i in idx]),
                np.concatenate([self.Y[i] for i in idx]), np.concatenate([self.M[i] for i in idx]),
                self.p, self.iw, self.iv]

    def _regulariser(self, i, x):
        dx, d1 = x - self.Xprev[i], self.w1 * (x[0] - self.mu1)
        return self.rho * float(np.sum(dx * dx)) + 0.5 * float(np.sum(d1 * d1)), dx

    def cost_many(self, idx, xs) -> list[float]:
        """The objectives of trajectories ``idx`` at ``xs`` (each (nx T,)). The first trial point of a line search
        is evaluated with its derivatives, kept for the `newton_many` request that follows (``speculate``)."""
        first = [j for j, i in enumerate(idx) if i in self._fresh] if self.speculate else []
        out: list = [None] * len(idx)
        if first:
            res = self._evaluate([idx[j] for j in first], [xs[j] for j in first])
            for j, r in zip(first, res):
                self._ahead[idx[j]] = (xs[j], r)
                out[j] = r[0]
        rest = [j for j in range(len(idx)) if out[j] is None]
        if rest:
            parts = []
            for n, pidx, pxs in self._calls_of([idx[j] for j in rest], [xs[j] for j in rest]):
                call, args = self.functions(len(pidx))[1], self._args(pidx, pxs)
                parts.append(call(*args, *self._obs(args, False))[0][:n].copy())
            c = np.concatenate(parts)
            for m, j in enumerate(rest):
                out[j] = float(c[m]) + self._regulariser(idx[j], np.reshape(xs[j], (self.T, self.nx)))[0]
        self._fresh.difference_update(idx)
        return out

    def newton_many(self, idx, xs) -> list[tuple]:
        """``(f, g (nx T,), nz (T, k), d0 (nx,))`` of trajectories ``idx`` at ``xs`` (as ``ChunkedObjective.newton``),
        taken from `cost_many`'s evaluation ahead where that was at the same array."""
        out: list = [None] * len(idx)
        for j, (i, x) in enumerate(zip(idx, xs)):
            ahead = self._ahead.pop(i, None)
            if ahead is not None and ahead[0] is x:
                out[j] = ahead[1]
        rest = [j for j in range(len(idx)) if out[j] is None]
        if rest:
            for j, r in zip(rest, self._evaluate([idx[j] for j in rest], [xs[j] for j in rest])):
                out[j] = r
        self._fresh.update(idx)
        return out

    def _evaluate(self, idx, xs) -> list[tuple]:
        """Cost, gradient and band of trajectories ``idx`` at ``xs``: one mapped evaluation per call."""
        T, nx = self.T, self.nx
        out = []
        for n, pidx, pxs in self._calls_of(idx, xs):
            call, args = self.functions(len(pidx))[0], self._args(pidx, pxs)
            c, G, H = call(*args, self.rho, *self._obs(args, True))
            G = G.reshape(len(pidx), T, nx)
            H = H.reshape(len(pidx), T, self.k)[:n].copy()  # the call's buffers are reused by the next call
            for j, (i, x) in enumerate(zip(pidx[:n], pxs[:n])):
                x = np.reshape(x, (T, nx))
                reg, dx = self._regulariser(i, x)
                g = G[j] + 2 * self.rho * dx
                g[0] += self.w1 ** 2 * (x[0] - self.mu1)
                out.append((float(c[j]) + reg, g.reshape(-1), H[j], self.w1 ** 2))
        return out
