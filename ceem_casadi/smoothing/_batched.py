"""Smoothing many short trajectories of one length together: one mapped evaluation and one banded factorisation
per Newton round for all of them (the method and its figures: docs/algorithms.md)."""
from __future__ import annotations

import time

import numpy as np

from ..runtime import _policy as policy
from ._banded import BandedNewton
from ._batch_objective import BatchObjective
from ._batched_newton import solve_many
from ._structure import SmoothResult


def batched_default(options, T: int, count: int) -> bool:
    """Whether the smoother batches ``count`` trajectories of length ``T``: always for ``solver="batched"``,
    for ``None`` from ``policy.BATCHED_MIN_TRAJECTORIES`` on without state bounds below ``policy.CHUNK_FROM``."""
    if options.solver is not None:
        return options.solver == "batched"
    bounded = options.x_lower is not None or options.x_upper is not None
    return count >= policy.BATCHED_MIN_TRAJECTORIES and not bounded and T < policy.CHUNK_FROM


def any_batched(options, lengths) -> bool:
    """Whether `batched_default` batches the trajectories of any length among ``lengths``."""
    return any(batched_default(options, T, len(idx)) for T, idx in _groups(lengths).items())


class BatchedSmoother:
    """Banded Newton smoothing of trajectories of one length T in batches of at most ``policy.BATCH_COLUMNS``
    steps (``stages``: the model's stage Functions; ``observe``: `Smoother`'s column-wise observation map)."""

    def __init__(self, stages, T: int, options, observe=None):  # options without state bounds (SmootherOptions)
        self.T, self.nx, self.options = T, stages.model.nx, options
        self.batch = max(1, policy.BATCH_COLUMNS // T)
        self.objective = BatchObjective(stages, T, observe)
        self.newton = BandedNewton(self.nx, T, options.max_iters, options.tol)

    def prepare(self, count: int) -> None:
        """Build the mapped Functions a solve of ``count`` trajectories starts with (before forking workers)."""
        self.objective.work_columns = max(self.objective.work_columns, min(max(1, count), self.batch) * self.T)
        top = min(max(1, count), self.batch, self.objective.per_call)
        for size in {min(1 << k, top) for k in range(top.bit_length() + 1)}:  # every size a call pads to
            self.objective.functions(size)

    def solve(self, model, theta_vec, ys, us, x_inits, rho_x: float | None = None) -> list:
        """SmoothResult of each trajectory ``ys`` (T, ny) with inputs ``us`` (T, nu), warm-started at and with
        the trust region centred on ``x_inits`` (T, nx); ``wall_s`` is the batch's wall time over its size."""
        rho = self.options.rho_x if rho_x is None else rho_x
        out = []
        for a in range(0, len(ys), self.batch):
            b = min(a + self.batch, len(ys))
            t0 = time.perf_counter()
            obj = self.objective.bind(model, theta_vec, ys[a:b], us[a:b], x_inits[a:b], rho)
            res = solve_many(self.newton, [np.ravel(x) for x in x_inits[a:b]], obj)
            wall = (time.perf_counter() - t0) / (b - a)
            out += [SmoothResult.of(r.x.reshape(self.T, self.nx), r.cost, r.status, r.iterations, wall) for r in res]
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
    """The smoothing objective without trust region of every trajectory that `batched_default` batches (one
    mapped evaluation per batch); None for the others."""
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


def prepare_batched(smoother, lengths, shards: int = 1) -> None:
    """Build on ``smoother`` the batched solvers of the lengths it batches, for ``shards`` contiguous shards
    (forked workers inherit them)."""
    for T, idx in _groups(lengths).items():
        if batched_default(smoother.options, T, len(idx)):
            _batched_for(smoother, T).prepare(-(-len(idx) // max(1, shards)))


def smooth_batched(smoother, theta_vec, data, x_init) -> list:
    """`Smoother.solve`: the trajectories of each length `batched_default` selects by a `BatchedSmoother`
    (kept on ``smoother``), the others one by one."""
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
