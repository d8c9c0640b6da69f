"""Many banded Newton solves at once (`BandedNewton.steps` side by side): one evaluation and one LAPACK call per
round for all, the outcomes those of separate solves (docs/algorithms.md, "Many short trajectories together")."""
from __future__ import annotations

import numpy as np
from scipy.linalg.lapack import dpbtrf, dpbtrs

from ._banded import COST, DIRECTION, NEWTON, BandedNewton, NewtonOutcome, band_patterns


def stacked_directions(requests, nx: int, T: int) -> list[np.ndarray | None]:
    """Newton directions d (nx T,) of m systems ``(H + shift I) d = -g`` (``requests``: m ``(nz, d0, g, shift)`` as
    `BandedNewton.steps` yields) by one banded Cholesky; None where H is not positive definite or d is not finite."""
    cols, rows = band_patterns(nx)
    above = np.arange(cols.size)[rows < 2 * nx - 1 - cols]  # entries of the block above the diagonal
    n = nx * T
    out: list[np.ndarray | None] = [None] * len(requests)
    todo = list(range(len(requests)))
    while todo:
        m = len(todo)
        cube = np.zeros((m * T, nx, 2 * nx))
        cube[:, cols, rows] = np.concatenate([requests[i][0] for i in todo]).reshape(m * T, -1)
        cube[::T, cols[above], rows[above]] = 0.0  # no coupling between consecutive systems
        ab = cube.reshape(m * n, 2 * nx).T
        diag = ab[-1].reshape(m, n)  # a view: the diagonal of every system
        for j, i in enumerate(todo):
            _, d0, _, shift = requests[i]
            diag[j, :nx] += d0
            if shift:
                diag[j] += shift
        chol, info = dpbtrf(ab, lower=0, overwrite_ab=1)
        if info > 0:  # the leading minor of order `info` is not positive definite: drop its system
            todo.pop((info - 1) // n)
            continue
        if info < 0:
            raise RuntimeError(f"LAPACK dpbtrf: illegal argument {-info} (band ({ab.shape}))")
        rhs = -np.concatenate([requests[i][2] for i in todo])
        d, info = dpbtrs(chol, rhs, lower=0, overwrite_b=1)
        if info != 0:
            raise RuntimeError(f"LAPACK dpbtrs: illegal argument {-info}")
        for j, i in enumerate(todo):
            dj = d[j * n:(j + 1) * n]
            out[i] = dj if np.all(np.isfinite(dj)) else None
        break
    return out


def solve_many(newton: BandedNewton, x0s, objective) -> list[NewtonOutcome]:
    """``newton``'s damped Newton method on B problems from ``x0s`` (B arrays (nx T,)), one `NewtonOutcome` each; the
    ``objective``'s ``newton_many(idx, xs)`` / ``cost_many(idx, xs)`` answer the requests of problems ``idx``."""
    gens = [newton.steps(x0) for x0 in x0s]
    pending: dict[int, tuple] = {}
    outcomes: list[NewtonOutcome | None] = [None] * len(gens)

    def advance(i, value=None, first=False):
        try:
            pending[i] = next(gens[i]) if first else gens[i].send(value)
        except StopIteration as stop:
            outcomes[i] = stop.value
            pending.pop(i, None)

    answer = {NEWTON: objective.newton_many, COST: objective.cost_many,
              DIRECTION: lambda idx, args: stacked_directions(args, newton.nx, newton.T)}
    for i in range(len(gens)):
        advance(i, first=True)
    while pending:
        groups: dict[str, list[int]] = {}
        for i, (kind, _) in pending.items():
            groups.setdefault(kind, []).append(i)
        answers = {}
        for kind, idx in groups.items():  # BandedNewton.steps yields only these three kinds
            answers.update(zip(idx, answer[kind](idx, [pending[i][1] for i in idx])))
        for i, value in answers.items():
            advance(i, value)
    return outcomes
