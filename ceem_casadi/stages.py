"""Per-time-step pieces of the CE-EM objective and their exact derivatives.

With r_o = m * (y - g(x, u, p)) / sigma_v and r_d = (x' - f(x, u, p)) / sigma_w the negative
joint log-density is, up to constants,

    -J = sum_t 0.5 ||r_o[t]||^2 + sum_t 0.5 ||r_d[t]||^2 + 0.5 ||(x_1 - mu_1) / s_1||^2 .

Each sum is a *stage* touching one state (observation) or two consecutive states (dynamics).
This module builds small SX Functions of one stage returning the cost, its gradient and its
Hessian (exact or Gauss-Newton) with respect to the states or to the parameters. They are
mapped over time by the smoother and the learner, so derivative graphs never grow with T.
"""
from __future__ import annotations

import casadi as ca

HESSIANS = ("gauss-newton", "exact")


def _check_hessian(kind: str) -> None:
    if kind not in HESSIANS:
        raise ValueError(f"hessian must be one of {HESSIANS}, got {kind!r}")


def _cost_grad_hess(name, residual, wrt, inputs, in_names, hessian: str, dense: bool):
    """Two Functions of one stage: ``(cost, grad)`` and ``(hess)`` with respect to ``wrt``."""
    _check_hessian(hessian)
    cost = 0.5 * ca.sumsqr(residual)
    jac = ca.jacobian(residual, wrt)
    grad = jac.T @ residual
    if hessian == "exact":
        hess, _ = ca.hessian(cost, wrt)
    else:
        hess = jac.T @ jac
    if dense:
        grad, hess = ca.densify(grad), ca.densify(hess)
    return (ca.Function(name + "_grad", inputs, [cost, grad], in_names, ["cost", "grad"]),
            ca.Function(name + "_hess", inputs, [hess], in_names, ["hess"]))


class StageFunctions:
    """SX stage Functions of a model (built once per model and Hessian kind).

    Inputs (all columns): x, x_next (nx), u (nu), y, m (ny; m is the 0/1 observed mask),
    p (np), iw (nx) = 1/sigma_w, iv (ny) = 1/sigma_v.
    """

    def __init__(self, model, hessian: str = "gauss-newton"):
        _check_hessian(hessian)
        self.model, self.hessian = model, hessian
        nx, nu, ny, npar = model.nx, model.nu, model.ny, model.params.size
        x, xn = ca.SX.sym("x", nx), ca.SX.sym("x_next", nx)
        u, y, m = ca.SX.sym("u", nu), ca.SX.sym("y", ny), ca.SX.sym("m", ny)
        p, iw, iv = ca.SX.sym("p", npar), ca.SX.sym("iw", nx), ca.SX.sym("iv", ny)
        r_obs = m * iv * (y - model.g(x, u, p))
        r_dyn = iw * (xn - model.f(x, u, p))
        z = ca.vertcat(x, xn)
        obs_in, obs_names = [x, u, y, m, p, iv], ["x", "u", "y", "m", "p", "iv"]
        dyn_in, dyn_names = [x, xn, u, p, iw], ["x", "x_next", "u", "p", "iw"]
        # derivatives with respect to the states (smoothing step), dense blocks
        self.obs_x_grad, self.obs_x_hess = _cost_grad_hess("obs_x", r_obs, x, obs_in, obs_names, hessian, True)
        self.dyn_x_grad, self.dyn_x_hess = _cost_grad_hess("dyn_x", r_dyn, z, dyn_in, dyn_names, hessian, True)
        # derivatives with respect to the parameters (learning step), sparse
        self.obs_p_grad, self.obs_p_hess = _cost_grad_hess("obs_p", r_obs, p, obs_in, obs_names, hessian, False)
        self.dyn_p_grad, self.dyn_p_hess = _cost_grad_hess("dyn_p", r_dyn, p, dyn_in, dyn_names, hessian, False)
        # plain residuals (for J and diagnostics)
        self.obs_cost = ca.Function("obs_cost", obs_in, [0.5 * ca.sumsqr(r_obs)], obs_names, ["cost"])
        self.dyn_cost = ca.Function("dyn_cost", dyn_in, [0.5 * ca.sumsqr(r_dyn)], dyn_names, ["cost"])
