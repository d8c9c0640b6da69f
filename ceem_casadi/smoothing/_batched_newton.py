"""Many banded Newton solves at once (`BandedNewton.steps` run side by side): one evaluation and one
LAPACK call per round for all of them, the outcomes those of separate solves (docs/algorithms.md,
"Many short trajectories together").
"""
from __future__ import annotations

import numpy as np
from scipy.linalg.lapack import dpbtrf, dpbtrs

from ._banded import COST, DIRECTION, NEWTON, BandedNewton, NewtonOutcome, band_patterns


def stacked_directions(requests, nx: int, T: int) -> list[np.ndarray | None]:
    """Newton directions ``d`` (nx T,) of m block-tridiagonal systems ``(H + shift I) d = -g`` by one banded
    Cholesky factorisation; ``requests``: m ``(nz, d0, g, shift)`` as ``BandedNewton.steps`` yields with
    ``DIRECTION``. None where a system is not positive definite or d not finite (that system is dropped and
    the others factorised again).

    Examples
    --------
    >>> import numpy as np
    >>> nz = np.tile([0.0, 2.0], (3, 1))            # nx = 1, T = 3: H = 2 I (no coupling)
    >>> [np.round(d, 12).tolist() for d in stacked_directions([(nz, np.zeros(1), np.ones(3), 0.0)] * 2, 1, 3)]
    [[-0.5, -0.5, -0.5], [-0.5, -0.5, -0.5]]
    """
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
    """``newton``'s damped Newton method on B problems from ``x0s`` (B arrays (nx T,)), one `NewtonOutcome`
    each: ``objective.newton_many(idx, xs)`` and ``cost_many(idx, xs)`` answer the ``NEWTON`` and ``COST``
    requests of the problems ``idx`` in one evaluation (e.g. `BatchObjective`); docs/algorithms.md.

    Examples
    --------
    >>> import numpy as np
    >>> class Quadratic:  # f_b(x) = sum (x - b)^2 over T = 4 scalar blocks
    ...     def cost_many(self, idx, xs):
    ...         return [float(np.sum((x - b) ** 2)) for b, x in zip(idx, xs)]
    ...     def newton_many(self, idx, xs):
    ...         nz = np.tile([0.0, 2.0], (4, 1))
    ...         return [(c, 2 * (x - b), nz, np.zeros(1)) for c, b, x in zip(self.cost_many(idx, xs), idx, xs)]
    >>> out = solve_many(BandedNewton(1, 4, 10, 1e-10), [np.zeros(4)] * 3, Quadratic())
    >>> [(o.status, o.iterations, np.round(o.x, 12).tolist()) for o in out][2]
    ('Solve_Succeeded', 1, [2.0, 2.0, 2.0, 2.0])
    """
    gens = [newton.steps(x0) for x0 in x0s]
    pending: dict[int, tuple] = {}
    outcomes: list[NewtonOutcome | None] = [None] * len(gens)

    def advance(i, value=None, first=False):
        try:
            pending[i] = next(gens[i]) if first else gens[i].send(value)
        except StopIteration as stop:
            outcomes[i] = stop.value
            pending.pop(i, None)

    for i in range(len(gens)):
        advance(i, first=True)
    while pending:
        groups: dict[str, list[int]] = {}
        for i, (kind, _) in pending.items():
            groups.setdefault(kind, []).append(i)
        answers = {}
        for kind, idx in groups.items():
            args = [pending[i][1] for i in idx]
            if kind == NEWTON:
                res = objective.newton_many(idx, args)
            elif kind == COST:
                res = objective.cost_many(idx, args)
            elif kind == DIRECTION:
                res = stacked_directions(args, newton.nx, newton.T)
            else:  # pragma: no cover - BandedNewton.steps yields only these three
                raise RuntimeError(f"unknown request {kind!r}")
            answers.update(zip(idx, res))
        for i, value in answers.items():
            advance(i, value)
    return outcomes
