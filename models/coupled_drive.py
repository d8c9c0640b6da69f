"""Gray-box model of coupled electric drives measured by a sign-blind speed sensor.

A motor (inertia ``Jm``) drives a pulley (inertia ``Jp``) through an elastic belt (spring with
damping). The input ``u`` is the motor drive voltage (torque ``g u`` per unit motor inertia); the
output is the pulley speed measured by a pulse counter, which does not see the direction of rotation:
``y = |omega_p|``. States (continuous time, seconds): ``q`` belt stretch (rad, motor angle minus pulley
angle), ``wm`` motor speed (rad/s), ``wp`` pulley speed (rad/s)::

    tau   = k q + d (wm - wp)                 belt torque per unit motor inertia (1/s^2 rad)
    dq    = wm - wp
    dwm   = g u - cm wm - tau
    dwp   = r tau - cp wp                     r = Jm / Jp (known, fixed)
    y     = sqrt(wp^2 + EPS^2)                smooth |wp| (rad/s)

The absolute value is replaced by ``sqrt(wp^2 + EPS^2)`` (``EPS = 0.01`` rad/s, far below the noise)
so that the output has derivatives everywhere (the least-squares and Fisher-information Jacobians
need them); it equals ``|wp|`` to within ``EPS`` and exactly ``EPS`` at ``wp = 0``.

Identifiability: the transfer function ``u -> wp`` has 5 free coefficients (cubic denominator, affine
numerator), so at most 5 of ``(k, d, g, cm, cp, r)`` can be estimated, and the two frictions enter
the denominator almost only through ``cp + r cm`` (their product is small against ``k``): the
inertia ratio ``r`` and the pulley friction ``cp`` are fixed (known from the hardware; with ``r = 1``
and both frictions free, swapping ``cm`` and ``cp`` leaves the output unchanged). The sign of ``g`` is
fixed by its bound ``g > 0`` (the output ``|wp|`` cannot see it). Free: ``k, d, g, cm``.

Discretisation: zero-order-hold input, RK4 with ``substeps`` steps per sample of ``DT`` seconds.
"""
from __future__ import annotations

import casadi as ca

import ceem_casadi as cc

__all__ = ["BOUNDS", "DT", "EPS", "FIXED", "R_INERTIA", "TRUE", "coupled_drive", "drive_rhs", "generic_guess"]

DT = 0.05          # s, sample time
EPS = 0.01         # rad/s, smoothing of |wp|
R_INERTIA = 1.0    # Jm / Jp, fixed

#: Parameter bounds (physical: stiffness, damping, gain and frictions positive).
BOUNDS = {"k": (1.0, 500.0), "d": (1e-3, 20.0), "g": (0.05, 100.0), "cm": (1e-3, 20.0), "cp": (1e-3, 20.0)}

#: The parameters that simulate the records (resonance sqrt(k (1 + r)) = 8.9 rad/s, 1.4 Hz).
TRUE = {"k": 40.0, "d": 0.6, "g": 5.0, "cm": 2.0, "cp": 0.5}


#: Parameters fixed at their `TRUE` values (known from the hardware; see the module docstring).
FIXED = ("cp",)


def generic_guess() -> dict:
    """An order-of-magnitude physical guess, not derived from ``TRUE``.

    Stiffness 20 (resonance near 1 Hz), damping 1, gain 2, motor friction 1: every free value within
    a factor 2.5 of `TRUE`; the fixed pulley friction ``cp`` at its known value.

    Returns
    -------
    dict
        Parameter name -> float.

    Examples
    --------
    >>> sorted(generic_guess())
    ['cm', 'cp', 'd', 'g', 'k']
    """
    return {"k": 20.0, "d": 1.0, "g": 2.0, "cm": 1.0, "cp": TRUE["cp"]}


def drive_rhs(x, u, p, r: float = R_INERTIA):
    """Vector field (3,) of ``x = (q, wm, wp)`` (rad, rad/s, rad/s) under the voltage ``u`` (1,), per second.

    Examples
    --------
    >>> import types
    >>> p = types.SimpleNamespace(**TRUE)
    >>> ca.DM(drive_rhs([0.1, 1.0, 0.0], [0.0], p)).full().ravel().round(12).tolist()  # tau = 4 + 0.6
    [1.0, -6.6, 4.6]
    """
    tau = p.k * x[0] + p.d * (x[1] - x[2])
    return ca.vertcat(x[1] - x[2], p.g * u[0] - p.cm * x[1] - tau, r * tau - p.cp * x[2])


def coupled_drive(theta0: dict | None = None, *, measurement_std: float = 0.05, process_std: float = 1e-3,
                  substeps: int = 2, dt: float = DT, r: float = R_INERTIA) -> cc.StateSpaceModel:
    """The drive model as a `ceem_casadi.StateSpaceModel` (nx=3, nu=1, ny=1).

    Parameters
    ----------
    theta0 : dict, optional
        Initial parameter values (default `generic_guess`).
    measurement_std : float
        Speed-sensor noise std, rad/s (weights the output-error objective).
    process_std : float
        Process-noise std per sample of every state (CE-EM weights), state units.
    substeps : int
        RK4 steps per sample.
    dt : float
        Sample time, seconds.
    r : float
        Inertia ratio ``Jm / Jp`` (fixed).

    Returns
    -------
    StateSpaceModel
        Parameters ``k, d, g, cm`` free, ``cp`` fixed (bounds `BOUNDS`), output ``sqrt(wp^2 + EPS^2)``.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> m = coupled_drive()
    >>> y = cc.simulate_output(m, TRUE, np.ones((200, 1)), np.zeros(3))
    >>> round(float(y[-1, 0]), 2)  # steady state g / (cm + cp) with r = 1
    2.0
    """
    th = {**generic_guess(), **(theta0 or {})}
    params = cc.Parameters(*[cc.Param(n, float(th[n]), lower=lo, upper=hi, free=n not in FIXED)
                             for n, (lo, hi) in BOUNDS.items()])

    def rhs(x, u, p):
        return drive_rhs(x, u, p, r)

    def observe(x, u, p):
        return ca.sqrt(x[2] ** 2 + EPS ** 2)

    return cc.StateSpaceModel.from_ode(rhs, observe, nx=3, nu=1, dt=dt, params=params, substeps=substeps,
                                       process_std=[process_std] * 3, measurement_std=measurement_std,
                                       name="coupled_drive")
