"""The structure of the smoothing problem shared by its solvers: the block-tridiagonal sparsity of
its Hessian, the Functions that give one block column of it, and the result of one solve."""
from __future__ import annotations

from dataclasses import dataclass

import casadi as ca
import numpy as np

from ..runtime._result import Result
from ..runtime._solve import ACCEPTABLE


@dataclass(repr=False)
class SmoothResult(Result):
    """Outcome of smoothing one trajectory.

    Attributes
    ----------
    x : numpy.ndarray
        (T, nx) smoothed states.
    cost : float
        Final objective: -J without its constants, trust-region term included.
    status : str
        Return status (IPOPT's, or the banded Newton solver's, which uses IPOPT's names).
    success : bool
        An acceptable status and finite states.
    iterations : int
        IPOPT iterations or Newton steps.
    wall_s : float
        Wall-clock seconds of the solve.

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.smoothing import SmoothResult
    >>> res = SmoothResult.of(np.zeros((30, 1)), 0.5, "Solve_Succeeded", 4, 0.01)
    >>> res.x.shape, res.success, SmoothResult.of(np.full((30, 1), np.nan), 0.5, "Solve_Succeeded", 4, 0.01).success
    ((30, 1), True, False)
    """

    SUMMARY = ('status', 'iterations', 'cost')

    x: np.ndarray
    cost: float
    status: str
    success: bool
    iterations: int
    wall_s: float

    @classmethod
    def of(cls, x, cost, status: str, iterations: int, wall_s: float) -> SmoothResult:
        """The result of states ``x`` (T, nx): ``success`` when ``status`` is acceptable and ``x`` finite."""
        return cls(x, float(cost), status, status in ACCEPTABLE and bool(np.all(np.isfinite(x))), int(iterations),
                   wall_s)


def block_tridiagonal_upper(nx: int, T: int) -> ca.Sparsity:
    """Sparsity of the upper triangle of a block-tridiagonal (nx T)^2 matrix of (nx, nx) blocks: column
    ``t nx + j`` holds the block above's nx rows, then rows ``t nx .. t nx + j`` (`band_column_functions`' order)."""
    if T == 1:
        return ca.Sparsity.upper(nx)
    diag = ca.kron(ca.DM(ca.Sparsity.diag(T), 1), ca.DM(ca.Sparsity.upper(nx), 1)).sparsity()
    above = ca.kron(ca.DM(ca.Sparsity.band(T, -1), 1), ca.DM(ca.Sparsity.dense(nx, nx), 1)).sparsity()
    return diag.unite(above)


def band_column_functions(nx: int) -> tuple[ca.Function, ca.Function]:
    """``(first, column)``: SX Functions of one block column's nonzeros of the smoothing Hessian's upper triangle
    (`block_tridiagonal_upper` order). ``column(ho, hd_prev, hd_next, d)`` (``first`` without hd_prev, for t = 0):
    diagonal block ``ho + hd_next[:nx, :nx] + hd_prev[nx:, nx:] + diag(d)``, block above ``hd_prev[:nx, nx:]``,
    from the observation stage Hessian ho (nx, nx) and the dynamics stage Hessians (2nx, 2nx) around t."""
    n = nx
    ho, d = ca.SX.sym("ho", n, n), ca.SX.sym("d", n)
    hp, hn = ca.SX.sym("hd_prev", 2 * n, 2 * n), ca.SX.sym("hd_next", 2 * n, 2 * n)
    D = ho + hn[:n, :n] + hp[n:, n:] + ca.diag(d)
    above = hp[:n, n:]
    col = [e for j in range(n) for e in [above[i, j] for i in range(n)] + [D[i, j] for i in range(j + 1)]]
    D0 = ho + hn[:n, :n] + ca.diag(d)
    first = ca.Function("band_first", [ho, hn, d], [ca.vertcat(*[D0[i, j] for j in range(n) for i in range(j + 1)])])
    return first, ca.Function("band_column", [ho, hp, hn, d], [ca.vertcat(*col)])
