"""The learning step's data terms (cost, gradient, Hessian triangle) of one learner at a point,
summed exactly where they are few (`ceem_casadi.objective._exact_sum`): what a shard of a
distributed fit and a piece of a long record return to the learner's IPOPT on the client."""
from __future__ import annotations

import time

import numpy as np

from ..objective._exact_sum import SplitSum, split_sums

# per-stage rows (cost, gradient, Hessian triangle) up to which a shard sums its learning terms exactly
# (:mod:`ceem_casadi._exact_sum`); beyond it only the cost (e.g. a 2,246-parameter MLP's gradient)
EXACT_SUM_ROWS = 64


def terms_of(learner, P, z, what: str):
    """`learning_terms` of a [`Learner`][ceem_casadi.learning.Learner] with NLP parameter ``P``
    (seconds last); also the pieces of a long record (`ceem_casadi.learning._pieces`) and the shards of a distributed fit (`ceem_casadi.distributed`)."""
    t0 = time.perf_counter()
    solver = learner.solver
    z = np.asarray(z, float)
    if what not in ("f", "grad", "hess", "all"):
        raise ValueError(f"what must be 'f', 'grad', 'hess' or 'all', got {what!r}")
    if what == "hess":
        return (_hessian_triangle(solver, z, P), time.perf_counter() - t0)
    n = z.size
    want_g = what in ("grad", "all")
    want_h = what == "all" and solver.has_function("nlp_hess_l")
    exact_g = want_g and 1 + n <= EXACT_SUM_ROWS
    exact_h = want_h and exact_g and learner.hessian == "exact" and 1 + n + n * (n + 1) // 2 <= EXACT_SUM_ROWS
    if want_g and not exact_g:  # costs exact, the gradient summed by CasADi in the same pass
        terms, grad = learner.stage_terms_function("summed")(z, P)
        out = [split_sums(np.asarray(terms)), SplitSum.plain(np.asarray(grad, float).ravel())]
    else:
        sums = split_sums(np.asarray(learner.stage_terms_function("rows" if exact_g else "none", exact_h)(z, P)))
        out = [sums.rows(0, 1)] + ([sums.rows(1, 1 + n)] if want_g else [])
    if what == "all":
        if exact_h:
            out.append(sums.rows(1 + n))
        else:
            out.append(SplitSum.plain(_hessian_triangle(solver, z, P)) if want_h else None)
    return (*out, time.perf_counter() - t0)


def _hessian_triangle(solver, z, P) -> np.ndarray:
    """Upper triangle, column-major, of the learner's Hessian (exact or Gauss-Newton) at ``z``."""
    H = np.asarray(solver.get_function("nlp_hess_l")(z, P, 1.0, np.zeros(0)).full())
    return np.triu(H).T[np.tril_indices(z.size)]  # structural zeros of the exact Hessian included
