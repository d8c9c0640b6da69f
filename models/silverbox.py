"""Silverbox (Wigren and Schoukens 2013): an electronic forced Duffing oscillator.

Continuous time, states x = (y, v) with y the output voltage (V) and v = (dy/dt) / w0 (V):

    dy/dt = w0 v
    dv/dt = w0 (-(y - y0) - 2 zeta v - [k2 (y - y0)^2] - k3 (y - y0)^3 + g u)

i.e. a mass-spring-damper with cubic stiffness driven by the input voltage u (V): natural
frequency w0 (rad/s; the parameter ``w0_100`` is w0 / 100 for scaling), damping ratio ``zeta``,
cubic stiffness ``k3`` (1/V^2), static gain ``g`` (V/V), output offset ``y0`` (V). Observation:
``y + c_v v + d_u u [+ c_y2 (y - y0)^2]``. The bracketed quadratic terms (stiffness ``k2``, 1/V,
and output ``c_y2``, 1/V) exist with ``quadratic=True`` only. RK4 at the sample time 2^14 / 1e7 s
with ``substeps`` steps per sample (w0 dt ~ 0.6).
"""
from __future__ import annotations

import casadi as ca
import numpy as np

import ceem_casadi as cc
from ceem_casadi.model import MLP

DT = 2 ** 14 / 1e7  # s
NAMES = ("w0_100", "zeta", "k3", "g", "y0", "c_v", "d_u")
QUADRATIC_NAMES = ("k2", "c_y2")


def silverbox_rhs(x, u, p, correction: MLP | None = None):
    """dx/dt (2,) of the Duffing oscillator (see the module docstring); ``correction`` adds
    ``w0 * MLP([y - y0; v; u])`` to dv/dt (a small learned force term)."""
    w0 = 100.0 * p.w0_100
    e = x[0] - p.y0
    force = -e - 2 * p.zeta * x[1] - p.k3 * e ** 3 + p.g * u[0]
    if hasattr(p, "k2"):
        force = force - p.k2 * e ** 2
    if correction is not None:
        force = force + correction(p, ca.vertcat(e, x[1], u[0]))
    return ca.vertcat(w0 * x[1], w0 * force)


def silverbox_observe(x, u, p):
    """Measured output (V): the position plus a small velocity term and input feedthrough (the
    measurement chain's zero; c_v = d_u = 0 is the plain Duffing oscillator)."""
    y = x[0] + p.c_v * x[1] + p.d_u * u[0]
    if hasattr(p, "c_y2"):
        y = y + p.c_y2 * (x[0] - p.y0) ** 2
    return y


def silverbox(theta0: dict | None = None, *, process_std=(1e-5, 1e-4), measurement_std=1e-3,
              substeps: int = 2, mlp_hidden: int = 0, seed: int = 0, quadratic: bool = False) -> cc.StateSpaceModel:
    """The gray-box model with bounded physical parameters (``theta0`` defaults: w0 = 380 rad/s,
    zeta = 0.05, k3 = 0, g = 1, y0 = 0, c_v = d_u = 0).

    ``quadratic=True`` adds the quadratic stiffness ``k2`` and output term ``c_y2`` (initial values
    from ``theta0``, else 0).
    ``mlp_hidden > 0`` adds the optional correction force MLP 3 -> mlp_hidden -> 1 (tanh; Glorot
    weights from ``seed``, output layer zero, so the initial model is the plain gray box); its
    weights ``corr_W0, corr_b0, corr_W1, corr_b1`` are taken from ``theta0`` when given.
    """
    t = {"w0_100": 3.8, "zeta": 0.05, "k3": 0.0, "g": 1.0, "y0": 0.0} if theta0 is None else dict(theta0)
    for name in ("c_v", "d_u", "k2", "c_y2"):
        t.setdefault(name, 0.0)
    params = [cc.Param("w0_100", t["w0_100"], lower=0.5, upper=20.0),
              cc.Param("zeta", t["zeta"], lower=1e-4, upper=1.0),
              cc.Param("k3", t["k3"], lower=-1e3, upper=1e3),
              cc.Param("g", t["g"], lower=1e-3, upper=1e2),
              cc.Param("y0", t["y0"], lower=-0.1, upper=0.1),
              cc.Param("c_v", t["c_v"], lower=-1.0, upper=1.0),
              cc.Param("d_u", t["d_u"], lower=-1.0, upper=1.0)]
    if quadratic:
        params += [cc.Param("k2", t["k2"], lower=-1e2, upper=1e2), cc.Param("c_y2", t["c_y2"], lower=-10.0, upper=10.0)]
    correction = None
    if mlp_hidden:
        correction = MLP((3, int(mlp_hidden), 1), name="corr")
        init = correction.init(np.random.default_rng(seed), last_scale=0.0)
        params += [cc.Param(k, t.get(k, v)) for k, v in init.items()]
    return cc.StateSpaceModel.from_ode(lambda x, u, p: silverbox_rhs(x, u, p, correction), silverbox_observe,
                                       nx=2, nu=1, dt=DT, params=cc.Parameters(*params),
                                       substeps=substeps, process_std=np.asarray(process_std, float),
                                       measurement_std=measurement_std,
                                       name=f"silverbox_mlp{int(mlp_hidden)}" if mlp_hidden else "silverbox")


def initial_theta(A: np.ndarray, B: np.ndarray, C: np.ndarray, D: np.ndarray, y_mean: float, u_mean: float,
                  dt: float = DT) -> dict:
    """Physical initial guess from a 2nd-order discrete linear model (e.g. N4SID): the continuous
    pole pair s = log(lambda) / dt gives w0 = |s| and zeta = -Re(s) / |s|; the static gain of the
    linear model gives g; y0 = mean(y) - g mean(u). k3, c_v and d_u start at 0."""
    lam = np.linalg.eigvals(A)
    s = np.log(lam.astype(complex)) / dt
    s = s[np.argmax(np.abs(s.imag))]
    w0 = abs(s)
    zeta = float(np.clip(-s.real / w0, 1e-3, 0.9))
    gain = float((C @ np.linalg.solve(np.eye(A.shape[0]) - A, B) + D).ravel()[0])
    return {"w0_100": w0 / 100.0, "zeta": zeta, "k3": 0.0, "g": gain, "y0": float(y_mean - gain * u_mean),
            "c_v": 0.0, "d_u": 0.0}
