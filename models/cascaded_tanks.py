"""Gray-box model of the Cascaded Tanks benchmark (two tanks, Torricelli outflows, overflow).

States (levels in sensor volts, continuous time, seconds): ``h1`` upper tank (hidden), ``h2`` lower tank.
Input ``u``: pump voltage. Output ``y``: lower-tank level sensor (volts)::

    q_in  = kp * relu_s(u - u0)                        pump inflow; u0: pump dead-zone voltage (no flow below)
    q1    = a1 * sq(h1) + b1 * h1                       upper -> lower (Torricelli + small linear term)
    n1    = q_in - q1                                   net inflow of the upper tank
    o1    = relu_s(n1) * gate((h1 - h1max) / w)         overflow of the upper tank (smooth saturation)
    dh1   = n1 - o1
    n2    = q1 + kov * o1 - a2 * sq(h2) - b2 * h2       a fraction kov of the overflow lands in tank 2
    o2    = relu_s(n2) * gate((h2 - h2max) / w)         overflow of the lower tank
    dh2   = n2 - o2
    y     = c0 + c1 * h2                               affine sensor map (c1 fixed to 1 by default:
                                                       levels are expressed in sensor volts)

``sq(h) = sqrt(softplus_eps(h))`` is a square root that is smooth (and positive) near and below 0,
``relu_s`` a softplus with a small sharpness, ``gate`` a C1 smooth step from 0 (``h <= hmax - w``)
to 1 (``h >= hmax + w``, ``w = 0.1`` V): when a tank is full the positive part of its net inflow
leaves as overflow, so the level saturates smoothly near ``hmax`` (never above ``hmax + w``) without
a stiff penalty term (RK4 with 4 substeps of 1 s is stable for the benchmark's flows).

Discretisation: zero-order-hold input, RK4 with ``substeps`` steps per sample (``Ts = 4`` s).
"""
from __future__ import annotations

import casadi as ca
import numpy as np

import ceem_casadi as cc

TS = 4.0
_EPS_SQRT = 0.01     # V, smoothing of the square root near 0
_EPS_RELU = 0.002    # V/s, smoothing of the overflow's positive part
_EPS_PUMP = 0.05     # V, smoothing of the pump dead zone
_W_GATE = 0.1        # V, half-width of the overflow gate (levels stay below hmax + _W_GATE)

#: Parameter bounds (physical: rates positive, levels within the sensor range).
BOUNDS = {
    "kp": (1e-4, 1.0), "a1": (1e-4, 1.0), "a2": (1e-4, 1.0), "b1": (0.0, 0.1), "b2": (0.0, 0.1),
    "kov": (0.0, 1.0), "h1max": (2.0, 20.0), "h2max": (2.0, 20.0), "c0": (-5.0, 5.0),
    "c1": (0.2, 5.0), "u0": (-3.0, 3.0),
}

#: Bounds of the optional structure terms (parameters of the model only when switched on in
#: :func:`cascaded_tanks`; otherwise the equations use their neutral values :data:`NEUTRAL`).
EXTRA_BOUNDS = {"e1": (0.02, 1.0), "e2": (0.02, 1.0), "c2": (-0.2, 0.2), "cj": (-20.0, 20.0)}
NEUTRAL = {"e1": 0.5, "e2": 0.5, "c2": 0.0, "cj": 0.0}


def _extra(p, name: str):
    """The optional term ``name`` of the parameter namespace ``p``, else its neutral value."""
    return getattr(p, name, NEUTRAL[name])


def _softplus(z):
    return ca.fmax(z, 0) + ca.log1p(ca.exp(-ca.fabs(z)))


def smooth_sqrt(h, eps: float = _EPS_SQRT):
    """sqrt(eps * softplus(h / eps)): equals sqrt(h) for h >> eps, smooth and > 0 everywhere."""
    return ca.sqrt(eps * _softplus(h / eps))


def smooth_power(h, e, eps: float = _EPS_SQRT):
    """(eps * softplus(h / eps))**e: equals h**e for h >> eps, smooth and > 0 everywhere (e = 0.5:
    `smooth_sqrt`)."""
    return ca.exp(e * ca.log(eps * _softplus(h / eps)))


def relu_s(z, eps: float = _EPS_RELU):
    return eps * _softplus(z / eps)


def gate(z):
    """C1 smooth step: 0 for z <= -1, 1 for z >= 1, cubic ``s^2 (3 - 2 s)`` with ``s = (z + 1) / 2`` between."""
    s = ca.fmin(ca.fmax(0.5 * (z + 1), 0), 1)
    return s * s * (3 - 2 * s)


def pump_flow(u, p, pump: str = "deadzone"):
    """Pump inflow (V/s): ``kp (u - u0)`` (affine) or ``kp relu_s(u - u0)`` (dead zone)."""
    if pump == "affine":
        return p.kp * (u - p.u0)
    return p.kp * relu_s(u - p.u0, _EPS_PUMP)


def outflow(h, a, b, e, free_exponent: bool):
    """Outflow (V/s) of a tank at level h: ``a h**e + b h`` (Torricelli: e = 0.5)."""
    return a * (smooth_power(h, e) if free_exponent else smooth_sqrt(h)) + b * h


def tanks_rhs(x, u, p, pump: str = "deadzone", free_exponents: bool = False):
    """Vector field (2,) in V/s of the levels x = (h1, h2) under the pump voltage u (1,)."""
    h1, h2 = x[0], x[1]
    q1 = outflow(h1, p.a1, p.b1, _extra(p, "e1"), free_exponents)
    n1 = pump_flow(u[0], p, pump) - q1
    o1 = relu_s(n1) * gate((h1 - p.h1max) / _W_GATE)
    n2 = q1 + p.kov * o1 - outflow(h2, p.a2, p.b2, _extra(p, "e2"), free_exponents)
    o2 = relu_s(n2) * gate((h2 - p.h2max) / _W_GATE)
    return ca.vertcat(n1 - o1, n2 - o2)


def tanks_observe(x, u, p, free_exponents: bool = False):
    """Sensor voltage (1,) of the lower-tank level: ``c0 + c1 h2 + c2 h2**2 + cj q1`` (c2: sensor
    curvature, the sensors are not calibrated; cj: the water jet from the upper tank's outlet,
    ``q1``, disturbing the level read by the lower tank's sensor; both 0 by default)."""
    y = p.c0 + p.c1 * x[1]
    if hasattr(p, "c2"):
        y = y + p.c2 * x[1] ** 2
    if hasattr(p, "cj"):
        y = y + p.cj * outflow(x[0], p.a1, p.b1, _extra(p, "e1"), free_exponents)
    return y


def default_theta() -> dict:
    """A generic physical starting point (time constants ~100 s at 5 V, full tanks at 10 V)."""
    return {"kp": 0.03, "a1": 0.04, "a2": 0.04, "b1": 0.0, "b2": 0.0, "kov": 0.5,
            "h1max": 10.0, "h2max": 10.0, "c0": 0.0, "c1": 1.0, "u0": 0.0}


def initial_theta(est, lin) -> dict:
    """Physical initial guess from the estimation split ``est`` (a `ceem_casadi.BenchmarkSplit`)
    and an order-2 linear model ``lin`` (N4SID result): Torricelli coefficients from the two time
    constants, pump gain from the mean mass balance, overflow levels at the largest measured level
    (docs/results_real.md, "Initial guess from data")."""
    y, u = est.y.ravel(), est.u.ravel()
    lam = np.abs(np.linalg.eigvals(lin.A))
    lam = np.clip(lam, 1e-3, 0.999)
    tau = -est.data.dt / np.log(lam)
    tau_geo = float(np.exp(np.mean(np.log(tau[:2]))))
    a = 2.0 * np.sqrt(np.mean(y)) / tau_geo
    th = default_theta()
    th.update(a1=a, a2=a, kp=a * np.mean(np.sqrt(y)) / np.mean(u), h1max=float(y.max()),
              h2max=float(y.max()), c0=0.0, c1=1.0, b1=0.0, b2=0.0, kov=0.5, u0=0.0)
    return th


def cascaded_tanks(theta0: dict | None = None, *, process_std=(0.01, 0.01), measurement_std=0.05,
                   substeps: int = 4, free_c1: bool = False, free_b: bool = True, free_u0: bool = True,
                   pump: str = "deadzone", dt: float = TS, free_exponents: bool = False,
                   sensor_curvature: bool = False, jet: bool = False) -> cc.StateSpaceModel:
    """The gray-box tanks model as a `ceem_casadi.StateSpaceModel` (nx=2, nu=1, ny=1).

    Parameters
    ----------
    theta0 : initial values (defaults: `default_theta`), clipped into `BOUNDS`.
    process_std : (2,) process-noise std per sample of (h1, h2), volts (CE-EM weights).
    measurement_std : sensor noise std, volts.
    substeps : RK4 steps per sample of ``dt`` seconds.
    free_c1 : estimate the sensor gain (redundant with the flow coefficients; fixed to 1 by default).
    free_b : estimate the linear outflow terms b1, b2 (else fixed to their initial values).
    free_u0 : estimate the pump dead-zone voltage u0 (else fixed to its initial value, 0 by default).
    pump : ``"deadzone"`` (default, ``kp relu_s(u - u0)``: no flow below u0) or ``"affine"``
        (``kp (u - u0)``, negative below u0, i.e. a net drain of the upper tank; it fits the estimation
        data better but drives the levels negative and generalises worse, see docs/results_real.md).
    free_exponents : estimate the outflow exponents e1, e2 (``a h**e``; else fixed to 0.5, Torricelli).
    sensor_curvature : estimate the quadratic sensor term c2 (else 0).
    jet : estimate the jet term cj of the output (else 0).
    The defaults are the model of the earlier docs/results_real.md (11 parameters); each switch adds
    its parameters (bounds `EXTRA_BOUNDS`, initial values from ``theta0`` else `NEUTRAL`,
    where the model equals the default one). Entries of ``theta0`` the model does not have are ignored.
    """
    th = {**default_theta(), **NEUTRAL}
    th.update(theta0 or {})
    ps = []
    switches = {"e1": free_exponents, "e2": free_exponents, "c2": sensor_curvature, "cj": jet}
    bounds = {**BOUNDS, **{k: v for k, v in EXTRA_BOUNDS.items() if switches[k]}}
    for name, (lo, hi) in bounds.items():
        free = True
        if name == "c1":
            free = free_c1
        if name in ("b1", "b2"):
            free = free_b
        if name == "u0":
            free = free_u0
        val = float(np.clip(float(np.asarray(th[name]).reshape(())), lo, hi))
        ps.append(cc.Param(name, val, lower=lo, upper=hi, free=free))
    params = cc.Parameters(*ps)
    if pump not in ("affine", "deadzone"):
        raise ValueError(f"pump must be 'affine' or 'deadzone', got {pump!r}")

    def rhs(x, u, p):
        return tanks_rhs(x, u, p, pump, free_exponents)

    def observe(x, u, p):
        return tanks_observe(x, u, p, free_exponents)

    return cc.StateSpaceModel.from_ode(rhs, observe, nx=2, nu=1, dt=dt, params=params,
                                       substeps=substeps, process_std=process_std,
                                       measurement_std=measurement_std, name="cascaded_tanks")


def steady_upper_level(theta: dict, h2) -> np.ndarray:
    """Upper level h1 at which the flow into tank 2 balances its Torricelli outflow at level h2."""
    h2 = np.maximum(np.asarray(h2, float), 0.0)
    q2 = theta["a2"] * np.sqrt(h2) + theta["b2"] * h2
    # solve a1 sqrt(h1) + b1 h1 = q2 for s = sqrt(h1): b1 s^2 + a1 s - q2 = 0
    a1, b1 = float(theta["a1"]), float(theta["b1"])
    s = q2 / a1 if b1 <= 1e-12 else (-a1 + np.sqrt(a1 * a1 + 4 * b1 * q2)) / (2 * b1)
    return s ** 2

