"""Sums of many floating-point terms that do not depend on how the terms are split into shards (AccSum
extraction per shard, `math.fsum` on the client; docs/runtime.md, "Exact sums across shards")."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PASSES = 3  # extraction passes: each leaves a remainder below 2^-53 (N + 2) of the previous one


@dataclass
class SplitSum:
    """Row sums of one shard's terms: ``parts`` (rows, k) whose row sums are the shard's exact
    sums (``exact``) or a plain sum in one column (not exact, e.g. a gradient reduced by CasADi
    where per-stage terms would be too large)."""

    parts: np.ndarray
    exact: bool = True

    @classmethod
    def plain(cls, values) -> SplitSum:
        return cls(np.asarray(values, float).reshape(-1, 1), False)

    def rows(self, start: int, stop: int | None = None) -> SplitSum:
        return SplitSum(self.parts[start:stop], self.exact)


def split_sums(terms: np.ndarray) -> SplitSum:
    """The row sums of ``terms`` (rows, N) as `SplitSum` parts (rows, PASSES + 1): per pass
    the exact sum of the extracted leading bits (sigma = 2^ceil(log2(N + 2)) 2^ceil(log2 max|x|),
    q = (sigma + x) - sigma, a sum of q is exact in any order), then the remainder's plain sum.
    Rows with a non-finite term get that row's plain sum (inf or NaN, as IPOPT expects)."""
    x = np.array(np.atleast_2d(terms), dtype=float)
    rows, n = x.shape
    out = np.zeros((rows, PASSES + 1))
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        out[bad, 0] = x[bad].sum(axis=1)
        x[bad] = 0.0
    scale = 2.0 ** math.ceil(math.log2(n + 2))
    for k in range(PASSES):
        mu = np.abs(x).max(axis=1) if n else np.zeros(rows)
        with np.errstate(over="ignore"):
            sigma = scale * np.ldexp(1.0, np.frexp(mu)[1])[:, None] * (mu > 0)[:, None]
        if not np.all(np.isfinite(sigma)):  # terms near overflow: exact sums the slow way
            return SplitSum(np.array([[_fsum(r)] for r in np.atleast_2d(terms)]))
        q = (sigma + x) - sigma
        x -= q
        out[:, k] += q.sum(axis=1)
    out[:, PASSES] = x.sum(axis=1)
    return SplitSum(out)


def combine(parts: list[SplitSum]) -> np.ndarray:
    """The sum (rows,) of the shards' `SplitSum` ``parts``: exact and independent of their
    order when every part is exact, a plain sum in the given order otherwise."""
    if not all(p.exact for p in parts):
        return np.sum([p.parts.sum(axis=1) for p in parts], axis=0)
    columns = np.concatenate([p.parts for p in parts], axis=1)
    return np.array([_fsum(c) for c in columns])


def _fsum(values: np.ndarray) -> float:
    """`math.fsum`, or the plain sum where it has none (non-finite terms, overflow)."""
    try:
        return math.fsum(values) if np.isfinite(values).all() else float(np.sum(values))
    except OverflowError:
        with np.errstate(over="ignore"):
            return float(np.sum(values))
