"""NL model of the helicopter experiment (paper §4.2): linear hidden dynamics, MLP observation head.

    x[t+1] = A x[t] + B u[t]
    y~[t]  = C x[t] + D u[t] + MLP([x[t]; u[t]])       (MLP: nx+nu -> 32 -> 32 -> ny, tanh)

``y~`` is the residual of the naive model. nx = 10, nu = 10, ny = 6 as in the paper; the noise
standard deviations default to sigma_w = sigma_v = 1 (the paper's CE-EM hyperparameters).
With the head's output layer at zero the model equals the linear SID model, which is how the
SID baseline is evaluated and how CE-EM is warm-started.
"""
from __future__ import annotations

import casadi as ca
import numpy as np

from ceem_casadi.model import MLP, Param, Parameters, StateSpaceModel

__all__ = ["batch_functions", "heli_model", "linear_theta"]


def batch_functions(head: MLP):
    """``(step, observe)`` of the NL model for samples as columns: X (nx, B), U (nu, B) and the
    parameter namespace ``p`` -> (nx, B) / (ny, B). The same functions define the model (one
    column); `ceem_casadi.learning.AdamLearner` takes them as matrix-valued
    expressions (28x faster per mini-batch gradient than ``model.g.map``)."""
    def step(x, u, p):
        return ca.mtimes(p.A, x) + ca.mtimes(p.B, u)

    def observe(x, u, p):
        return ca.mtimes(p.C, x) + ca.mtimes(p.D, u) + head(p, ca.vertcat(x, u))

    return step, observe


def heli_model(nx: int = 10, nu: int = 10, ny: int = 6, hidden=(32, 32), *, seed: int = 0,
               sigma_w: float = 1.0, sigma_v: float = 1.0, head_scale: float = 0.0):
    """``(model, theta0, head)``: the NL model with A = 0.9 I, B, C, D = 0 and a Glorot head.

    ``head_scale`` multiplies the head's output layer at initialisation (0: model is linear).
    """
    head = MLP((nx + nu, *hidden, ny), name="head")
    rng = np.random.default_rng(seed)
    params = Parameters(Param("A", 0.9 * np.eye(nx)), Param("B", np.zeros((nx, nu))),
                        Param("C", np.zeros((ny, nx))), Param("D", np.zeros((ny, nu))),
                        *head.params(rng, last_scale=head_scale))

    step, observe = batch_functions(head)
    model = StateSpaceModel.from_discrete(step, observe, nx=nx, nu=nu, params=params, dt=0.02,
                                          process_std=sigma_w, measurement_std=sigma_v, name="heli_nl")
    theta0 = {q.name: q.array("value") for q in params}
    return model, theta0, head


def linear_theta(theta0: dict, A, B, C, D) -> dict:
    """``theta0`` with the linear matrices replaced (e.g. by an N4SID fit); the head is kept."""
    theta = {k: np.array(v, float) for k, v in theta0.items()}
    for k, v in (("A", A), ("B", B), ("C", C), ("D", D)):
        if np.shape(v) != theta[k].shape:
            raise ValueError(f"{k}: expected shape {theta[k].shape}, got {np.shape(v)}")
        theta[k] = np.array(v, float)
    return theta
