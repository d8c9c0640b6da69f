"""Distributed CE-EM: both steps on a Dask cluster, or the smoothing step on any ``concurrent.futures`` executor,
the trajectories split into shards (docs/scaling.md, "Many trajectories on a cluster").
"""
from __future__ import annotations

import time
from concurrent.futures import Executor

import numpy as np

from ..objective._log_density import joint_log_density
from ..runtime._solve import remaining
from . import _tasks as tasks
from ._dask import DaskEngine
from ._shards import (
    ShardedOutcomes,
    Smoothed,
    assemble,
    check_client_open,
    is_dask_client,
    model_spec,
    nbytes,
    outcomes,
    shard_index,
)

SUPPORTED = "a dask.distributed.Client, a concurrent.futures.Executor or a ceem_casadi.distributed.Sharded"


def check_executor(executor) -> None:
    """Raise TypeError (naming the kinds supported) unless ``executor`` is None or one of them; `OptionsError` for
    a closed ``dask.distributed.Client``.

    Parameters
    ----------
    executor : None, concurrent.futures.Executor, Sharded or dask.distributed.Client
        What `ceem(..., options=CEEMOptions(executor=...))` would distribute the work with.

    Returns
    -------
    None
        When ``executor`` is supported.

    Examples
    --------
    >>> from concurrent.futures import ThreadPoolExecutor
    >>> from ceem_casadi.distributed import check_executor
    >>> check_executor(None)
    >>> with ThreadPoolExecutor(1) as pool:
    ...     check_executor(pool)
    >>> try:
    ...     check_executor("localhost:8786")
    ... except TypeError as err:
    ...     print(str(err)[:40])
    executor must be None, a dask.distribute
    """
    check_client_open(executor.executor if isinstance(executor, Sharded) else executor)
    if executor is None or isinstance(executor, (Executor, Sharded)) or is_dask_client(executor):
        return
    raise TypeError(f"executor must be None, {SUPPORTED}; got {type(executor).__module__}."
                    f"{type(executor).__qualname__}. For a cluster: executor=dask.distributed.Client(address); "
                    "on one machine: n_jobs=2 or executor=concurrent.futures.ProcessPoolExecutor(2)")


class Sharded:
    """An executor with the trajectories split into shards, and measurements of every step.

    Parameters
    ----------
    executor : dask.distributed.Client or concurrent.futures.Executor
        Where the shards run.
    n_shards : int or None
        Groups of trajectories, one task each per step; default: the number of worker threads (Dask) or the
        executor's ``max_workers``.

    Attributes
    ----------
    stats : list of dict
        One dict per step of every fit run with it: ``kind`` (``"smooth"``, ``"learn"``, ``"J"``, ``"setup"``,
        ``"fetch"``), ``wall_s`` (client wall clock, s), ``shard_s`` (compute seconds inside each shard's task; for
        ``"learn"`` summed over the solve's calls), ``sent_bytes`` and ``received_bytes`` (pickled payload between
        client and workers); Dask's ``"smooth"``: ``task_s`` (with J and the first learning round); ``"learn"``:
        ``calls`` (map-reduce rounds), ``trips`` (those sent), ``wait_s`` (waiting for them), ``setup_s``; ``"J"``:
        ``trips`` 0 when it came from the learning session.

    Examples
    --------
    A fit over four trajectories with their smoothing in two shards on a thread pool:

    >>> from concurrent.futures import ThreadPoolExecutor
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(4, 30, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [[0.0]] * 4, [30] * 4, u=list(u), process_std=0.1,
    ...                       measurement_std=0.1, seed=1)
    >>> with ThreadPoolExecutor(2) as pool:
    ...     sharded = cc.Sharded(pool, n_shards=2)
    ...     fit = cc.ceem(model, data, {"a": 0.5}, options=cc.CEEMOptions(executor=sharded,
    ...         smoother=cc.SmootherOptions(compile=False), learner=cc.LearnerOptions(compile=False)))
    >>> round(float(fit.theta["a"]), 2), sorted({s["kind"] for s in sharded.stats})  # doctest: +ELLIPSIS
    (0.8, [...'smooth'...])
    """

    def __init__(self, executor, n_shards: int | None = None):
        if isinstance(executor, Sharded) or not (isinstance(executor, Executor) or is_dask_client(executor)):
            raise TypeError(f"Sharded(executor): executor must be a dask.distributed.Client or a "
                            f"concurrent.futures.Executor, got {type(executor).__qualname__}")
        if n_shards is not None and not (isinstance(n_shards, int) and n_shards >= 1):
            raise ValueError(f"n_shards must be None or an int >= 1, got {n_shards!r}")
        self.executor, self.n_shards, self.stats = executor, n_shards, []

    def start(self, model, data, smoother_options, learner_options, smoother):
        """The engine of one fit (used by [`ceem`][ceem_casadi.ceem]), given the fit's smoother and learner options."""
        if is_dask_client(self.executor):
            return DaskEngine(self, model, data, smoother_options, learner_options)
        return ExecutorEngine(self, model, data, smoother_options, learner_options, smoother)


def engine_has_learner(executor) -> bool:
    """Whether the engine of ``executor`` runs its own learning step (Dask: on the workers that keep the states),
    which a user's learner cannot replace."""
    return is_dask_client(executor.executor if isinstance(executor, Sharded) else executor)


def start_engine(executor, model, data, smoother_options, learner_options, smoother):
    """The engine for ``CEEMOptions.executor`` (wrapped in a [`Sharded`][ceem_casadi.Sharded] unless it is one)."""
    sharded = executor if isinstance(executor, Sharded) else Sharded(executor)
    return sharded.start(model, data, smoother_options, learner_options, smoother)


class ExecutorEngine(ShardedOutcomes):
    """Smoothing step on a ``concurrent.futures`` executor: one task per shard, states sent with
    each task and returned; J and the learning step on the client (``learner`` is None)."""

    learner = None

    def __init__(self, sharded: Sharded, model, data, smoother_options, learner_options, smoother):
        self.sharded, self.smoother = sharded, smoother
        pool = sharded.executor
        n = sharded.n_shards or getattr(pool, "_max_workers", None) or 2
        self.index = shard_index(data.lengths, n)
        self.shards = [data[idx] for idx in self.index]
        self.spec = model_spec(model, smoother_options, learner_options)
        self.n_trajectories = len(data)

    def __call__(self, theta_vec, data, xs) -> Smoothed:
        t0 = time.perf_counter()
        theta_vec = np.asarray(theta_vec, float)
        args = [(self.spec, theta_vec, shard, [np.asarray(xs[b]) for b in idx], remaining())
                for shard, idx in zip(self.shards, self.index)]
        states = [f.result() for f in [self.sharded.executor.submit(tasks.smooth, *a) for a in args]]
        out = outcomes(self.index, [s[1] for s in states])
        out.xs = assemble(self.index, [s[0] for s in states])
        self.record("smooth", t0, [s[1].compute_s for s in states], nbytes(args), nbytes(states))
        return out

    def log_density(self, theta_vec, data, xs) -> float:
        return joint_log_density(self.smoother, theta_vec, data, xs)

    def close(self) -> None:
        pass
