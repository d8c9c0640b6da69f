"""Smoothing many short trajectories together: one mapped evaluation and one banded factorisation per round.

The smoothing problems of B trajectories of the same length T are independent: the Hessian of
their sum is block diagonal, with one block-tridiagonal (nx T)^2 block per trajectory, i.e. ONE
band matrix of nx T B columns with 2 nx - 1 super-diagonals whose coupling between consecutive
trajectories is zero. This module solves them side by side with the damped Newton method of
`ceem_casadi.smoothing._banded` (each trajectory keeps its own
iterate, line search, Levenberg-Marquardt shift, stopping test and IPOPT-named status, exactly
as ``SmootherOptions(solver="banded")`` per trajectory), with every round's work done in one call
each (`solve_many`):

- the cost, gradient and Hessian band of all requesting trajectories: CasADi Functions
  mapping the (compiled) stage Functions over the n T steps of up to ``policy.CALL_COLUMNS``
  steps' worth of trajectories per call (a fixed, small set of Function sizes: building one costs
  time in proportion to its columns, 1.8 s for 40 helicopter-size trajectories, paid again in
  every fresh worker process, while per step the calls of 1 to 40 trajectories ran equally
  fast), the parameter vector p and the noise weights passed once (``map`` with ``reduce_in``: repeating p for every step copies
  np x n T doubles per call; the 2,246-parameter helicopter-size head at T = 500: 160 ms instead
  of 14 ms per trajectory, measured in issue 26). The stacked trajectories are one long record
  whose dynamics stages across a trajectory boundary have weight 0;
- the trial costs of the line searches: one mapped cost Function;
- the Newton directions: one LAPACK banded Cholesky factorisation and solve over the stacked band.

Trajectories are solved in batches of at most ``policy.BATCH_COLUMNS`` time steps (memory: the stage
Hessians of one evaluation take (2 nx)^2 doubles per step). ``SmootherOptions(solver="batched")``
selects it; with ``solver=None`` it is used where it was measured faster than IPOPT:
`batched_default`, one threshold
``policy.BATCHED_MIN_TRAJECTORIES`` (and no state bounds, records shorter than the long-record threshold
of `ceem_casadi.smoothing._smoother`).
"""
from __future__ import annotations

import time

import casadi as ca
import numpy as np

from ..runtime import _policy as policy
from ..runtime._linalg import BufferedCall
from ..runtime._solve import ACCEPTABLE
from ._banded import BandedNewton
from ._batched_newton import solve_many
from ._structure import SmoothResult, band_column_functions

# the stage Functions one batched evaluation uses (costs for line searches; cost, gradient and
# Hessian triangle in one program each for the Newton steps)
BATCHED_STAGES = ("obs_cost", "dyn_cost", "obs_x_newton", "dyn_x_newton")

def batched_default(options, T: int, count: int) -> bool:
    """Whether the smoother batches ``count`` trajectories of length ``T`` under ``options``.

    ``options.solver == "batched"``: always; ``None``: when ``count >= BATCHED_MIN_TRAJECTORIES``,
    there are no state bounds and T is below the long-record threshold
    (``policy.CHUNK_FROM``, where the chunked banded solver takes over); otherwise never.

    Examples
    --------
    >>> from ceem_casadi import SmootherOptions
    >>> batched_default(SmootherOptions(), 500, 466), batched_default(SmootherOptions(x_lower=-5), 500, 466)
    (True, False)
    >>> batched_default(SmootherOptions(), 20_000, 3)  # long records: the chunked banded solver
    False
    """
    if options.solver is not None:
        return options.solver == "batched"
    bounded = options.x_lower is not None or options.x_upper is not None
    return count >= policy.BATCHED_MIN_TRAJECTORIES and not bounded and T < policy.CHUNK_FROM


def any_batched(options, lengths) -> bool:
    """Whether `batched_default` batches the
    trajectories of any length among ``lengths`` (a parallel smoothing step then hands each
    process a shard of trajectories instead of single ones).

    Examples
    --------
    >>> from ceem_casadi import SmootherOptions
    >>> any_batched(SmootherOptions(), [500, 400]), any_batched(SmootherOptions(x_upper=9.0), [500, 500])
    (True, False)
    """
    counts: dict[int, int] = {}
    for T in lengths:
        counts[T] = counts.get(T, 0) + 1
    return any(batched_default(options, T, c) for T, c in counts.items())


def _shared(fun: ca.Function, names=("p", "iv")) -> list[bool]:
    """``reduce_in`` of a stage map: the inputs ``names`` are the same for every step."""
    return [n in names for n in fun.name_in()]


def batch_functions(stages, band_column: ca.Function, n: int, T: int) -> tuple[ca.Function, ca.Function]:
    """The stage parts of the smoothing objectives of n trajectories of length T, in one evaluation.

    Parameters
    ----------
    stages : StageFunctions
        The model's stage Functions (compiled where `StageFunctions.get` compiles).
    band_column : casadi.Function
        `band_column_functions`'s column Function.
    n, T : int
        Trajectories and steps; the N = n T columns of the inputs are the trajectories one after
        the other.

    Returns
    -------
    newton, cost : casadi.Function
        ``newton(X (nx, N), U (nu, N), Y (ny, N), M (ny, N), p (np,), iw (nx,), iv (ny,), rho)
        -> (costs (1, n), G (nx, N), nz (k, N))``: each trajectory's stage cost (no trust-region
        or x_1 prior term), its gradient and the band nonzeros of its Hessian including the trust
        region's 2 rho on the diagonal (layout of
        `band_storage`); ``cost(X, U, Y, M, p, iw, iv)
        -> costs (1, n)``.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> from ceem_casadi.smoothing._structure import band_column_functions
    >>> from ceem_casadi.objective._stages import StageFunctions
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.9 * x, lambda x, u, p: x, nx=1)
    >>> newton, cost = batch_functions(StageFunctions(model, compile=False), band_column_functions(1)[1], 2, 3)
    >>> newton.size_out(2), cost.size_out(0)
    ((2, 6), (1, 2))
    """
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
    obs_cost, dyn_cost, obs_newton, dyn_newton = stages.get(*BATCHED_STAGES, columns=N)
    costs = (obs_cost.map(N, _shared(obs_cost), [False])(*obs_args)
             + dyn_cost.map(N, _shared(dyn_cost), [False])(*dyn_args))
    cost = ca.Function(f"smooth_batch_cost_{n}x{T}", ins, [per_trajectory(costs)], names, ["costs"])
    co, go, ho = obs_newton.map(N, _shared(obs_newton), [False] * 3)(*obs_args)
    cd, gd, hd = dyn_newton.map(N, _shared(dyn_newton), [False] * 3)(*dyn_args)
    G = go + gd[:nx, :] + ca.horzcat(ca.MX.zeros(nx, 1), gd[nx:, :-1])
    n2 = 2 * nx
    hd_prev = ca.horzcat(ca.MX.zeros(n2, n2), hd[:, :-n2])
    nz = band_column.map(N, [False, False, False, True], [False])(ho, hd_prev, hd, 2 * rho * ca.DM.ones(nx))
    newton = ca.Function(f"smooth_batch_newton_{n}x{T}", ins + [rho], [per_trajectory(co + cd), G, nz],
                         names + ["rho"], ["costs", "G", "nz"])
    return newton, cost


class BatchObjective:
    """The smoothing objectives of B trajectories of length T, answered for any subset in one call
    (the ``objective`` of `solve_many`).

    Parameters
    ----------
    stages : StageFunctions
        The model's stage Functions.
    T : int
        Trajectory length.

    Call `bind` with the data first. The
    mapped Functions are built per number of trajectories n (MX graphs over compiled stage
    Functions: milliseconds) and cached.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from ceem_casadi.objective._stages import StageFunctions
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.9 * x, lambda x, u, p: x, nx=1)
    >>> obj = BatchObjective(StageFunctions(model, compile=False), 3)
    >>> y = [np.ones((3, 1)), np.zeros((3, 1))]
    >>> obj = obj.bind(model, np.zeros(0), y, [np.zeros((3, 0))] * 2,
    ...                [np.zeros((3, 1))] * 2, 0.0)
    >>> [round(c, 6) for c in obj.cost_many([0, 1], [np.ones(3)] * 2)]  # y = x = 1: dynamics only
    [0.01, 1.51]
    """

    def __init__(self, stages, T: int):

        self.stages, self.T = stages, T
        model = stages.model
        self.nx, self.nu, self.ny = model.nx, model.nu, model.ny
        self._column = band_column_functions(self.nx)[1]
        self.k = self._column.nnz_out(0)
        self._calls: dict[int, tuple[BufferedCall, BufferedCall]] = {}
        self.speculate = True
        self._ahead: dict[int, tuple] = {}   # trajectory -> (x, newton result) evaluated by cost_many
        self._fresh: set[int] = set()        # trajectories whose last request was newton_many

    def functions(self, n: int) -> tuple[BufferedCall, BufferedCall]:
        """The (newton, cost) evaluations of n trajectories (`batch_functions` behind
        buffered calls), built on first use and cached."""
        if n not in self._calls:
            newton, cost = batch_functions(self.stages, self._column, n, self.T)
            self._calls[n] = BufferedCall(newton), BufferedCall(cost)
        return self._calls[n]

    def bind(self, model, theta_vec, ys, us, x_prevs, rho: float) -> BatchObjective:
        """Use the data of the B trajectories: outputs ``ys`` (T, ny) with NaN = missing, inputs
        ``us`` (T, nu), trust-region centres ``x_prevs`` (T, nx), the parameters ``theta_vec``
        (np,) and the trust-region weight ``rho`` (>= 0)."""
        noise = model.noise
        masks = [np.isfinite(y) for y in ys]
        self.Y = [np.where(m, y, 0.0).ravel() for m, y in zip(masks, ys)]
        self.M = [m.astype(float).ravel() for m in masks]
        self.U = [np.asarray(u, float).ravel() for u in us]
        self.Xprev = [np.asarray(x, float).reshape(self.T, self.nx) for x in x_prevs]
        self.p, self.rho = np.asarray(theta_vec, float), float(rho)
        self.iw, self.iv = noise.inv_process_std, noise.inv_measurement_std
        self.mu1 = np.zeros(self.nx) if noise.x1_mean is None else np.asarray(noise.x1_mean, float)
        self.w1 = np.zeros(self.nx) if noise.x1_std is None else noise.inv_x1_std
        self._ahead.clear()
        self._fresh.clear()
        return self

    @property
    def per_call(self) -> int:
        """Trajectories per call of the mapped Functions (``policy.CALL_COLUMNS`` steps, at
        least one trajectory)."""
        return max(1, policy.CALL_COLUMNS // self.T)

    def _calls_of(self, idx, xs):
        """``(idx, xs)`` split into calls of at most `per_call` trajectories, each padded with
        copies of its first entry to the next power of two (at most `per_call`): the mapped
        Functions are built for O(log per_call) sizes, never for every number of trajectories
        still iterating; yields ``(n, padded idx, padded xs)`` with n the real entries."""
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
        """The objectives (stage costs + trust region + x_1 prior) of trajectories ``idx`` at
        ``xs`` (each (nx T,), states x_t in entries t nx .. t nx + nx - 1).

        The first trial point of a line search (the full Newton step, accepted nearly always)
        is evaluated with its derivatives, kept for the ``newton_many`` request that follows at
        the same point: one evaluation per Newton step instead of a cost and then derivatives
        (``speculate``; later, shorter trials get the cost alone)."""
        first = [j for j, i in enumerate(idx) if i in self._fresh] if self.speculate else []
        out: list = [None] * len(idx)
        if first:
            res = self._evaluate([idx[j] for j in first], [xs[j] for j in first])
            for j, r in zip(first, res):
                self._ahead[idx[j]] = (xs[j], r)
                out[j] = r[0]
        rest = [j for j in range(len(idx)) if out[j] is None]
        if rest:
            c = np.concatenate([self.functions(len(pidx))[1](*self._args(pidx, pxs))[0][:n].copy()
                                for n, pidx, pxs in self._calls_of([idx[j] for j in rest], [xs[j] for j in rest])])
            for m, j in enumerate(rest):
                out[j] = float(c[m]) + self._regulariser(idx[j], np.reshape(xs[j], (self.T, self.nx)))[0]
        self._fresh.difference_update(idx)
        return out

    def newton_many(self, idx, xs) -> list[tuple]:
        """``(f, g (nx T,), nz (T, k), d0 (nx,))`` of trajectories ``idx`` at ``xs``: objective,
        gradient, the Hessian's band nonzeros and the x_1 prior's diagonal (as
        ``ChunkedObjective.newton`` of one trajectory); evaluated ahead by ``cost_many`` where
        that was at the same point (the same array)."""
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
        """Cost, gradient and band for trajectories ``idx`` at ``xs``: one mapped evaluation per
        `per_call` trajectories."""
        T, nx = self.T, self.nx
        out = []
        for n, pidx, pxs in self._calls_of(idx, xs):
            c, G, H = self.functions(len(pidx))[0](*self._args(pidx, pxs), self.rho)
            G = G.reshape(len(pidx), T, nx)
            H = H.reshape(len(pidx), T, self.k)[:n].copy()  # the call's buffers are reused by the next call
            for j, (i, x) in enumerate(zip(pidx[:n], pxs[:n])):
                x = np.reshape(x, (T, nx))
                reg, dx = self._regulariser(i, x)
                g = G[j] + 2 * self.rho * dx
                g[0] += self.w1 ** 2 * (x[0] - self.mu1)
                out.append((float(c[j]) + reg, g.reshape(-1), H[j], self.w1 ** 2))
        return out


class BatchedSmoother:
    """Smoothing solver for trajectories of one length T, solved in batches (see the module docstring).

    Parameters
    ----------
    stages : StageFunctions
        The model's stage Functions (shared with a `Smoother`).
    T : int
        Trajectory length.
    options : SmootherOptions
        ``rho_x``, ``max_iter`` and ``tol`` as for the banded solver (state bounds are not supported).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from ceem_casadi.objective._stages import StageFunctions
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.9 * x, lambda x, u, p: x, nx=1)
    >>> bs = BatchedSmoother(StageFunctions(model, compile=False), 5, cc.SmootherOptions(solver="batched"))
    >>> th = np.zeros(0)
    >>> out = bs.solve(model, th, [np.ones((5, 1))] * 3, [np.zeros((5, 0))] * 3, [np.zeros((5, 1))] * 3)
    >>> [r.status for r in out]
    ['Solve_Succeeded', 'Solve_Succeeded', 'Solve_Succeeded']
    """

    def __init__(self, stages, T: int, options):
        from ..errors import OptionsError

        if options.x_lower is not None or options.x_upper is not None:
            raise OptionsError("the batched smoother solves without state bounds, but x_lower / x_upper were given "
                               f"({options.x_lower!r}, {options.x_upper!r}): use solver='ipopt' with bounds")
        self.T, self.nx, self.options = T, stages.model.nx, options
        self.batch = max(1, policy.BATCH_COLUMNS // T)
        self.objective = BatchObjective(stages, T)
        self.newton = BandedNewton(self.nx, T, options.max_iter, options.tol)

    def prepare(self, count: int) -> None:
        """Build the mapped Functions a solve of ``count`` trajectories starts with (its first
        batch), e.g. in a parent process before worker processes are forked from it: building
        them costs ~0.1 s per 10^5 Hessian entries of the batch (CasADi's sparsity patterns)."""
        top = min(max(1, count), self.batch, self.objective.per_call)
        for size in {min(1 << k, top) for k in range(top.bit_length() + 1)}:  # every size a call pads to
            self.objective.functions(size)

    def solve(self, model, theta_vec, ys, us, x_inits, rho_x: float | None = None) -> list:
        """Smooth B trajectories ``ys`` (T, ny) with inputs ``us`` (T, nu), warm-started at (and
        with the trust region centred on) ``x_inits`` (T, nx).

        Returns
        -------
        list of SmoothResult
            One per trajectory; ``wall_s`` is the batch's wall time divided by its size.
        """

        rho = self.options.rho_x if rho_x is None else rho_x
        out = []
        for a in range(0, len(ys), self.batch):
            b = min(a + self.batch, len(ys))
            t0 = time.perf_counter()
            obj = self.objective.bind(model, theta_vec, ys[a:b], us[a:b], x_inits[a:b], rho)
            res = solve_many(self.newton, [np.ravel(x) for x in x_inits[a:b]], obj)
            wall = (time.perf_counter() - t0) / (b - a)
            for r in res:
                x = r.x.reshape(self.T, self.nx)
                out.append(SmoothResult(x, r.cost, r.status, r.status in ACCEPTABLE and bool(np.all(np.isfinite(x))),
                                        r.iterations, wall))
        return out


def _groups(lengths) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for b, T in enumerate(lengths):
        groups.setdefault(T, []).append(b)
    return groups


def _batched_for(smoother, T: int) -> BatchedSmoother:
    cache = smoother.__dict__.setdefault("_batched", {})
    if T not in cache:
        cache[T] = BatchedSmoother(smoother.stages, T, smoother.options)
    return cache[T]


def batched_costs(smoother, theta_vec, data, xs) -> list[float | None]:
    """The smoothing objective without trust region (stage costs + x_1 prior) of every trajectory
    that `batched_default` batches, one mapped
    evaluation per batch; None for the others (the caller evaluates those one by one).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.9 * x, lambda x, u, p: x, nx=1)
    >>> data = cc.Trajectories([np.ones((3, 1)), np.zeros((3, 1)), np.zeros((4, 1))])
    >>> sm = cc.smoothing.Smoother(model, cc.SmootherOptions(compile=False))
    >>> [None if c is None else round(c, 6) for c in batched_costs(sm, np.zeros(0), data, [np.ones((T, 1)) for T in data.lengths])]
    [0.01, 1.51, 2.015]
    """
    out: list[float | None] = [None] * len(data)
    for T, idx in _groups(data.lengths).items():
        if not batched_default(smoother.options, T, len(idx)):
            continue
        bs = _batched_for(smoother, T)
        for a in range(0, len(idx), bs.batch):
            part = idx[a:a + bs.batch]
            obj = bs.objective.bind(smoother.model, theta_vec, [data.y[b] for b in part],
                                    [data.inputs(b) for b in part], [xs[b] for b in part], 0.0)
            for b, c in zip(part, obj.cost_many(list(range(len(part))), [np.ravel(xs[b]) for b in part])):
                out[b] = c
    return out


def prepare_batched(smoother, lengths, shards: int = 1) -> list[int]:
    """Build, on ``smoother``, the batched solvers and mapped Functions that smoothing
    trajectories of ``lengths`` split into ``shards`` contiguous shards will start with (the
    lengths `batched_default` batches); returns
    the other lengths (for the per-trajectory solvers). A forked worker then inherits them.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.9 * x, lambda x, u, p: x, nx=1)
    >>> sm = cc.smoothing.Smoother(model, cc.SmootherOptions(compile=False))
    >>> prepare_batched(sm, [5, 5, 5, 6], shards=2), sorted(sm._batched)
    ([], [5, 6])
    """
    rest = []
    for T, idx in _groups(lengths).items():
        if batched_default(smoother.options, T, len(idx)):
            _batched_for(smoother, T).prepare(-(-len(idx) // max(1, shards)))
        else:
            rest.append(T)
    return rest


def smooth_batched(smoother, theta_vec, data, x_init) -> list:
    """`Smoother.solve` with the trajectories of each
    length that `batched_default` selects solved
    by a `BatchedSmoother` (built once per length
    and kept on ``smoother``), the others one by one as before.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.9 * x, lambda x, u, p: x, nx=1)
    >>> data = cc.Trajectories([np.ones((5, 1)), np.zeros((4, 1)), np.zeros((5, 1))])
    >>> sm = cc.smoothing.Smoother(model, cc.SmootherOptions(compile=False))
    >>> th = np.zeros(0)
    >>> [r.x.shape for r in smooth_batched(sm, th, data, [np.zeros((T, 1)) for T in data.lengths])]
    [(5, 1), (4, 1), (5, 1)]
    """
    out: list = [None] * len(data)
    for T, idx in _groups(data.lengths).items():
        if not batched_default(smoother.options, T, len(idx)):
            for b in idx:
                out[b] = smoother.for_length(T).solve(smoother.model, theta_vec, data.y[b], data.inputs(b), x_init[b])
            continue
        res = _batched_for(smoother, T).solve(smoother.model, theta_vec, [data.y[b] for b in idx], [data.inputs(b) for b in idx],
                             [x_init[b] for b in idx])
        for b, r in zip(idx, res):
            out[b] = r
    return out
