"""Fixed-step integrators turning a continuous right-hand side into a discrete step."""
from __future__ import annotations

from collections.abc import Callable

import casadi as ca


def rk4_step(rhs: Callable, x, u, p, dt: float, substeps: int = 1):
    """Classical 4th-order Runge-Kutta over ``dt`` with ``substeps`` equal sub-steps: ``x(t + dt)`` of
    ``rhs(x, u, p) -> dx/dt`` (nx,), ``u`` held over the step, an expression of the type of ``x``."""
    h = dt / substeps
    for _ in range(substeps):
        k1 = rhs(x, u, p)
        k2 = rhs(x + h / 2 * k1, u, p)
        k3 = rhs(x + h / 2 * k2, u, p)
        k4 = rhs(x + h * k3, u, p)
        x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return x


def as_column(expr) -> ca.SX:
    """Coerce a user return value (list, SX, MX, numpy) to a column SX expression."""
    if isinstance(expr, (list, tuple)):
        expr = ca.vertcat(*expr)
    expr = ca.SX(expr) if not isinstance(expr, (ca.SX, ca.MX)) else expr
    if expr.size2() != 1 and expr.size1() == 1:
        expr = expr.T
    return expr
