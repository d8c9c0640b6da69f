"""Independent oracles shared by several test modules (written from the paper's formulas, not
from the library's stage Functions)."""
from __future__ import annotations

import numpy as np


def weighted_residuals(model, data, X, p) -> list:
    """Every weighted residual row of -J, trajectory by trajectory, in time order: observation
    ``mask * (y_t - g(x_t)) / sigma_v``, dynamics ``(x_{t+1} - f(x_t)) / sigma_w`` and the first
    state's prior ``(x_1 - mu_1) / s_1`` (no inputs).

    Parameters
    ----------
    model : StateSpaceModel
    data : Trajectories
        NaN = missing (entry-wise).
    X : list of casadi.SX
        (nx, T_b) symbolic states of each trajectory.
    p : casadi.SX
        (n_p,) parameters (symbolic, or partly fixed).
    """
    iv, iw = 1 / model.noise.measurement_std, 1 / model.noise.process_std
    res = []
    for Xb, y in zip(X, data.y):
        for t in range(y.shape[0]):
            m = np.isfinite(y[t])
            res.append(m * iv * (np.where(m, y[t], 0) - model.g(Xb[:, t], [], p)))
            if t + 1 < y.shape[0]:
                res.append(iw * (Xb[:, t + 1] - model.f(Xb[:, t], [], p)))
        res.append((Xb[:, 0] - model.noise.x1_mean) / model.noise.x1_std)
    return res


def _cov(value, n: int) -> np.ndarray:
    v = np.asarray(value, float)
    return v * np.eye(n) if v.ndim == 0 else (np.diag(v) if v.ndim == 1 else v)


def dense_moments(A, C, Q, R, T: int, u=None, *, B=None, D=None, x0, Sigma0):
    """Mean (T*ny,) and covariance (T*ny, T*ny) of the stacked observations ``[y_1; ...; y_T]``.

    A brute-force O((T nx)^2) construction, independent of the filter recursions (test oracle;
    moved here from ``filtering/_kalman.py``). Also returns the state moments
    ``(mx (T*nx,), Pxx (T*nx, T*nx))``. ``Q``, ``R``, ``Sigma0``: scalar (times I), diagonal or matrix.
    """
    A = np.atleast_2d(np.asarray(A, float))
    nx = A.shape[0]
    C = np.atleast_2d(np.asarray(C, float))
    ny = C.shape[0]
    u = np.zeros((T, 0)) if u is None else np.asarray(u, float)
    nu = u.shape[1]
    B = np.zeros((nx, nu)) if B is None else np.asarray(B, float)
    D = np.zeros((ny, nu)) if D is None else np.asarray(D, float)
    Q, R, S0 = _cov(Q, nx), _cov(R, ny), _cov(Sigma0, nx)
    # x = M e + c with e = [x1 - x0; w_1; ...; w_{T-1}] ~ N(0, blkdiag(Sigma0, Q, ..., Q))
    M = np.zeros((T * nx, T * nx))
    c = np.zeros(T * nx)
    c[:nx] = np.asarray(x0, float).ravel()
    M[:nx, :nx] = np.eye(nx)
    for t in range(1, T):
        rows, prev = slice(t * nx, (t + 1) * nx), slice((t - 1) * nx, t * nx)
        M[rows] = A @ M[prev]
        M[rows, rows] += np.eye(nx)
        c[rows] = A @ c[prev] + B @ u[t - 1]
    cov_e = np.kron(np.eye(T), Q)
    cov_e[:nx, :nx] = S0
    Pxx = M @ cov_e @ M.T
    Cb = np.kron(np.eye(T), C)
    my = Cb @ c + (u @ D.T).ravel()
    Pyy = Cb @ Pxx @ Cb.T + np.kron(np.eye(T), R)
    return my, Pyy, c, Pxx
