"""The learning step's data terms (cost, gradient, Hessian triangle) of one learner at a point,
summed exactly where they are few (`ceem_casadi.objective._exact_sum`): what a shard of a
distributed fit and a piece of a long record return to the learner's IPOPT on the client."""
from __future__ import annotations

import time

import casadi as ca
import numpy as np

from ..objective._exact_sum import SplitSum, split_sums
from ..runtime._linalg import BufferedCall

# per-stage rows (cost, gradient, Hessian triangle) up to which a shard sums its learning terms exactly
# (`ceem_casadi.objective._exact_sum`); beyond it only the cost (e.g. a 2,246-parameter MLP's gradient)
EXACT_SUM_ROWS = 64


def terms_of(learner, P, z, what: str):
    """Data terms of a [`Learner`][ceem_casadi.learning.Learner] with NLP parameter ``P`` at ``z``, then seconds:
    ``what`` "f" (cost), "grad" (cost, gradient), "hess" (Hessian upper triangle, column-major) or "all" (the three;
    no Hessian if limited-memory), as `SplitSum` (exact up to ``EXACT_SUM_ROWS`` rows); for shards and pieces."""
    t0 = time.perf_counter()
    solver = learner.solver
    z = np.asarray(z, float)
    if what not in ("f", "grad", "hess", "all"):
        raise ValueError(f"what must be 'f', 'grad', 'hess' or 'all', got {what!r}")
    if what == "hess":
        return (_hessian_triangle(learner, solver, z, P), time.perf_counter() - t0)
    n = z.size
    want_g = what in ("grad", "all")
    want_h = what == "all" and solver.has_function("nlp_hess_l")
    exact_g = want_g and 1 + n <= EXACT_SUM_ROWS
    exact_h = want_h and exact_g and learner.hessian == "exact" and 1 + n + n * (n + 1) // 2 <= EXACT_SUM_ROWS
    if want_g and not exact_g:  # costs exact, the gradient summed by CasADi in the same pass
        terms, grad = _call(learner, ("summed", False), learner.stage_terms_function("summed"), z, P)
        out = [split_sums(np.asarray(terms)), SplitSum.plain(np.asarray(grad, float).ravel())]
    else:
        key = ("rows" if exact_g else "none", exact_h)
        sums = split_sums(_call(learner, key, learner.stage_terms_function(*key), z, P)[0])
        out = [sums.rows(0, 1)] + ([sums.rows(1, 1 + n)] if want_g else [])
    if what == "all":
        if exact_h:
            out.append(sums.rows(1 + n))
        else:
            out.append(SplitSum.plain(_hessian_triangle(learner, solver, z, P)) if want_h else None)
    return (*out, time.perf_counter() - t0)


def _call(learner, key, fun: ca.Function, *args) -> list[np.ndarray]:
    """``fun(*args)`` as dense numpy arrays (copies); with a numpy ``P`` (pieces of a long record) through a
    `BufferedCall` kept per learner and ``key`` (docs/long_records.md), else a plain call."""
    if not isinstance(args[-1], np.ndarray):
        return [np.asarray(o.full() if isinstance(o, ca.DM) else o) for o in _as_list(fun(*args))]
    cache = learner.__dict__.setdefault("_buffered_calls", {})
    if key not in cache:  # the call and, per output, its shape and the (rows, cols) of a sparse one's nonzeros
        sps = [fun.sparsity_out(i) for i in range(fun.n_out())]
        cache[key] = (BufferedCall(fun), [(sp.shape, None if sp.is_dense() else sp.get_triplet()) for sp in sps])
    call, layout = cache[key]
    out = []
    for f, (shape, where) in zip(call(*args), layout):
        if where is None:
            out.append(f.reshape(shape, order="F").copy())
        else:
            dense = np.zeros(shape)
            dense[where[0], where[1]] = f
            out.append(dense)
    return out


def _as_list(res) -> list:
    return list(res) if isinstance(res, (list, tuple)) else [res]


def _hessian_triangle(learner, solver, z, P) -> np.ndarray:
    """Upper triangle, column-major, of the learner's Hessian (exact or Gauss-Newton) at ``z``."""
    H = _call(learner, "nlp_hess_l", solver.get_function("nlp_hess_l"), z, P, np.ones(1), np.zeros(0))[0]
    return np.triu(H).T[np.tril_indices(z.size)]  # structural zeros of the exact Hessian included


def piece_terms(learner, P, z, what: str):
    """As `terms_of`, for the pieces of a long record (`ceem_casadi.learning._pieces`): plain sums by CasADi's
    maps of the learner's compiled Functions, added over the pieces in their fixed order (docs/long_records.md)."""
    t0 = time.perf_counter()
    z = np.asarray(z, float)
    if what not in ("f", "grad", "hess", "all"):
        raise ValueError(f"what must be 'f', 'grad', 'hess' or 'all', got {what!r}")
    solver = learner.solver
    if what == "hess":
        return (_hessian_triangle(learner, solver, z, P), time.perf_counter() - t0)
    if what == "f":
        (f,) = _call(learner, "cost", learner.cost_function, z, P)
        return (f.ravel(), time.perf_counter() - t0)
    f, g = _call(learner, "grad_f", solver.get_function("nlp_grad_f"), z, P)
    out = [f.ravel(), g.ravel()]
    if what == "all":
        out.append(_hessian_triangle(learner, solver, z, P) if solver.has_function("nlp_hess_l") else None)
    return (*out, time.perf_counter() - t0)
