"""What both distributed engines share: the shards (groups of trajectories balanced by length), the pickled model
they build their solvers from, the per-trajectory outcomes of a smoothing step, and the states kept by the workers."""
from __future__ import annotations

import hashlib
import pickle
import time
from collections import namedtuple
from collections.abc import Sequence

import numpy as np

from ..errors import OptionsError
from . import _tasks as tasks


def shard_index(lengths, n_shards: int) -> list[list[int]]:
    """Trajectory indices of ``n_shards`` groups balanced by total length (longest first to the lightest group; ties
    by index).

    Parameters
    ----------
    lengths : sequence of int
        Number of samples of each trajectory, shape (B,).
    n_shards : int
        Number of groups wanted; at most B groups are made (at least one).

    Returns
    -------
    list of list of int
        One sorted list of trajectory indices per group.

    Examples
    --------
    >>> from ceem_casadi.distributed import shard_index
    >>> shard_index([10, 100, 60, 50], 2)   # 100 + 10 and 60 + 50 samples
    [[0, 1], [2, 3]]
    """
    n = max(1, min(int(n_shards), len(lengths)))
    groups, load = [[] for _ in range(n)], np.zeros(n)
    for b in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        k = int(np.argmin(load))
        groups[k].append(b)
        load[k] += lengths[b]
    return [sorted(g) for g in groups]


def model_spec(model, smoother_options, learner_options) -> tasks.ModelSpec:
    """The model and its solver options pickled, with their SHA-256 digest (the workers' cache key)."""
    blob = pickle.dumps((model, smoother_options, learner_options), protocol=pickle.HIGHEST_PROTOCOL)
    return tasks.ModelSpec(hashlib.sha256(blob).hexdigest(), blob)


def nbytes(obj) -> int:
    """Bytes of ``obj`` pickled as Dask sends it (protocol 5, arrays as out-of-band buffers, not copied): the
    payload between the client and the workers, without the protocol's framing."""
    buffers = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=lambda b: buffers.append(b.raw().nbytes))
    return len(head) + sum(buffers)


# one trajectory's smoothing outcome as the client sees it (the states stay with the engine)
TrajectoryOutcome = namedtuple("TrajectoryOutcome", "status finite iterations wall_s")


class Smoothed(list):
    """Per-trajectory `TrajectoryOutcome` list of one smoothing step; ``xs`` holds the states
    (a list of (T_b, nx) arrays or `RemoteStates`)."""

    xs: Sequence = ()


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
    """Per-trajectory outcomes from the shards' `ShardSummary`."""
    rows = [list(zip(s.status, s.finite, s.iterations, s.wall_s)) for s in summaries]
    return Smoothed(TrajectoryOutcome(*r) for r in assemble(index, rows))


class ShardedOutcomes:
    """What ``ceem`` asks of a distributed smoothing step's outcomes, and the steps' measurements (both engines)."""

    def record(self, kind, t0, shard_s, sent, received, **extra) -> None:
        self.sharded.stats.append(dict(kind=kind, wall_s=time.perf_counter() - t0, shard_s=list(shard_s),
                                       sent_bytes=int(sent), received_bytes=int(received), **extra))

    @staticmethod
    def finite(r) -> bool:
        return r.finite

    @staticmethod
    def states(sm: Smoothed):
        return sm.xs


def is_dask_client(obj) -> bool:
    """True for a ``dask.distributed.Client`` (checked without importing dask)."""
    cls = type(obj)
    return cls.__name__ == "Client" and cls.__module__.split(".")[0] == "distributed"


def check_client_open(client) -> None:
    """Raise `OptionsError` when ``client`` is a closing or closed ``dask.distributed.Client``
    (anything else passes: the executor's kind is checked by `check_executor`)."""
    if is_dask_client(client) and str(getattr(client, "status", "running")) in ("closing", "closed"):
        raise OptionsError(f"executor: the dask.distributed.Client is {client.status} (client.close() was called or "
                           f"its cluster shut down); pass an open Client, e.g. inside 'with Client(address) as "
                           f"client:'")
