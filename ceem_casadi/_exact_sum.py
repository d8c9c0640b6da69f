"""Sums of many floating-point terms that do not depend on how the terms are split into shards.

The distributed learner (:mod:`ceem_casadi.remote_learner`) adds up per-stage data terms that
live on several workers. Summed in floating point, the total depends on the grouping: with
1 or 2 shards the learning objective at the same point differs by ~1e-15 relative (Lorenz,
B = 256, T = 500: 384,000 terms, objective 3e6). That is above the round-off allowance of IPOPT's
line search (10 eps |f|), so near the optimum its Armijo test is decided by round-off: measured
(B = 256, EM iteration 2) 9 learning rounds with one shard and 20 with two, iteration 3: 33 and 7.

Here each shard returns every sum as a double-double ``(hi, lo)``: ``hi`` the correctly rounded
exact sum of its terms (:func:`math.fsum`), ``lo`` the correctly rounded remainder. The client
adds all shards' ``hi`` and ``lo`` exactly (:func:`math.fsum` again), so the result is the
correctly rounded exact sum of all terms, the same for any split (up to ties at ~eps^2 relative
of the shards' partial sums), and accurate to eps |f|, which IPOPT's line search tolerates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class SplitSum:
    """Row sums of one shard's terms as ``hi + lo`` ((rows,) each; ``lo`` None: a plain sum,
    not exact, e.g. a gradient reduced by CasADi when per-stage terms would be too large)."""

    hi: np.ndarray
    lo: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.hi.nbytes + (0 if self.lo is None else self.lo.nbytes)


def split_sums(terms: np.ndarray) -> SplitSum:
    """Exact row sums of ``terms`` (rows, N) as a double-double :class:`SplitSum`."""
    terms = np.atleast_2d(np.asarray(terms, float))
    hi, lo = np.empty(terms.shape[0]), np.empty(terms.shape[0])
    for i, row in enumerate(terms):
        values = row.tolist()
        hi[i] = math.fsum(values)
        values.append(-hi[i])
        lo[i] = math.fsum(values)
    return SplitSum(hi, lo)


def combine(parts: list[SplitSum]) -> np.ndarray:
    """The sum (rows,) of the shards' :class:`SplitSum` ``parts``: exact and independent of
    their order when every part is exact, a plain sum in the given order otherwise."""
    if any(p.lo is None for p in parts):
        return np.sum([p.hi for p in parts], axis=0)
    columns = np.concatenate([np.stack([p.hi for p in parts]), np.stack([p.lo for p in parts])])
    return np.array([math.fsum(c) for c in columns.T.tolist()])
