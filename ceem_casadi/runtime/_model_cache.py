"""The library's one cache of objects compiled from a model (rollouts, solvers, filters), keyed by the
model's structure, bounded, thread-safe, kept out of the user's model object (docs/runtime.md, "The
library's model cache")."""
from __future__ import annotations

import hashlib
import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from ._cache_guard import sweep
from ._compile import cache_dir

__all__ = ["MAXSIZE", "cached", "clear_model_cache", "noise_key", "structure_key"]

MAXSIZE = 128  # entries kept in each table (least recently used dropped beyond)

_BUILD_LOCK = threading.RLock()     # every build (CasADi symbolics are not thread-safe)
_LOCK = threading.Lock()            # the tables below
_ENTRIES: OrderedDict[tuple, Any] = OrderedDict()
# id of a Function -> (the Function, kept so that its id is not reused while remembered; its digest)
_DIGESTS: OrderedDict[int, tuple[Any, str]] = OrderedDict()
_UNIQUE = itertools.count()
# id of a model -> (its weak reference, the parts its key was computed from, the key)
_KEYS: OrderedDict[int, tuple] = OrderedDict()


def _put(table: OrderedDict, key, value) -> None:
    """``table[key] = value`` under ``_LOCK``, dropping the least recently used beyond `MAXSIZE`."""
    with _LOCK:
        table[key] = value
        while len(table) > MAXSIZE:
            table.popitem(last=False)


def _function_digest(fun) -> str:
    """sha256 of ``fun.serialize()`` (memoised per Function object); a Function that cannot be
    serialised gets a token of its own (never shared, never aliased)."""
    if fun is None:
        return "-"
    with _LOCK:
        hit = _DIGESTS.get(id(fun))
        if hit is not None and hit[0] is fun:
            _DIGESTS.move_to_end(id(fun))
            return hit[1]
    try:
        digest = hashlib.sha256(fun.serialize().encode()).hexdigest()
    except Exception:  # e.g. an external Function without its source
        digest = f"unserialisable-{next(_UNIQUE)}"
    _put(_DIGESTS, id(fun), (fun, digest))
    return digest


def _array_key(a) -> Hashable:
    return None if a is None else (np.shape(a), np.asarray(a, float).tobytes())


def structure_key(model) -> tuple:
    """The key of ``model``'s structure: digests of ``f`` and ``g``, ``(nx, nu, ny)``, the name and every parameter
    declaration (names, shapes, free entries, bounds, priors); not the noise (`noise_key`)."""
    parts = (model.f, model.g, model.params, model.name, model.nx, model.nu, model.ny)
    with _LOCK:  # memoised per model object while its f, g, params (identical objects), name and sizes stay the same
        hit = _KEYS.get(id(model))
        if hit is not None and hit[0]() is model and all(a is b for a, b in zip(hit[1][:3], parts[:3])) \
                and hit[1][3:] == parts[3:]:
            return hit[2]
    params = model.params
    mean, weight = params.prior
    arrays = (params.free_index, params.lower, params.upper, mean, weight)
    key = (_function_digest(model.f), _function_digest(model.g), model.nx, model.nu, model.ny, model.name,
           tuple(params.names), hashlib.sha256(repr([_array_key(a) for a in arrays]).encode()).hexdigest())
    try:
        ref = weakref.ref(model)
    except TypeError:  # an object without weak references: not memoised
        return key
    _put(_KEYS, id(model), (ref, parts, key))
    return key


def noise_key(model) -> tuple:
    """The key of ``model``'s noise settings, for builds that bake them in."""
    noise = model.noise
    return tuple(_array_key(getattr(noise, k)) for k in ("process_std", "measurement_std", "x1_mean", "x1_std"))


def cached(model, kind: str, args: Hashable, build: Callable[[], Any], *, per_thread: bool = False):
    """The object ``build()`` for ``model``'s structure, ``kind`` (e.g. ``"rollout"``) and hashable ``args``: built once
    under the build lock, the same object for an equal key; ``per_thread``: one per thread (solvers, buffers)."""
    key = (structure_key(model), kind, args, threading.get_ident() if per_thread else None)
    with _LOCK:
        if key in _ENTRIES:
            _ENTRIES.move_to_end(key)
            return _ENTRIES[key]
    with _BUILD_LOCK:
        with _LOCK:  # built by another thread while this one waited
            if key in _ENTRIES:
                _ENTRIES.move_to_end(key)
                return _ENTRIES[key]
        value = build()
        _put(_ENTRIES, key, value)
    return value


def clear_model_cache(disk: bool = False) -> int:
    """Drop every object the library compiled from a model (rollouts, solvers, filters, design
    functions); the next call builds them again.

    Parameters
    ----------
    disk : bool
        Also remove every compiled library from the disk cache (``$CEEM_CACHE``, see
        `compile_cache_usage`); the next compiled fit builds them again.

    Returns
    -------
    int
        The number of objects dropped (and of libraries removed, with ``disk``).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x, lambda x, u, p: x, nx=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5)))
    >>> y = cc.simulate_output(model, {"a": 0.5}, x0=np.ones(1), horizon=5)
    >>> cc.runtime.clear_model_cache() >= 1
    True
    >>> cc.runtime.clear_model_cache()
    0
    """
    with _BUILD_LOCK, _LOCK:
        n = len(_ENTRIES)
        _ENTRIES.clear()
        _DIGESTS.clear()
        _KEYS.clear()
    return n + (len(sweep(cache_dir(), 0.0)) if disk else 0)
