"""Lorenz attractors of the CE-EM paper (section 4.1).

Single Lorenz: x in R^3, parameters (sigma, rho, beta), y = C x + v with a known C (2, 3).
K coupled Lorenz: x in R^{3K}, dx/dt = lorenz_k(x_k) + H x, y = C x + v with C (3K-2, 3K);
H's 3x3 diagonal blocks are fixed at zero so sigma_k, rho_k, beta_k stay identifiable.
RK4 with dt = 0.04 s; initial states x_{1,k}, x_{2,k} ~ N(-6, 2.5^2), x_{3,k} ~ N(24, 2.5^2).
"""
from __future__ import annotations

import casadi as ca
import numpy as np

import ceem_casadi as cc

TRUE = {"sigma": 10.0, "rho": 28.0, "beta": 8.0 / 3.0}
DT = 0.04
HORIZON = 128
X1_MEAN, X1_STD = np.array([-6.0, -6.0, 24.0]), np.full(3, 2.5)  # initial-state distribution
C_SINGLE = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # observe x1 and x3; x2 hidden


def _lorenz(x, sigma, rho, beta):
    return ca.vertcat(sigma * (x[1] - x[0]), x[0] * (rho - x[2]) - x[1], x[0] * x[1] - beta * x[2])


def lorenz_rhs(x, u, p):
    """Continuous Lorenz vector field dx/dt (3,) with parameters p.sigma, p.rho, p.beta."""
    return _lorenz(x, p.sigma, p.rho, p.beta)


def single_lorenz(C=C_SINGLE, *, process_std=1e-2, measurement_std=1e-2, dt=DT, substeps=1,
                  theta0=None, x1_prior: bool = False) -> cc.StateSpaceModel:
    """Single Lorenz attractor with a known observation matrix C (ny, 3).

    ``x1_prior``: include the data generator's initial-state distribution (X1_MEAN, X1_STD) as
    the prior p(x_1) in J (it also centres the EKF that initialises the states).
    """
    C = np.asarray(C, float)
    theta0 = TRUE if theta0 is None else theta0
    params = cc.Parameters(cc.Param("sigma", theta0["sigma"], lower=0.0),
                           cc.Param("rho", theta0["rho"], lower=0.0),
                           cc.Param("beta", theta0["beta"], lower=0.0))
    return cc.StateSpaceModel.from_ode(lorenz_rhs, lambda x, u, p: C @ x, nx=3, dt=dt, params=params,
                                       substeps=substeps, process_std=process_std,
                                       measurement_std=measurement_std, name="lorenz",
                                       **(dict(x1_mean=X1_MEAN, x1_std=X1_STD) if x1_prior else {}))


def initial_states(batch: int, K: int = 1, seed=0) -> np.ndarray:
    """Initial states (batch, 3K): x1, x2 ~ N(-6, 2.5^2), x3 ~ N(24, 2.5^2) per attractor."""
    rng = np.random.default_rng(seed)
    mean = np.tile([-6.0, -6.0, 24.0], K)
    return mean + 2.5 * rng.standard_normal((batch, 3 * K))


def perturbed(theta: dict, rel: float = 0.1, seed=0, free_masks: dict | None = None) -> dict:
    """Each entry multiplied by a uniform factor in [1 - rel, 1 + rel] (seeded); entries where
    ``free_masks[name]`` is False are kept."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, v in theta.items():
        v = np.asarray(v, float)
        f = 1 + rel * rng.uniform(-1, 1, size=v.shape)
        if free_masks is not None and k in free_masks:
            f = np.where(free_masks[k], f, 1.0)
        out[k] = v * f
    return out


def coupling_mask(K: int) -> np.ndarray:
    """(3K, 3K) boolean mask: True off the 3x3 diagonal blocks (the free entries of H)."""
    mask = np.ones((3 * K, 3 * K), dtype=bool)
    for k in range(K):
        mask[3 * k:3 * k + 3, 3 * k:3 * k + 3] = False
    return mask


def coupled_truth(K: int, seed=0, h_scale: float = 1.0) -> tuple[dict, np.ndarray]:
    """True parameters of K coupled attractors and a full-row-rank C (3K-2, 3K) (seeded).

    sigma, rho, beta at (10, 28, 8/3); H off-diagonal-block entries ~ N(0, h_scale^2);
    C entries ~ N(0, 1), as in the paper.
    """
    rng = np.random.default_rng(seed)
    H = rng.standard_normal((3 * K, 3 * K)) * h_scale * coupling_mask(K)
    C = rng.standard_normal((3 * K - 2, 3 * K))
    theta = {"sigma": np.full(K, TRUE["sigma"]), "rho": np.full(K, TRUE["rho"]),
             "beta": np.full(K, TRUE["beta"]), "H": H}
    return theta, C


def coupled_rhs(K: int):
    """Vector field of K coupled attractors: lorenz_k(x_k) + H x."""
    def rhs(x, u, p):
        parts = [_lorenz(x[3 * k:3 * k + 3], p.sigma[k], p.rho[k], p.beta[k]) for k in range(K)]
        return ca.vertcat(*parts) + p.H @ x
    return rhs


def coupled_lorenz(K: int, C, *, process_std=1e-2, measurement_std=1e-2, dt=DT,
                   theta0=None) -> cc.StateSpaceModel:
    """K coupled Lorenz attractors observed through C (3K-2, 3K)."""
    C = np.asarray(C, float)
    if C.shape != (3 * K - 2, 3 * K):
        raise cc.ShapeError(f"C: expected shape {(3 * K - 2, 3 * K)}, got {C.shape}")
    theta0 = theta0 or {"sigma": np.full(K, 10.0), "rho": np.full(K, 28.0), "beta": np.full(K, 8 / 3),
                        "H": np.zeros((3 * K, 3 * K))}
    params = cc.Parameters(cc.Param("sigma", theta0["sigma"], lower=0.0),
                           cc.Param("rho", theta0["rho"], lower=0.0),
                           cc.Param("beta", theta0["beta"], lower=0.0),
                           cc.Param("H", theta0["H"], free=coupling_mask(K)))
    return cc.StateSpaceModel.from_ode(coupled_rhs(K), lambda x, u, p: C @ x, nx=3 * K, dt=dt,
                                       params=params, process_std=process_std,
                                       measurement_std=measurement_std, name=f"coupled_lorenz_{K}")


def dynamics_error(model, theta: dict, theta_true: dict, n_samples: int = 1000, seed=0) -> float:
    """eps(theta) = E_{x ~ p(x_1)} ||f_theta(x) - f_true(x)||_2 on the continuous vector field
    (Monte Carlo over ``n_samples`` seeded draws of the initial-state distribution)."""
    if model.rhs is None:
        raise ValueError("dynamics_error needs a continuous-time model (from_ode)")
    K = model.nx // 3
    x = initial_states(n_samples, K, seed).T
    u = np.zeros((model.nu, n_samples))
    F = model.rhs.map(n_samples)
    d = np.asarray(F(x, u, model.theta_vector(theta))) - np.asarray(F(x, u, model.theta_vector(theta_true)))
    return float(np.mean(np.linalg.norm(d, axis=0)))
