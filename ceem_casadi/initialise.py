"""Initial state trajectories for CE-EM.

CE-EM is a local method: from a poor state trajectory (e.g. unobserved directions set to zero)
the smoothing step reaches a poor local optimum. The default initialisation runs an extended
Kalman filter and RTS smoother with the initial parameters.
"""
from __future__ import annotations

import numpy as np

from .baselines.ekf import EKF
from .errors import ShapeError


def eks_states(model, theta_vec, data, *, x0=None, Sigma0=None, Q=None, R=None) -> list[np.ndarray]:
    """EKF + RTS smoothed means (T_b, nx) of every trajectory.

    Defaults: ``x0`` = the model's ``x1_mean`` (else zeros), ``Sigma0`` = ``x1_std**2`` (else
    100 I), ``Q = diag(process_std**2)`` floored at 1e-4 per unit of dt (so that a nearly
    deterministic model with slightly wrong parameters still tracks the data),
    ``R = diag(measurement_std**2)``.
    """
    noise, nx = model.noise, model.nx
    x0 = (noise.x1_mean if noise.x1_mean is not None else np.zeros(nx)) if x0 is None else np.asarray(x0, float)
    if Sigma0 is None:
        Sigma0 = noise.x1_std ** 2 if noise.x1_std is not None else 100.0 * np.ones(nx)
    if Q is None:
        Q = np.maximum(noise.process_std ** 2, 1e-4)
    if R is None:
        R = noise.measurement_std ** 2
    ekf = EKF(model)
    out = []
    for b, y in enumerate(data.y):
        res = ekf.run(theta_vec, y, data.inputs(b), x0=x0, Sigma0=Sigma0, Q=Q, R=R, smooth=True)
        out.append(res.x_smooth)
    return out


def check_states(model, data, xs) -> list[np.ndarray]:
    """Validate user-given state trajectories: one (T_b, nx) finite array per trajectory."""
    if len(xs) != len(data):
        raise ShapeError(f"x_init: expected {len(data)} state trajectories, got {len(xs)}")
    out = []
    for b, (x, T) in enumerate(zip(xs, data.lengths)):
        x = np.asarray(x, float)
        if x.shape != (T, model.nx):
            raise ShapeError(f"x_init[{b}]: expected shape {(T, model.nx)}, got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ShapeError(f"x_init[{b}] contains NaN or inf")
        out.append(x.copy())
    return out
