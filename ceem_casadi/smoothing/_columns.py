"""The smoother's Gauss-Newton observation terms of many stages at once from a matrix-valued observation map,
evaluated by numpy (the derivation and its measured speed: docs/algorithms.md)."""
from __future__ import annotations

import casadi as ca
import numpy as np

from ..runtime._numpy_eval import NumpyFunction

__all__ = ["ObservationColumns"]


class ObservationColumns:
    """Gauss-Newton observation terms of N stages by one numpy evaluation (docs/algorithms.md).

    Parameters
    ----------
    model : StateSpaceModel
    observe : callable
        ``observe(X (nx, N), U (nu, N), p) -> (ny, N)``, column by column equal to ``model.g``
        (checked by the caller with `ceem_casadi.model.check_columnwise`).
    N : int
        Stages per evaluation.

    Raises
    ------
    NotImplementedError
        ``observe`` uses an operation numpy does not replay (the caller then keeps the
        compiled scalar stage programs).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from ceem_casadi.smoothing import ObservationColumns
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: x, lambda x, u, p: x[0] * x[1], nx=2)
    >>> oc = ObservationColumns(model, lambda X, U, p: X[0, :] * X[1, :], 3)
    >>> X, Y = np.array([[1.0, 2.0, 0.0], [3.0, 1.0, 1.0]]), np.array([[2.0, 2.0, 1.0]])
    >>> c, g, h = oc.newton(X, np.zeros((0, 3)), Y, np.ones((1, 3)), np.zeros(0), np.ones(1))
    >>> c.tolist(), g[:, 0].tolist()           # r = y - x0 x1 = -1, J = -(x1, x0) = -(3, 1)
    ([0.5, 0.0, 0.5], [3.0, 1.0])
    """

    def __init__(self, model, observe, N: int):
        nx, nu, ny = model.nx, model.nu, model.ny
        X, U = ca.MX.sym("X", nx, N), ca.MX.sym("U", nu, N)
        Y, M = ca.MX.sym("Y", ny, N), ca.MX.sym("M", ny, N)
        p, iv = ca.MX.sym("p", model.params.size), ca.MX.sym("iv", ny)
        R = M * ca.repmat(iv, 1, N) * (Y - observe(X, U, model.params.symbols(p)))
        rows = []
        for k in range(ny):
            E = np.zeros((ny, N))
            E[k, :] = 1.0
            rows.append(ca.jtimes(R, X, ca.DM(E), True))      # row k of every J_t, as (nx, N)
        ins = [X, U, Y, M, p, iv]
        self.nx, self.ny, self.N = nx, ny, N
        self._terms = NumpyFunction(ca.Function("obs_columns_newton", ins, [R, *rows]))
        self._residual = NumpyFunction(ca.Function("obs_columns_residual", ins, [R]))

    def newton(self, X, U, Y, M, p, iv) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(cost (N,), g (nx, N), h (nx, nx N))`` at the columns: the stage costs, gradients
        and the upper triangles of the Gauss-Newton Hessians (zeros below), stage t's in
        columns ``t nx .. t nx + nx - 1`` (the layout of the mapped ``obs_x_newton``)."""
        R, *rows = self._terms(X, U, Y, M, p, iv)
        J = np.stack(rows)                                   # (ny, nx, N): J[k, :, t] = row k of J_t
        cost = 0.5 * np.einsum("kt,kt->t", R, R)
        g = np.einsum("kit,kt->it", J, R)
        H = np.triu(np.einsum("kit,kjt->tij", J, J))         # (N, nx, nx)
        return cost, g, H.transpose(1, 0, 2).reshape(self.nx, self.N * self.nx)

    def cost(self, X, U, Y, M, p, iv) -> np.ndarray:
        """The stage costs (N,) at the columns (forward only)."""
        (R,) = self._residual(X, U, Y, M, p, iv)
        return 0.5 * np.einsum("kt,kt->t", R, R)
