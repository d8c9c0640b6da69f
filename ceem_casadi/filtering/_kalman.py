"""Linear Kalman filter and Rauch-Tung-Striebel smoother, ``x+ = A x + B u + w``, ``y = C x + D u + v``
(the reference the EKF is tested against; the EKF's conventions, docs/model_learning_notes.md)."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ._result import FilterResult, as_cov


def _matrix(name: str, value, shape) -> np.ndarray:
    a = np.asarray(value, dtype=float)
    if a.shape != shape:
        raise ShapeError(f"{name}: expected shape {shape}, got {a.shape}")
    return a


def forward(y, x, P, Q, R, observe, advance, linear: bool = False) -> FilterResult:
    """The forward pass over ``y`` (T, ny) from ``x_{1|0} = x`` (nx,), ``P_{1|0} = P`` (nx, nx), with
    ``observe(t, x) -> (y_pred, C)`` and ``advance(t, x) -> (x_next, A)``; ``linear``: the linear filter
    (S symmetrised, no Jacobians kept). Conventions: docs/model_learning_notes.md."""
    T, ny, nx = y.shape[0], y.shape[1], x.size
    shapes = dict(y_pred=(T, ny), S=(T, ny, ny), x_pred=(T, nx), P_pred=(T, nx, nx), x_filt=(T, nx),
                  P_filt=(T, nx, nx), A=(0 if linear else max(T - 1, 0), nx, nx))
    out = {k: np.empty(shape) for k, shape in shapes.items()}
    loglik, eye = 0.0, np.eye(nx)
    for t in range(T):
        out["x_pred"][t], out["P_pred"][t] = x, P
        yp, C = observe(t, x)
        S = C @ P @ C.T + R
        out["y_pred"][t], out["S"][t] = yp, (0.5 * (S + S.T) if linear else S)
        obs = np.isfinite(y[t])
        if obs.any():
            Co, Ro, e = C[obs], R[np.ix_(obs, obs)], y[t, obs] - yp[obs]
            So = Co @ P @ Co.T + Ro if linear else S[np.ix_(obs, obs)]
            L = np.linalg.cholesky(0.5 * (So + So.T) if linear else So)
            K = np.linalg.solve(L.T, np.linalg.solve(L, Co @ P)).T  # P C^T S^-1
            x = x + K @ e
            IKC = eye - K @ Co
            P = IKC @ P @ IKC.T + K @ Ro @ K.T
            P = 0.5 * (P + P.T)
            alpha = np.linalg.solve(L, e)
            loglik += -0.5 * (alpha @ alpha) - np.log(np.diag(L)).sum() - 0.5 * obs.sum() * np.log(2 * np.pi)
        out["x_filt"][t], out["P_filt"][t] = x, P
        if t < T - 1:
            x, A = advance(t, x)
            P = A @ P @ A.T + Q
            P = 0.5 * (P + P.T)
            if not linear:
                out["A"][t] = A
    return FilterResult(loglik=float(loglik), **{**out, "A": None if linear else out["A"]})


def kalman_filter(A, C, Q, R, y, u=None, *, B=None, D=None, x0, Sigma0,
                  smooth: bool = False) -> FilterResult:
    """Kalman filter (and optionally the RTS smoother) for one trajectory.

    Parameters
    ----------
    A, C, B, D : numpy.ndarray
        (nx, nx), (ny, nx), (nx, nu) and (ny, nu) matrices (B, D default zero).
    Q, R : float or numpy.ndarray
        Process and measurement noise covariances (scalars and diagonals allowed).
    y, u : numpy.ndarray
        (T, ny) observations, NaN = missing (entry-wise); (T, nu) inputs (optional).
    x0, Sigma0 : numpy.ndarray
        (nx,) prior mean and covariance (scalar, diagonal or (nx, nx)) of x[1].
    smooth : bool
        Also run the RTS backward pass.

    Returns
    -------
    FilterResult
        Without Jacobians (``A`` is None).

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.filtering import kalman_filter
    >>> y = np.array([[1.0], [1.1], [0.9], [1.0]])
    >>> res = kalman_filter(1.0, 1.0, 0.01, 0.1, y, x0=[0.0], Sigma0=10.0)       # a random walk seen in noise
    >>> res.x_filt.shape, bool(abs(res.x_filt[-1, 0] - 1.0) < 0.1)
    ((4, 1), True)
    """
    A, C = np.atleast_2d(np.asarray(A, float)), np.atleast_2d(np.asarray(C, float))
    nx, ny = A.shape[0], C.shape[0]
    A, C = _matrix("A", A, (nx, nx)), _matrix("C", C, (ny, nx))
    y = np.asarray(y, float)
    if y.ndim != 2 or y.shape[1] != ny:
        raise ShapeError(f"y: expected shape (T, {ny}), got {y.shape}")
    T = y.shape[0]
    u = np.zeros((T, 0)) if u is None else np.asarray(u, float)
    if u.ndim != 2 or u.shape[0] != T:
        raise ShapeError(f"u: expected shape ({T}, nu), got {u.shape}")
    nu = u.shape[1]
    B = np.zeros((nx, nu)) if B is None else _matrix("B", B, (nx, nu))
    D = np.zeros((ny, nu)) if D is None else _matrix("D", D, (ny, nu))
    Q, R, P = as_cov("Q", Q, nx), as_cov("R", R, ny), as_cov("Sigma0", Sigma0, nx)
    x = _matrix("x0", np.asarray(x0, float).ravel(), (nx,)).copy()
    res = forward(y, x, P, Q, R, lambda t, x: (C @ x + D @ u[t], C), lambda t, x: (A @ x + B @ u[t], A), linear=True)
    if smooth:
        rts_smoother(res, A)
    return res


def rts_smoother(res: FilterResult, A=None) -> FilterResult:
    """Rauch-Tung-Striebel backward pass on a filtered result (in place; also returned):
    ``G_t = P_{t|t} A_t^T P_{t+1|t}^{-1}``, ``x_{t|T} = x_{t|t} + G_t (x_{t+1|T} - x_{t+1|t})``,
    ``P_{t|T} = P_{t|t} + G_t (P_{t+1|T} - P_{t+1|t}) G_t^T``.

    Parameters
    ----------
    res : FilterResult
        A filtered result of [`kalman_filter`][ceem_casadi.filtering.kalman_filter] or of the EKF.
    A : numpy.ndarray, optional
        (nx, nx) dynamics matrix or a (T-1, nx, nx) stack; None takes the EKF's Jacobians ``res.A``.

    Returns
    -------
    FilterResult
        ``res`` with ``x_smooth`` (T, nx) and ``P_smooth`` (T, nx, nx) set.

    Raises
    ------
    ValueError
        ``A`` is None and ``res`` holds no Jacobians.

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.filtering import kalman_filter, rts_smoother
    >>> res = kalman_filter(1.0, 1.0, 0.01, 0.1, np.ones((5, 1)), x0=[0.0], Sigma0=10.0)
    >>> rts_smoother(res, A=np.ones((4, 1, 1))).x_smooth.shape        # A_t of the T - 1 transitions
    (5, 1)
    """
    T = res.x_filt.shape[0]
    if A is None and res.A is None:
        raise ValueError("rts_smoother: give the dynamics matrix A (this result holds no Jacobians)")
    A = np.asarray(res.A if A is None else A, float)
    As = np.broadcast_to(A, (max(T - 1, 0),) + A.shape[-2:]) if A.ndim == 2 else A
    xs, Ps = res.x_filt.copy(), res.P_filt.copy()
    for t in range(T - 2, -1, -1):
        Pp = res.P_pred[t + 1]
        G = np.linalg.solve(Pp, As[t] @ res.P_filt[t]).T
        xs[t] = res.x_filt[t] + G @ (xs[t + 1] - res.x_pred[t + 1])
        Ps[t] = res.P_filt[t] + G @ (Ps[t + 1] - Pp) @ G.T
        Ps[t] = 0.5 * (Ps[t] + Ps[t].T)
    res.x_smooth, res.P_smooth = xs, Ps
    return res
