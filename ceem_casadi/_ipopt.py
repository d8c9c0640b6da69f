"""Small helpers shared by the IPOPT-based steps."""
from __future__ import annotations

import casadi as ca

QUIET = {"print_time": False, "ipopt.print_level": 0, "ipopt.sb": "yes",
         # multipliers w.r.t. p would need derivatives of compiled stage Functions (not available)
         "calc_lam_p": False, "calc_lam_x": False}

# IPOPT return statuses that count as a usable solution
ACCEPTABLE = {"Solve_Succeeded", "Solved_To_Acceptable_Level", "Search_Direction_Becomes_Too_Small"}


# "acceptable" termination = stagnation at round-off: the objective's relative change stays
# below STALL_OBJ_CHANGE for ACCEPTABLE_ITER iterations while the (scaled) optimality error is
# below ACCEPTABLE_TOL. Without it a solve started at (or very near) its optimum, as every EM
# step near convergence is, can spend max_iter iterations failing line searches on round-off
# (measured: a coupled-Lorenz learning step stuck at dual infeasibility 2e-6 with steps of
# 1e-14 for 200 iterations, 38 s, instead of stopping after 3).
ACCEPTABLE_TOL = 1e-4
ACCEPTABLE_ITER = 3
STALL_OBJ_CHANGE = 1e-12


def ipopt_options(max_iter: int, tol: float, **extra) -> dict:
    opts = dict(QUIET)
    opts.update({"ipopt.max_iter": int(max_iter), "ipopt.tol": float(tol),
                 "ipopt.acceptable_tol": max(100 * float(tol), ACCEPTABLE_TOL),
                 "ipopt.acceptable_iter": ACCEPTABLE_ITER,
                 "ipopt.acceptable_obj_change_tol": STALL_OBJ_CHANGE,
                 "ipopt.honor_original_bounds": "yes"})
    opts.update(extra)
    return opts


def hess_lag_function(x: ca.MX, p: ca.MX, hess_triu_of_f) -> ca.Function:
    """IPOPT ``hess_lag`` Function for an NLP without constraints: lam_f * H (upper triangle)."""
    lam_f = ca.MX.sym("lam_f")
    lam_g = ca.MX.sym("lam_g", 0)
    return ca.Function("hess_lag", [x, p, lam_f, lam_g], [lam_f * hess_triu_of_f],
                       ["x", "p", "lam_f", "lam_g"], ["triu_hess_gamma_x_x"])


def grad_f_function(x: ca.MX, p: ca.MX, f, grad) -> ca.Function:
    return ca.Function("grad_f", [x, p], [f, grad], ["x", "p"], ["f", "grad_f_x"])
