"""The Dask engine of a distributed CE-EM fit: one actor (`ShardActor`) per shard pinned to a worker, holding its
data and its state trajectories by version; the client holds only version numbers (`RemoteStates`)."""
from __future__ import annotations

import itertools
import time
from collections import namedtuple

import numpy as np

from ..learning._remote import RemoteLearner
from ..runtime._solve import remaining
from . import _tasks as tasks
from ._shards import (
    RemoteStates,
    ShardedOutcomes,
    Smoothed,
    assemble,
    check_client_open,
    model_spec,
    nbytes,
    outcomes,
    shard_index,
)


def _all(futures) -> list:
    """Results of actor futures (all calls are issued before the first wait)."""
    return [f.result() for f in futures]


# per shard (J, learning terms at first = (z, what)): what the smoothing tasks evaluated at their states
_Ahead = namedtuple("_Ahead", "theta_vec version first shards")


class DaskEngine(ShardedOutcomes):
    """Smoothing, J and the learner's map-reduce on a ``dask.distributed.Client``."""

    def __init__(self, sharded, model, data, smoother_options, learner_options):
        t0 = time.perf_counter()
        self.sharded, self.client = sharded, sharded.executor
        check_client_open(self.client)  # closed since the options were made: one clear message
        workers = self.client.scheduler_info()["workers"]
        if not workers:
            raise RuntimeError("the Dask cluster has no workers: start some (or wait for them with "
                               "client.wait_for_workers(n)) before the fit")
        slots = [a for a in sorted(workers) for _ in range(int(workers[a].get("nthreads", 1)))]
        self.index = shard_index(data.lengths, sharded.n_shards or len(slots))
        self.where = [slots[k % len(slots)] for k in range(len(self.index))]
        self.n_trajectories = len(data)
        spec = model_spec(model, smoother_options, learner_options)
        spec_f = self.client.scatter(spec, broadcast=True, hash=False)
        shards = [data[idx] for idx in self.index]
        self.actors = [self.client.submit(tasks.ShardActor, spec_f, self.client.scatter([s], workers=[w], hash=False)[0],
                                          workers=[w], allow_other_workers=False, actor=True).result()
                       for s, w in zip(shards, self.where)]
        kinds = _all([a.prepare() for a in self.actors])
        self._version = itertools.count()
        self._memo: tuple = (None, None)  # (the last list of states sent, its version)
        self._setup = None  # (theta_vec, version) of the learning session, sent with its first reduce
        self._ahead = self._base = None  # `_Ahead` of the last smoothing step; of the learning session
        self.learner = RemoteLearner(self, model, learner_options, kinds[0][0])
        self.record("setup", t0, [k[1] for k in kinds], len(spec.blob) * len(workers) + nbytes(shards), 16)

    def _version_of(self, xs) -> tuple[int, int]:
        """(version of the states ``xs`` on the actors, bytes sent): a list is sent once."""
        if isinstance(xs, RemoteStates) and xs.engine is self:
            return xs.handle, 0
        if self._memo[0] is xs:
            return self._memo[1], 0
        v = next(self._version)
        parts = [[np.asarray(xs[b], float) for b in idx] for idx in self.index]
        _all([a.put(v, p) for a, p in zip(self.actors, parts)])
        self._memo = (xs, v)
        return v, nbytes(parts)

    def fetch(self, remote: RemoteStates) -> list:
        """All states of ``remote`` on the client (list by trajectory)."""
        t0 = time.perf_counter()
        parts = _all([a.states(remote.handle) for a in self.actors])
        self.record("fetch", t0, [], 0, nbytes(parts))
        return assemble(self.index, parts)

    # --- the steps -----------------------------------------------------------------------
    def __call__(self, theta_vec, data, xs) -> Smoothed:
        """The smoothing step; each shard's task then evaluates J and the learning step's first round at the new
        states (`_Ahead`: two round trips less per EM iteration, docs/scaling.md)."""
        t0 = time.perf_counter()
        theta_vec = np.asarray(theta_vec, float)
        source, sent = self._version_of(xs)
        target, budget = next(self._version), remaining()
        first = (theta_vec[self.learner.free], "grad" if self.learner.hessian == "limited-memory" else "all")
        summaries, ahead = zip(*_all([a.smooth(theta_vec, source, target, budget, first) for a in self.actors]))
        out = outcomes(self.index, summaries)
        out.xs = RemoteStates(self, target)
        self._ahead = None if None in ahead else _Ahead(theta_vec, target, first, ahead)
        self.record("smooth", t0, [s.compute_s for s in summaries], sent + nbytes(theta_vec) * len(self.actors),
                    nbytes(summaries) + 16 * len(summaries),
                    task_s=[s.compute_s + (a[1][-1] if a else 0.0) for s, a in zip(summaries, ahead)])
        return out

    def log_density(self, theta_vec, data, xs) -> float:
        t0 = time.perf_counter()
        theta_vec = np.asarray(theta_vec, float)
        J = self._known_J(theta_vec, xs)
        if J is not None:  # from the smoothing tasks' costs
            self.record("J", t0, [0.0] * len(self.actors), 0, 0, trips=0)
            return J
        version, sent = self._version_of(xs)
        vals = _all([a.log_density(theta_vec, version) for a in self.actors])
        self.record("J", t0, [v[1] for v in vals], sent + nbytes(theta_vec) * len(self.actors), 16 * len(vals))
        return float(sum(v[0] for v in vals))

    def _known_J(self, theta_vec, xs) -> float | None:
        """J at ``theta_vec`` and the states of the last learning session without a message: J at the session's start
        plus the drop of the data terms' cost (-J up to terms free of theta), when both costs are known; else None."""
        base, free = self._base, self.learner.free
        if base is None or not isinstance(xs, RemoteStates) or xs.handle != base.version \
                or not np.array_equal(np.delete(base.theta_vec, free), np.delete(theta_vec, free)):
            return None
        f0, f1 = self.learner.cost_at(base.theta_vec[free]), self.learner.cost_at(theta_vec[free])
        return None if f0 is None or f1 is None else float(sum(s[0] for s in base.shards)) + f0 - f1

    def learning_session(self, theta_vec, xs) -> list:
        """The actors, whose learner data terms are set up at ``theta_vec`` and states ``xs`` by the smoothing tasks
        that made ``xs`` (`first_round`), else by the session's first `reduce` (in the same round trip)."""
        version, self.session_sent = self._version_of(xs)
        theta_vec = np.asarray(theta_vec, float)
        ahead, self._ahead = self._ahead, None
        ok = ahead is not None and ahead.version == version and np.array_equal(ahead.theta_vec, theta_vec)
        self._base, self._setup = (ahead, None) if ok else (None, (theta_vec, version))
        return self.actors

    def first_round(self) -> tuple | None:
        """``(z, what, shards' terms, bytes)`` of the session's first round if the smoothing tasks ran it, else None."""
        terms = None if self._base is None else [s[1] for s in self._base.shards]
        return None if terms is None else (*self._base.first, terms, nbytes(terms))

    def reduce(self, session: list, z: np.ndarray, what: str) -> tuple[list, int]:
        """Each shard's learning terms at ``z``: (list of per-shard tuples, bytes received)."""
        setup, self._setup = self._setup, None
        res = _all([a.terms(z, what, setup) for a in session])
        return res, nbytes(res)

    def close(self) -> None:
        self._memo = (None, None)
