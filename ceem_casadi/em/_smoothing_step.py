"""The smoothing step of a CE-EM iteration on one machine: in this process, or in forked workers that inherit the
smoother (`CEEMOptions(n_jobs=...)`; batched lengths as shards); the distributed engines offer the same interface."""
from __future__ import annotations

import numpy as np

from ..runtime._pool import WorkerPool
from ..smoothing._batched import any_batched
from ..smoothing._smoother import Smoother

__all__ = ["SmoothingStep"]


# --- process pool for the smoothing step -------------------------------------------------
_WORKER: dict = {}


def _worker_init(smoother):
    _WORKER["smoother"] = smoother  # the parent's, inherited through fork with everything it built (not pickled)


def _worker_smooth(args):
    theta_vec, y, u, x0 = args
    sm = _WORKER["smoother"]
    return sm.for_length(y.shape[0]).solve(sm.model, theta_vec, y, u, x0)


def _worker_smooth_shard(args):
    theta_vec, shard, xs = args  # a Trajectories shard: its trajectories of a length are batched
    return _WORKER["smoother"].solve(theta_vec, shard, xs)


class SmoothingStep:
    """Sequential or process-parallel smoothing of all trajectories."""

    def __init__(self, smoother: Smoother, n_jobs: int):
        self.smoother, self.pool, self.n_jobs = smoother, None, n_jobs
        if n_jobs > 1:
            # workers end with this process (SIGKILL, SIGTERM) and are killed at once on Ctrl-C
            self.pool = WorkerPool(n_jobs, initializer=_worker_init, initargs=(smoother,))

    def __call__(self, theta_vec, data, xs):
        if self.pool is None:
            return self.smoother.solve(theta_vec, data, xs)
        if any_batched(self.smoother.options, data.lengths):  # one shard of trajectories per process
            shards = np.array_split(np.arange(len(data)), self.n_jobs)
            jobs = [(theta_vec, data[s.tolist()], [xs[b] for b in s]) for s in shards if s.size]
            return [r for part in self.pool.map(_worker_smooth_shard, jobs) for r in part]
        jobs = [(theta_vec, y, data.inputs(b), xs[b]) for b, y in enumerate(data.y)]
        return self.pool.map(_worker_smooth, jobs)

    # the interface shared with the distributed engines (ceem_casadi.distributed)
    @staticmethod
    def finite(r) -> bool:
        return bool(np.all(np.isfinite(r.x)))

    @staticmethod
    def states(sm) -> list:
        return [r.x for r in sm]

    def log_density(self, theta_vec, data, xs) -> float:
        return self.smoother.joint_log_density(theta_vec, data, xs)

    def close(self):
        if self.pool is not None:
            self.pool.close()
