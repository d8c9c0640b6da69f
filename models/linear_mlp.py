"""A 10-state linear + MLP test model (codegen tests and benchmarks).

    x[t+1] = A x[t] + B u[t] + W2 tanh(W1 x[t] + b1),    y[t] = C x[t]

A is a random orthogonal matrix scaled by 0.9 (stable); C is fixed (not a parameter).
"""
from __future__ import annotations

import casadi as ca
import numpy as np

import ceem_casadi as cc

__all__ = ["linear_mlp_model"]


def linear_mlp_model(nx: int = 10, nu: int = 2, ny: int = 4, hidden: int = 16, seed: int = 0):
    """``(model, theta)``: the model with seeded random parameters (its initial values)."""
    rng = np.random.default_rng(seed)
    A = 0.9 * np.linalg.qr(rng.standard_normal((nx, nx)))[0]
    params = cc.Parameters(
        cc.Param("A", A), cc.Param("B", 0.3 * rng.standard_normal((nx, nu))),
        cc.Param("W1", rng.standard_normal((hidden, nx)) / np.sqrt(nx)),
        cc.Param("b1", 0.1 * rng.standard_normal(hidden)),
        cc.Param("W2", 0.1 * rng.standard_normal((nx, hidden)) / np.sqrt(hidden)))
    C = rng.standard_normal((ny, nx))

    def step(x, u, p):
        return p.A @ x + p.B @ u + p.W2 @ ca.tanh(p.W1 @ x + p.b1)

    model = cc.StateSpaceModel.from_discrete(step, lambda x, u, p: C @ x, nx=nx, nu=nu, params=params,
                                             process_std=0.05, measurement_std=0.1, name="linear_mlp")
    return model, model.params.initial()
