"""The joint log-density J(x_{1:T}, theta) of the CE-EM paper (with all constants)."""
from __future__ import annotations

import numpy as np

LOG_SQRT_2PI = 0.5 * np.log(2 * np.pi)


def log_normalisers(model, y: np.ndarray) -> float:
    """Sum of the Gaussian log-normalising constants of one trajectory's J (observed entries only)."""
    noise = model.noise
    T = y.shape[0]
    n_obs = np.isfinite(y).sum(axis=0)
    c = -(n_obs * (LOG_SQRT_2PI + np.log(noise.measurement_std))).sum()
    c -= (T - 1) * (LOG_SQRT_2PI + np.log(noise.process_std)).sum()
    if noise.x1_std is not None:
        c -= (LOG_SQRT_2PI + np.log(noise.x1_std)).sum()
    return float(c)


def joint_log_density(smoother, theta_vec, data, xs) -> float:
    """The joint log-density J(x_{1:T}, theta) with all constants: `Smoother.joint_log_density`.

    Parameters
    ----------
    smoother : Smoother
        A smoother of the model (its cost Functions are reused).
    theta_vec, data, xs
        As for [`Smoother.joint_log_density`][ceem_casadi.smoothing.Smoother.joint_log_density].

    Returns
    -------
    float
        ``log p(x_1) + sum log p_v(y - g) + sum log p_w(x' - f)`` summed over trajectories.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from ceem_casadi.objective import joint_log_density
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> sm = cc.smoothing.Smoother(model, cc.SmootherOptions(compile=False))
    >>> data, xs = cc.Trajectories([np.zeros((5, 1))], [np.zeros((5, 1))]), [np.zeros((5, 1))]  # all residuals zero
    >>> bool(joint_log_density(sm, np.array([0.5]), data, xs) == sm.joint_log_density(np.array([0.5]), data, xs))
    True
    """
    return smoother.joint_log_density(theta_vec, data, xs)


def log_prior(params, theta_vec) -> float:
    """log p(theta) of the parameters' Gaussian priors (0 where none is declared)."""
    mean, w = params.prior
    has = w > 0
    if not has.any():
        return 0.0
    z = (np.asarray(theta_vec)[has] - mean[has]) * w[has]
    return float(-0.5 * z @ z - has.sum() * LOG_SQRT_2PI + np.log(w[has]).sum())
