"""Plain Newton steps on a learning objective before (or instead of) IPOPT (docs/long_records.md)."""
from __future__ import annotations

import numpy as np
from scipy.linalg import LinAlgError, cho_factor, cho_solve

from ..runtime._solve import STALL_OBJ_CHANGE, expired

NEWTON_STEPS = 8  # Newton steps of a learning step before IPOPT takes over
ARMIJO = 1e-4     # sufficient decrease of a Newton step (with 10 eps |f| of round-off, as IPOPT's)
# converged: a predicted decrease below NEWTON_TOL max(1, |f|) at the learner's tol NEWTON_AT_TOL (scaled with tol^2)
NEWTON_TOL, NEWTON_AT_TOL = 1e-14, 1e-9


def _step(H, g):
    """(Newton step, predicted decrease -g'd / 2) or None (H not positive definite)."""
    try:
        d = -cho_solve(cho_factor(H), g)
    except (LinAlgError, ValueError):
        return None
    return d, -0.5 * float(g @ d)


def newton_steps(value, hessian, z, lower, upper, tol: float, max_steps: int = NEWTON_STEPS):
    """Up to ``max_steps`` Newton steps from ``z`` (n,) within ``lower < z < upper`` (n,) on ``value(z) -> (f, g)``
    and ``hessian(z) -> H`` (n, n): ``(z, f, steps)``, ``f`` a float once converged (predicted decrease below
    ``NEWTON_TOL (tol / 1e-9)^2 max(1, |f|)``), else None: IPOPT continues from ``z`` (docs/model_learning_notes.md)."""
    z = np.asarray(z, float)
    if not np.all((lower < z) & (z < upper)):
        return z, None, 0
    thr = NEWTON_TOL * (tol / NEWTON_AT_TOL) ** 2
    f, g = value(z)
    H = hessian(z)
    for steps in range(max_steps + 1):
        step = _step(H, g) if np.isfinite(f) and np.all(np.isfinite(g)) and np.all(np.isfinite(H)) else None
        if step is None:
            return z, None, steps
        d, dec = step
        if dec <= thr * max(1.0, abs(f)):
            return z, float(f), steps
        zt = z + d
        if steps == max_steps or expired() or not np.all((lower < zt) & (zt < upper)):
            return z, None, steps
        ft, gt = value(zt)
        if not (np.isfinite(ft) and ft <= f - ARMIJO * 2 * dec + 10 * np.finfo(float).eps * abs(f)):
            return z, (float(f) if dec <= STALL_OBJ_CHANGE * max(1.0, abs(f)) else None), steps
        z, f, g = zt, float(ft), np.asarray(gt, float)
        step = _step(H, g)  # the previous Hessian's verdict first
        if step is not None and step[1] <= thr * max(1.0, abs(f)):
            return z, f, steps + 1
        H = hessian(z)
    return z, None, max_steps
