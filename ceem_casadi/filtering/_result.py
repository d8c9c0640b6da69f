"""The result type shared by the Kalman filter and the EKF, and the covariance helper."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError


@dataclass
class FilterResult:
    """Per-step outputs of a Kalman filter or EKF pass over one trajectory of T steps.

    Attributes
    ----------
    y_pred : numpy.ndarray
        (T, ny) one-step-ahead predicted observations, recorded before the correction.
    S : numpy.ndarray
        (T, ny, ny) covariances of ``y_pred``.
    x_pred, P_pred : numpy.ndarray
        (T, nx) and (T, nx, nx): ``x_{t|t-1}`` and ``P_{t|t-1}``.
    x_filt, P_filt : numpy.ndarray
        (T, nx) and (T, nx, nx): ``x_{t|t}`` and ``P_{t|t}``.
    loglik : float
        ``log p(y_{1:T})`` over the observed (non-NaN) entries.
    A : numpy.ndarray or None
        (T-1, nx, nx) dynamics Jacobians used in the predictions (EKF), or None (linear filter).
    x_smooth, P_smooth : numpy.ndarray or None
        (T, nx) and (T, nx, nx) Rauch-Tung-Striebel smoothed moments, None unless smoothed.

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.filtering import kalman_filter
    >>> res = kalman_filter(0.9, 1.0, 0.1, 0.1, np.zeros((3, 1)), x0=[0.0], Sigma0=1.0)
    >>> res.y_pred.shape, res.S.shape, float(res.loglik) < 0
    ((3, 1), (3, 1, 1), True)
    """

    y_pred: np.ndarray
    S: np.ndarray
    x_pred: np.ndarray
    P_pred: np.ndarray
    x_filt: np.ndarray
    P_filt: np.ndarray
    loglik: float
    A: np.ndarray | None = None
    x_smooth: np.ndarray | None = None
    P_smooth: np.ndarray | None = None


def as_cov(name: str, value, n: int) -> np.ndarray:
    """A covariance matrix from a scalar (times the identity), an (n,) diagonal or an (n, n) matrix.

    Parameters
    ----------
    name : str
        Named in the error message (e.g. ``"Q"``).
    value : float or array_like
    n : int

    Returns
    -------
    numpy.ndarray
        (n, n) float matrix.

    Raises
    ------
    ShapeError
        Another shape, or not finite numbers.

    Examples
    --------
    >>> from ceem_casadi.filtering import as_cov
    >>> as_cov("Q", 0.5, 2)
    array([[0.5, 0. ],
           [0. , 0.5]])
    """
    if any(isinstance(v, (str, bytes, bool, np.bool_)) for v in np.ravel(np.asarray(value, dtype=object))):
        raise ShapeError(f"{name}: expected numbers (a covariance), got {value!r}")
    a = np.asarray(value, dtype=float)
    if not np.all(np.isfinite(a)):
        raise ShapeError(f"{name}: expected a finite covariance, got NaN or inf")
    if a.ndim == 0:
        a = a * np.eye(n)
    elif a.ndim == 1 and a.shape == (n,):
        a = np.diag(a)
    if a.shape != (n, n):
        raise ShapeError(f"{name}: expected a scalar, ({n},) diagonal or ({n}, {n}) matrix, got {a.shape}")
    return a


def ekf_settings(model, x0=None, P0=None, Q=None, R=None) -> tuple:
    """``(x0, P0, Q, R)`` of the EKF predictor of ``model``: the given ones, else ``x1_mean`` (else zeros (nx,)),
    ``x1_std**2`` (else ``process_std**2``), ``process_std**2`` and ``measurement_std**2`` of its noise."""
    noise = model.noise
    x0 = (noise.x1_mean if noise.x1_mean is not None else np.zeros(model.nx)) if x0 is None else x0
    P0 = (noise.x1_std if noise.x1_std is not None else noise.process_std) ** 2 if P0 is None else P0
    return x0, P0, noise.process_std ** 2 if Q is None else Q, noise.measurement_std ** 2 if R is None else R
