"""Distributed CE-EM: both steps on a Dask cluster, or the smoothing step on any executor.

``CEEMOptions(executor=...)`` takes a ``dask.distributed.Client``, a
``concurrent.futures.Executor`` or a :class:`Sharded` wrapping either (to choose the number of
shards and read the per-step measurements). The trajectories are split into *shards* (groups
balanced by length, one per worker thread by default):

* **Smoothing**: one task per shard smooths its trajectories. Each worker builds the model's
  solvers once and keeps them across EM iterations in a cache keyed by the model's digest
  (:mod:`ceem_casadi._shard_tasks`).
* **Learning** (Dask only): the learner's IPOPT runs on the client; for every objective,
  gradient or Hessian it needs, each shard returns its data terms (cost, gradient, or the upper
  triangle of its exact or Gauss-Newton Hessian block) for its fixed states, the client sums them
  and adds the trust region and the prior. No worker ever ships all states.
* **States** stay on the Dask workers between smoothing, learning and the evaluation of J: the
  client holds futures (:class:`RemoteStates`) and fetches the arrays only when it needs them
  (a callback reading ``record.x``, the ``"newton"``/``"squarem"`` accelerations, the result).

With a plain ``concurrent.futures.Executor`` (e.g. ``ProcessPoolExecutor``) the smoothing step is
distributed (states travel with each task) and the learning step runs on the client.
The fit equals the sequential one up to the order of floating-point sums (tested to 1e-10).
"""
from __future__ import annotations

import hashlib
import pickle
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from ..io._data import Trajectories
from ..objective._exact_sum import SplitSum
from ..objective._log_density import joint_log_density
from ..runtime._solve import remaining
from . import _tasks as tasks

SUPPORTED = "a dask.distributed.Client, a concurrent.futures.Executor or a ceem_casadi.distributed.Sharded"


def is_dask_client(obj) -> bool:
    """True for a ``dask.distributed.Client`` (checked without importing dask)."""
    cls = type(obj)
    return cls.__name__ == "Client" and cls.__module__.split(".")[0] == "distributed"


def check_executor(executor) -> None:
    """Raise TypeError unless ``executor`` is None or one of the supported kinds."""
    if executor is None or isinstance(executor, (Executor, Sharded)) or is_dask_client(executor):
        return
    raise TypeError(f"executor must be None, {SUPPORTED}; got {type(executor).__module__}."
                    f"{type(executor).__qualname__}. For a cluster: executor=dask.distributed.Client(address); "
                    "on one machine: n_jobs=2 or executor=concurrent.futures.ProcessPoolExecutor(2)")


def shard_index(lengths, n_shards: int) -> list[list[int]]:
    """Trajectory indices of ``n_shards`` groups balanced by total length (longest first to the
    lightest group; ties by index), each group in increasing order."""
    n = max(1, min(int(n_shards), len(lengths)))
    groups, load = [[] for _ in range(n)], np.zeros(n)
    for b in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        k = int(np.argmin(load))
        groups[k].append(b)
        load[k] += lengths[b]
    return [sorted(g) for g in groups]


def model_spec(model, options) -> tasks.ModelSpec:
    """The model and its solver options pickled, with their SHA-256 digest (the workers' cache key)."""
    blob = pickle.dumps((model, options.smoother, options.learner), protocol=pickle.HIGHEST_PROTOCOL)
    return tasks.ModelSpec(hashlib.sha256(blob).hexdigest(), blob)


def nbytes(obj) -> int:
    """Payload size (bytes) of arrays, bytes, numbers and containers of them (what crosses the network,
    without protocol overhead)."""
    if isinstance(obj, (np.ndarray, SplitSum)):
        return obj.nbytes
    if isinstance(obj, (bytes, str)):
        return len(obj)
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(o) for o in obj)
    if isinstance(obj, tasks.ModelSpec):
        return len(obj.blob) + len(obj.digest)
    if isinstance(obj, Trajectories):
        return nbytes(obj.y) + nbytes(obj.u or ())
    if isinstance(obj, (tasks.ShardState, tasks.ShardSummary)):
        return sum(nbytes(v) for v in vars(obj).values())
    return 8


def _remaining() -> float | None:
    """Seconds left of the fit's time budget (None: no budget); workers set their own deadline."""
    return remaining()


@dataclass
class TrajectoryOutcome:
    """One trajectory's smoothing outcome as the client sees it (the states stay with the engine)."""

    status: str
    finite: bool
    iterations: int
    wall_s: float


class Smoothed(list):
    """Per-trajectory :class:`TrajectoryOutcome` list of one smoothing step; ``xs`` holds the states
    (a list of (T_b, nx) arrays or :class:`RemoteStates`)."""

    xs: Sequence = ()


class Sharded:
    """An executor with the trajectories split into shards, and measurements of every step.

    Parameters
    ----------
    executor : dask.distributed.Client or concurrent.futures.Executor
        Where the shards run.
    n_shards : int or None
        Groups of trajectories, one task each per step; default: the number of worker threads
        (Dask) or the executor's ``max_workers``.

    Attributes
    ----------
    stats : list of dict
        One dict per step of every fit run with it: ``kind`` (``"smooth"``, ``"learn"``, ``"J"``,
        ``"setup"``, ``"fetch"``), ``wall_s`` (client wall clock, s), ``shard_s`` (compute seconds
        inside each shard's task; for ``"learn"`` summed over the solve's calls),
        ``sent_bytes`` and ``received_bytes`` (array payload between client and workers); for
        ``"learn"`` also ``calls`` (map-reduce rounds), ``wait_s`` (client time waiting for them)
        and ``setup_s`` (the shards building their learner parameters at the new states).
    """

    def __init__(self, executor, n_shards: int | None = None):
        if isinstance(executor, Sharded) or not (isinstance(executor, Executor) or is_dask_client(executor)):
            raise TypeError(f"Sharded(executor): executor must be a dask.distributed.Client or a "
                            f"concurrent.futures.Executor, got {type(executor).__qualname__}")
        if n_shards is not None and not (isinstance(n_shards, int) and n_shards >= 1):
            raise ValueError(f"n_shards must be None or an int >= 1, got {n_shards!r}")
        self.executor, self.n_shards, self.stats = executor, n_shards, []

    def start(self, model, data, options, smoother):
        """The engine of one fit (used by :func:`~ceem_casadi.ceem`)."""
        if is_dask_client(self.executor):
            from ._dask import DaskEngine

            return DaskEngine(self, model, data, options)
        return ExecutorEngine(self, model, data, options, smoother)


def engine_has_learner(executor) -> bool:
    """Whether the engine of ``executor`` runs its own learning step (Dask: the states stay on the
    workers and the learner's data terms are map-reduced there), which a user's learner cannot
    replace."""
    inner = executor.executor if isinstance(executor, Sharded) else executor
    return is_dask_client(inner)


def start_engine(executor, model, data, options, smoother):
    """The engine for ``CEEMOptions.executor`` (wrapped in a :class:`Sharded` unless it is one)."""
    sharded = executor if isinstance(executor, Sharded) else Sharded(executor)
    return sharded.start(model, data, options, smoother)


class RemoteStates(Sequence):
    """States of all trajectories held by the workers (``handle``: their version number there);
    indexing or iterating fetches them all once (then cached). ``len`` is the number of trajectories."""

    def __init__(self, engine, handle):
        self.engine, self.handle, self._xs = engine, handle, None

    def __len__(self) -> int:
        return self.engine.n_trajectories

    def __getitem__(self, b):
        if self._xs is None:
            self._xs = self.engine.fetch(self)
        return self._xs[b]


def assemble(index, parts) -> list:
    """Per-shard lists (in ``index`` order) back into one list by trajectory."""
    out = [None] * sum(len(i) for i in index)
    for idx, part in zip(index, parts):
        for b, v in zip(idx, part):
            out[b] = v
    return out


def outcomes(index, summaries) -> Smoothed:
    """Per-trajectory outcomes from the shards' :class:`~ceem_casadi._shard_tasks.ShardSummary`."""
    rows = [list(zip(s.status, s.finite, s.iterations, s.wall_s)) for s in summaries]
    return Smoothed(TrajectoryOutcome(*r) for r in assemble(index, rows))


class _ShardedOutcomes:
    """What ``ceem`` asks of a distributed smoothing step's outcomes (shared by both engines)."""

    @staticmethod
    def finite(r) -> bool:
        return r.finite

    @staticmethod
    def states(sm: Smoothed):
        return sm.xs


class ExecutorEngine(_ShardedOutcomes):
    """Smoothing step on a ``concurrent.futures`` executor: one task per shard, states sent with
    each task and returned; J and the learning step on the client (``learner`` is None)."""

    learner = None

    def __init__(self, sharded: Sharded, model, data, options, smoother):
        self.sharded, self.smoother = sharded, smoother
        pool = sharded.executor
        n = sharded.n_shards or getattr(pool, "_max_workers", None) or 2
        self.index = shard_index(data.lengths, n)
        self.shards = [data[idx] for idx in self.index]
        self.spec = model_spec(model, options)
        self.n_trajectories = len(data)

    def __call__(self, theta_vec, data, xs) -> Smoothed:
        t0 = time.perf_counter()
        theta_vec = np.asarray(theta_vec, float)
        args = [(self.spec, theta_vec, shard, [np.asarray(xs[b]) for b in idx], _remaining())
                for shard, idx in zip(self.shards, self.index)]
        states = [f.result() for f in [self.sharded.executor.submit(tasks.smooth, *a) for a in args]]
        out = outcomes(self.index, [s.summary for s in states])
        out.xs = assemble(self.index, [s.xs for s in states])
        self.sharded.stats.append(dict(kind="smooth", wall_s=time.perf_counter() - t0,
                                       shard_s=[s.summary.compute_s for s in states],
                                       sent_bytes=nbytes(args), received_bytes=nbytes(states)))
        return out

    def log_density(self, theta_vec, data, xs) -> float:
        return joint_log_density(self.smoother, theta_vec, data, xs)

    def close(self) -> None:
        pass
