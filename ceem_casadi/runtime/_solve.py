"""Small helpers shared by the IPOPT-based steps."""
from __future__ import annotations

import contextlib
import signal
import threading
import time

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
                 "ipopt.honor_original_bounds": "yes", "iteration_callback": DEADLINE})
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


# --- wall-clock deadline --------------------------------------------------------------------
# IPOPT's own ``max_wall_time`` is fixed when a solver is built (CasADi cannot change it later),
# and solvers are built once and reused, so the library's time budgets reach IPOPT through an
# iteration callback instead: every solver gets the same :class:`_DeadlineCallback`, which asks
# IPOPT to stop (status ``User_Requested_Stop``) once ``time.perf_counter()`` passes the deadline
# set by :func:`deadline`. Its inputs are declared empty (only ``f`` is read), so the callback
# copies no data: measured 0.30 s with it vs 0.34 s without (noise) for 17 IPOPT iterations at
# n = 20,000; declared dense, the copies cost ~3 %.
class _DeadlineCallback(ca.Callback):
    def __init__(self):
        ca.Callback.__init__(self)
        self.expires: float | None = None
        self.interrupted = False  # Ctrl-C arrived during a solve run by :func:`solve`
        self.construct("ceem_deadline", {})

    def get_n_in(self):
        return ca.nlpsol_n_out()

    def get_n_out(self):
        return 1

    def get_name_in(self, i):
        return ca.nlpsol_out(i)

    def get_name_out(self, i):
        return "stop"

    def get_sparsity_in(self, i):
        return ca.Sparsity.dense(1, 1) if ca.nlpsol_out(i) == "f" else ca.Sparsity(0, 1)

    def eval(self, arg):
        return [1.0 if self.interrupted or self.expired() else 0.0]

    def expired(self) -> bool:
        return self.expires is not None and time.perf_counter() >= self.expires


DEADLINE = _DeadlineCallback()


@contextlib.contextmanager
def deadline(expires: float | None):
    """Within the block, every IPOPT solver built with `ipopt_options` stops at its next
    iteration once ``time.perf_counter() >= expires`` (``None``: no new deadline; an earlier
    deadline already in force is kept). Forked worker processes inherit the deadline in force
    when they start (``perf_counter`` is a system-wide monotonic clock)."""
    previous = DEADLINE.expires
    if expires is not None:
        DEADLINE.expires = expires if previous is None else min(previous, expires)
    try:
        yield DEADLINE
    finally:
        DEADLINE.expires = previous


def solve(solver: ca.Function, **kwargs) -> dict:
    """``solver(**kwargs)`` such that Ctrl-C stops IPOPT at its next iteration and is then raised.

    A ``KeyboardInterrupt`` raised inside a Python callback during IPOPT is swallowed by CasADi
    (at best the solve stops with an error status). So, in the main thread, SIGINT only sets a
    flag during the solve; the deadline callback stops IPOPT on it, and afterwards the previous
    SIGINT handler is called (by default: ``KeyboardInterrupt`` is raised).
    """
    if threading.current_thread() is not threading.main_thread():
        return solver(**kwargs)
    previous = signal.getsignal(signal.SIGINT)
    DEADLINE.interrupted = False

    def on_sigint(signum, frame):
        DEADLINE.interrupted = True

    signal.signal(signal.SIGINT, on_sigint)
    try:
        out = solver(**kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)
    if DEADLINE.interrupted:
        DEADLINE.interrupted = False
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt
    return out
