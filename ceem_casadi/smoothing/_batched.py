"""Smoothing many short trajectories of one length together: one mapped evaluation and one banded
factorisation per Newton round for all of them (the method and its measured figures: docs/algorithms.md).
"""
from __future__ import annotations

import time

import numpy as np

from ..runtime import _policy as policy
from ..runtime._solve import ACCEPTABLE
from ._banded import BandedNewton
from ._batch_objective import BatchObjective
from ._batched_newton import solve_many
from ._structure import SmoothResult


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


class BatchedSmoother:
    """Smoothing solver for trajectories of one length T, solved in batches (see the module docstring).

    Parameters
    ----------
    stages : StageFunctions
        The model's stage Functions (shared with a `Smoother`).
    T : int
        Trajectory length.
    options : SmootherOptions
        ``rho_x``, ``max_iters`` and ``tol`` as for the banded solver (state bounds are not supported).
    observe : callable, optional
        The observation map written for sample columns (`Smoother`'s ``observe=``).

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

    def __init__(self, stages, T: int, options, observe=None):
        from ..errors import OptionsError

        if options.x_lower is not None or options.x_upper is not None:
            raise OptionsError("the batched smoother solves without state bounds, but x_lower / x_upper were given "
                               f"({options.x_lower!r}, {options.x_upper!r}): use solver='ipopt' with bounds")
        self.T, self.nx, self.options = T, stages.model.nx, options
        self.batch = max(1, policy.BATCH_COLUMNS // T)
        self.objective = BatchObjective(stages, T, observe)
        self.newton = BandedNewton(self.nx, T, options.max_iters, options.tol)

    def prepare(self, count: int) -> None:
        """Build the mapped Functions a solve of ``count`` trajectories starts with (its first
        batch), e.g. in a parent process before worker processes are forked from it: building
        them costs ~0.1 s per 10^5 Hessian entries of the batch (CasADi's sparsity patterns)."""
        self.objective.work_columns = max(self.objective.work_columns, min(max(1, count), self.batch) * self.T)
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
        cache[T] = BatchedSmoother(smoother.stages, T, smoother.options, getattr(smoother, "observe", None))
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
