"""The solve layer under every IPOPT-based step: IPOPT options, a per-thread deadline, Ctrl-C, statuses
and best-iterate tracking (docs/runtime.md, "The solve layer")."""
from __future__ import annotations

import contextlib
import contextvars
import signal
import threading
import time

import casadi as ca
import numpy as np

from ._best import BestIterate
from ._callbacks import SparsityCallback

QUIET = {"print_time": False, "ipopt.print_level": 0, "ipopt.sb": "yes",
         # multipliers w.r.t. p would need derivatives of compiled stage Functions (not available)
         "calc_lam_p": False, "calc_lam_x": False}

# IPOPT return statuses that count as a usable solution
ACCEPTABLE = {"Solve_Succeeded", "Solved_To_Acceptable_Level", "Search_Direction_Becomes_Too_Small"}

# stall-aware termination: stop at round-off stagnation (docs/runtime.md)
ACCEPTABLE_TOL = 1e-4
ACCEPTABLE_ITER = 3
STALL_OBJ_CHANGE = 1e-12


def ipopt_options(max_iter: int, tol: float, *, track: tuple[int, int] | None = None, **extra) -> dict:
    """IPOPT options of the library (quiet, stall-aware termination, the deadline callback); with
    ``track=(nx, ng)`` (numbers of variables and constraints) `solve` can keep the best iterate."""
    opts = dict(QUIET)
    opts.update({"ipopt.max_iter": int(max_iter), "ipopt.tol": float(tol),
                 "ipopt.acceptable_tol": max(100 * float(tol), ACCEPTABLE_TOL),
                 "ipopt.acceptable_iter": ACCEPTABLE_ITER,
                 "ipopt.acceptable_obj_change_tol": STALL_OBJ_CHANGE,
                 "ipopt.honor_original_bounds": "yes",
                 "iteration_callback": DEADLINE if track is None else _StopCallback(track)})
    opts.update(extra)
    return opts


def ipopt_solver(name: str, nlp: dict, opts: dict) -> ca.Function:
    """``ca.nlpsol(name, "ipopt", nlp, opts)`` that keeps the options' iteration callback alive as
    long as the solver (CasADi holds no Python reference to it)."""
    solver = ca.nlpsol(name, "ipopt", nlp, opts)
    solver._ceem_iteration_callback = opts.get("iteration_callback")
    return solver


def hess_lag_function(x: ca.MX, p: ca.MX, hess_triu_of_f) -> ca.Function:
    """IPOPT ``hess_lag`` Function for an NLP without constraints: lam_f * H (upper triangle)."""
    lam_f = ca.MX.sym("lam_f")
    lam_g = ca.MX.sym("lam_g", 0)
    return ca.Function("hess_lag", [x, p, lam_f, lam_g], [lam_f * hess_triu_of_f],
                       ["x", "p", "lam_f", "lam_g"], ["triu_hess_gamma_x_x"])


def grad_f_function(x: ca.MX, p: ca.MX, f, grad) -> ca.Function:
    return ca.Function("grad_f", [x, p], [f, grad], ["x", "p"], ["f", "grad_f_x"])


# the deadline, Ctrl-C and the best iterate of the calling thread's solve (docs/runtime.md)
_EXPIRES: contextvars.ContextVar[float | None] = contextvars.ContextVar("ceem_deadline", default=None)
_INTERRUPT: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("ceem_interrupt", default=None)
_TRACKER: contextvars.ContextVar[BestIterate | None] = contextvars.ContextVar("ceem_best_iterate", default=None)


def _sooner(a: float | None, b: float | None) -> float | None:
    """The earlier of two deadlines (None: no deadline)."""
    return a if b is None else b if a is None else min(a, b)


def current_deadline() -> float | None:
    """The ``time.perf_counter()`` value at which solves of this thread stop (None: no deadline)."""
    return _EXPIRES.get()


def deadline_after(seconds: float | None, start: float | None = None) -> float | None:
    """The ``time.perf_counter()`` at which a call with a budget of ``seconds`` from ``start`` (default now;
    None: none of its own) stops; never later than the deadline in force (an inner budget never extends it)."""
    own = None if seconds is None else (time.perf_counter() if start is None else float(start)) + float(seconds)
    return _sooner(_EXPIRES.get(), own)


def expired() -> bool:
    """Whether this thread's deadline has passed."""
    expires = _EXPIRES.get()
    return expires is not None and time.perf_counter() >= expires


def remaining() -> float | None:
    """Seconds left before this thread's deadline (at least 1 ms), or None without a deadline."""
    expires = _EXPIRES.get()
    return None if expires is None else max(expires - time.perf_counter(), 1e-3)


class TimeLimitReached(Exception):
    """Raised by `check_deadline` in a long loop that is not an IPOPT solve; the fit that set the
    deadline catches it and returns its best iterate so far."""


def check_deadline(what: str) -> None:
    """Raise `TimeLimitReached` naming ``what`` when this thread's deadline has passed."""
    if expired():
        raise TimeLimitReached(f"time limit reached during {what}")


def budget(share: float) -> float | None:
    """The ``time.perf_counter()`` at which ``share`` (0..1) of this thread's remaining time is spent (None
    without a deadline), e.g. the deadline of a warm start."""
    left = remaining()
    return None if left is None else time.perf_counter() + share * left


def interrupted() -> bool:
    """Whether Ctrl-C arrived during the `solve` call in progress (main thread only)."""
    event = _INTERRUPT.get()
    return event is not None and event.is_set()


@contextlib.contextmanager
def deadline(expires: float | None):
    """Context manager: solves of THIS thread stop once ``time.perf_counter() >= expires`` (None: keep the one
    in force; an earlier one is kept). Forked workers inherit the deadline in force."""
    previous = _EXPIRES.get()
    expires = None if expires is None else _sooner(previous, float(expires))
    token = _EXPIRES.set(previous if expires is None else expires)
    try:
        yield expires
    finally:
        _EXPIRES.reset(token)


_NLP_OUT = [ca.nlpsol_out(i) for i in range(ca.nlpsol_n_out())]


class _StopCallback(SparsityCallback):
    """IPOPT iteration callback: stop on the deadline or Ctrl-C; with ``track=(nx, ng)`` it offers each
    iterate (x, f, max |g|) to the `BestIterate` of the `solve` in progress."""

    def __init__(self, track: tuple[int, int] | None = None):
        self.tracked = track
        size = {"f": 1} if track is None else {"f": 1, "x": int(track[0]), "g": int(track[1])}
        sp_in = [ca.Sparsity.dense(size[n], 1) if n in size else ca.Sparsity(0, 1) for n in _NLP_OUT]
        super().__init__("ceem_deadline" + ("" if track is None else "_tracking"), sp_in, [ca.Sparsity.dense(1, 1)],
                         _NLP_OUT, ["stop"])

    def eval(self, arg):
        tracker = _TRACKER.get()
        if self.tracked is not None and tracker is not None:
            x, f, g = (np.asarray(arg[_NLP_OUT.index(n)].full(), float).ravel() for n in ("x", "f", "g"))
            tracker.offer(x, float(f[0]), float(np.max(np.abs(g), initial=0.0)),
                          label=f"IPOPT iteration {tracker.offered}")
        return [1.0 if interrupted() or expired() else 0.0]


DEADLINE = _StopCallback()


def solve(solver: ca.Function, *, best: BestIterate | None = None, expires: float | None = None, **kwargs) -> dict:
    """``solver(**kwargs)`` under this thread's deadline and ``expires`` (this call only); Ctrl-C stops IPOPT
    and is then raised; ``best`` receives every iterate (solver built with ``ipopt_options(track=...)``)."""
    token = _TRACKER.set(best)
    try:
        with deadline(expires):
            if threading.current_thread() is not threading.main_thread():
                return solver(**kwargs)
            return _solve_main_thread(solver, kwargs)
    finally:
        _TRACKER.reset(token)


def _solve_main_thread(solver: ca.Function, kwargs: dict) -> dict:
    previous = signal.getsignal(signal.SIGINT)
    event = threading.Event()
    token = _INTERRUPT.set(event)

    def on_sigint(signum, frame):
        event.set()

    signal.signal(signal.SIGINT, on_sigint)
    try:
        out = solver(**kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)
        _INTERRUPT.reset(token)
    if event.is_set():
        if callable(previous):
            previous(signal.SIGINT, None)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt
    return out
