"""Tasks on the workers of a distributed CE-EM fit (a Dask worker or any ``concurrent.futures`` pool), the solvers
cached per worker thread (docs/scaling.md, "What runs where")."""
from __future__ import annotations

import ctypes
import pickle
import threading
import time
from collections import Counter, OrderedDict, namedtuple
from dataclasses import replace

import numpy as np

from ..learning._learner import Learner
from ..learning._terms import terms_of
from ..objective._log_density import joint_log_density, log_normalisers
from ..runtime._solve import deadline
from ..smoothing._smoother import Smoother

MAX_CACHED = 4  # models kept per worker thread (oldest dropped first)

_CACHE: OrderedDict = OrderedDict()  # (digest, thread id) -> _Solvers
_BUILDS: Counter = Counter()  # digest -> solver sets built in this process
_LOCK = threading.Lock()


# a model and its solver options as pickled bytes, with their SHA-256 ``digest`` (the cache key)
ModelSpec = namedtuple("ModelSpec", "digest blob")


class _Solvers:
    """The smoother and the shard learners (data terms only: no prior, no trust region) of a model."""

    def __init__(self, model, smoother_options, learner_options):
        self.model = model
        self.smoother = Smoother(model, smoother_options)
        self.learner_options = replace(learner_options, use_prior=False)
        self._learners: dict[tuple, Learner] = {}

    def smoother_for(self, lengths) -> Smoother:
        """The smoother with its solvers for every length in ``lengths`` built."""
        with _LOCK:
            for T in sorted(set(lengths)):
                self.smoother.for_length(T)
        return self.smoother

    def learner(self, lengths) -> Learner:
        key = tuple(lengths)
        if key not in self._learners:
            with _LOCK:
                self._learners[key] = Learner(self.model, key, self.learner_options, self.smoother.stages)
        return self._learners[key]


def solvers(spec: ModelSpec) -> _Solvers:
    """This thread's cached solvers of ``spec`` (built, and the model unpickled, on first use)."""
    key = (spec.digest, threading.get_ident())
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
        model, smoother_options, learner_options = pickle.loads(spec.blob)
        entry = _Solvers(model, smoother_options, learner_options)
        _BUILDS[spec.digest] += 1
        _CACHE[key] = entry
        while len(_CACHE) > MAX_CACHED:
            _CACHE.popitem(last=False)
        return entry


def cache_info() -> dict:
    """``{digest: number of solver sets built in this process}`` (tests, benchmarks)."""
    return dict(_BUILDS)


# what the client needs of one shard's smoothing: per trajectory status, finiteness, iterations and solve time (s),
# and the task's compute time ``compute_s`` (s)
ShardSummary = namedtuple("ShardSummary", "status finite iterations wall_s compute_s")


def smooth(spec: ModelSpec, theta_vec, shard, xs, remaining: float | None) -> tuple[list, ShardSummary, float]:
    """``(states, summary, J)``: every trajectory of ``shard`` smoothed from ``xs`` (list of (T_b, nx)), J at the new
    states from the solves' costs without trust region (docs/scaling.md); ``remaining``: budget left (s) or None."""
    t0 = time.perf_counter()
    smoother = solvers(spec).smoother_for(shard.lengths)
    expires = None if remaining is None else time.perf_counter() + remaining
    with deadline(expires):
        res = smoother.solve(np.asarray(theta_vec, float), shard, xs)
    J = sum(-(r.cost - smoother.options.rho_x * float(np.sum((r.x - x) ** 2))) + log_normalisers(smoother.model, y)
            for r, x, y in zip(res, xs, shard.y))
    return [r.x for r in res], ShardSummary([r.status for r in res], [bool(np.all(np.isfinite(r.x))) for r in res],
                                            [r.iterations for r in res], [r.wall_s for r in res],
                                            time.perf_counter() - t0), float(J)


def keep_freed_memory(mmap_from: int = 32 << 20) -> None:
    """Let glibc's malloc keep freed blocks below ``mmap_from`` bytes for reuse (with a Dask nanny's setting every
    larger temporary is page-faulted anew: docs/scaling.md, "The workers' memory allocator"). Not glibc: no-op."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, mmap_from)  # M_MMAP_THRESHOLD (at most 32 MB on 64-bit)
    mallopt(-1, 2 * mmap_from)  # M_TRIM_THRESHOLD: what glibc's own dynamic rule would reach


class ShardActor:
    """One shard on one Dask worker (a Dask actor): its data, its recent state trajectories by version number, and
    its learner parameters during a learning step; calls go straight to the worker (the learner's many rounds)."""

    KEEP = 6  # state versions kept (the EM loop holds at most a few iterates at once)

    def __init__(self, spec: ModelSpec, shard):
        self.spec, self.shard = spec, shard
        keep_freed_memory()
        self.versions: OrderedDict = OrderedDict()
        self.learning: tuple | None = None  # (learner, its NLP parameter (n_P,)) of the learning session

    def prepare(self) -> tuple[str, float]:
        """Build (or find) the shard's smoother lengths and learner; ``(learner Hessian kind, seconds)``."""
        t0 = time.perf_counter()
        sol = solvers(self.spec)
        sol.smoother_for(self.shard.lengths)
        return sol.learner(self.shard.lengths).hessian, time.perf_counter() - t0

    def put(self, version: int, xs: list) -> None:
        self.versions[version] = xs
        while len(self.versions) > self.KEEP:
            self.versions.popitem(last=False)

    def _get(self, version: int) -> list:
        if version not in self.versions:
            raise KeyError(f"state version {version} is no longer held by this shard (kept: "
                           f"{list(self.versions)}); it was superseded by newer iterates")
        return self.versions[version]

    def smooth(self, theta_vec, source: int, target: int, remaining: float | None, first: tuple | None = None):
        """``(summary, ahead)``: the states smoothed from version ``source`` kept as ``target``; with ``first = (z,
        what)`` and finite states ``ahead = (J, terms)`` at them (the learning session set up), else None."""
        xs, summary, J = smooth(self.spec, theta_vec, self.shard, self._get(source), remaining)
        self.put(target, xs)
        if first is None or not all(summary.finite):
            return summary, None
        return summary, (J, self.terms(*first, (theta_vec, target)))

    def states(self, version: int) -> list:
        return self._get(version)

    def log_density(self, theta_vec, version: int) -> tuple[float, float]:
        """The shard's part of J (all constants included, `joint_log_density`) and its seconds."""
        t0 = time.perf_counter()
        J = joint_log_density(solvers(self.spec).smoother, np.asarray(theta_vec, float), self.shard, self._get(version))
        return J, time.perf_counter() - t0

    def terms(self, z, what: str, setup: tuple | None = None):
        """`terms_of` the shard's learner at ``z`` (n_free,), its parameter vector first set at ``setup = (theta_vec,
        version)`` if given (numpy: through CasADi's buffers; a DM cost 2.5x the CPU, docs/scaling.md); seconds last."""
        t0 = time.perf_counter()
        if setup is not None:
            learner = solvers(self.spec).learner(self.shard.lengths)
            self.learning = learner, learner.parameter_vector(setup[0], self.shard, self._get(setup[1]), 0.0)
        *out, _ = terms_of(*self.learning, z, what)
        return (*out, time.perf_counter() - t0)
