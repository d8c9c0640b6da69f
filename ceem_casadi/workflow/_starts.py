"""Seeded multi-starts around a guess (`log_uniform_starts`: ``starts=n`` of [`identify`][ceem_casadi.identify]
and [`refine_output_error`][ceem_casadi.refine_output_error]) and every form ``starts=`` takes (`resolve_starts`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import CeemError
from ..runtime._checks import count
from ..runtime._schema import require

__all__ = ["log_uniform_starts", "resolve_starts"]

#: default spread factor of `log_uniform_starts`
SPREAD = 3.0


def log_uniform_starts(model, theta: Mapping, n: int, *, seed: int = 0, spread: float = SPREAD) -> list[dict]:
    """``n`` seeded starting parameter sets around ``theta``: every free entry ``v`` times a
    log-uniform factor in ``[1 / spread, spread]`` (sign kept), an entry 0 drawn uniformly in
    ``[-1, 1]``, both clipped into the bounds; fixed entries kept; draws from
    ``numpy.random.default_rng([seed, 2])``.

    Parameters
    ----------
    model : StateSpaceModel
        The model (its bounds and free entries).
    theta : dict
        The guess, name -> array.
    n : int
        Number of starts (>= 0).
    seed : int
        Seed of the draws.
    spread : float
        Factor > 1: every free entry within ``[v / spread, v spread]``.

    Returns
    -------
    list of dict
        ``n`` complete parameter sets (name -> array).

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> from ceem_casadi.workflow import log_uniform_starts
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5, lower=0.0, upper=0.9)))
    >>> s = log_uniform_starts(model, {"a": 0.5}, 3, seed=1)
    >>> len(s), all(0.5 / 3 <= float(t["a"]) <= 0.9 for t in s)
    (3, True)
    >>> [float(t["a"]) for t in s] == [float(t["a"]) for t in log_uniform_starts(model, {"a": 0.5}, 3, seed=1)]
    True
    """
    require(not isinstance(n, bool) and isinstance(n, (int, np.integer)) and n >= 0,
            f"starts: expected a number of starts >= 0 (int) or a list of dicts, got {n!r}")
    require(np.isfinite(spread) and spread > 1, f"spread must be a finite number > 1, got {spread!r}")
    params = model.params
    base = params.to_vector(params.validate(theta))
    lo, hi, free = params.lower, params.upper, params.free_mask
    rng = np.random.default_rng([count(seed, "seed", minimum=0), 2])
    out = []
    for _ in range(int(n)):
        factor = np.exp(rng.uniform(-1.0, 1.0, base.size) * np.log(spread))
        flat = rng.uniform(np.clip(-1.0, lo, hi), np.clip(1.0, lo, hi))   # for entries at 0; bounds may exclude +-1
        flat = np.where(np.isfinite(flat), flat, 0.0)
        v = np.where(base != 0.0, base * factor, flat)
        out.append(params.from_vector(np.where(free, np.clip(v, lo, hi), base)))
    return out


def resolve_starts(model, theta: Mapping, starts, *, seed: int = 0) -> list | None:
    """``starts=`` as given to a fit: ``None``, an int n (`log_uniform_starts`, ``seed``) or a
    sequence of (possibly partial) dicts, returned as complete validated dicts (the missing names
    from ``theta``); anything else is refused with one line."""
    if starts is None:
        return None
    if isinstance(starts, (int, np.integer)) and not isinstance(starts, bool):
        return log_uniform_starts(model, theta, int(starts), seed=seed) or None
    require(isinstance(starts, Sequence) and not isinstance(starts, (Mapping, str)), "starts: expected an int (number "
            f"of seeded log-uniform starts) or a list of parameter dicts, got {type(starts).__name__}")
    out = []
    for i, s in enumerate(starts):
        require(isinstance(s, Mapping), f"starts[{i}]: expected a dict of parameter values, got {type(s).__name__}")
        try:
            out.append(model.params.validate({**theta, **s}))  # a partial start: the rest from theta
        except CeemError as exc:
            raise type(exc)(f"starts[{i}]: {exc}") from None
    return out
