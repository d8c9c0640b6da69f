"""Damped Newton (or Gauss-Newton) steps for the unconstrained smoothing NLP, whose Hessian is block tridiagonal,
with LAPACK's banded Cholesky and IPOPT's shift rule and status names (docs/long_records.md, "The banded Newton
smoother")."""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import numpy as np
from scipy.linalg import LinAlgError, cho_solve_banded, cholesky_banded

from ..runtime._solve import ACCEPTABLE_TOL, STALL_OBJ_CHANGE, expired, interrupted

ARMIJO = 1e-4           # sufficient decrease: f(x + a d) <= f(x) + ARMIJO a g'd (+ round-off)
MIN_STEP = 2.0 ** -40   # smallest line-search step before the shift is raised
MAX_RETRIES = 12        # shift increases after failed line searches, per iteration
SHIFT_FIRST, SHIFT_MIN, SHIFT_MAX = 1e-4, 1e-20, 1e40  # IPOPT's delta_w_0, _min, _max (scaled units)
DECREMENT_AT_TOL = 1e-8  # the tol (SmootherOptions' default) at which Newton's decrement stops at STALL_OBJ_CHANGE
NEWTON, COST, DIRECTION = "newton", "cost", "direction"  # the requests of BandedNewton.steps
# steps with f unchanged (relative 1e-12) before Search_Direction_Becomes_Too_Small (docs/performance.md)
STALL_STOP = 10


def band_patterns(nx: int):
    """``(cols, rows)`` (nx^2 + nx (nx + 1) / 2,) of one block column's nonzeros in LAPACK's upper band storage
    (entry (r, c) at ``ab[2 nx - 1 + r - c, c]``): the column within the block and the band row, for the order
    `band_column_functions` emits them in (per column j: the nx entries of the block above, then rows 0..j)."""
    cols, rows = [], []
    for j in range(nx):
        cols += [j] * (nx + j + 1)
        rows += [nx - 1 + i - j for i in range(nx)] + [2 * nx - 1 + i - j for i in range(j + 1)]
    return np.array(cols), np.array(rows)


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (OSError, TypeError, AttributeError):
        return None


def release_heap(entries: int) -> None:
    """Before arrays of ``entries`` doubles or more (2^22: glibc's largest mmap threshold), return the C heap's free
    pages to the OS (glibc's ``malloc_trim``): freed chunk temporaries stay resident otherwise (0.3 GB at T = 10^6)."""
    if entries >= 1 << 22 and _malloc_trim() is not None:
        _malloc_trim()(0)


def band_storage(nz: np.ndarray, nx: int, T: int) -> np.ndarray:
    """LAPACK upper band storage (2 nx, nx T) (Fortran order) of a symmetric block-tridiagonal matrix from its block
    columns' nonzeros ``nz`` (k, >= T) (`band_patterns` order; block 0's block above ignored), or a view of ``nz``
    given as that storage (T, nx, 2 nx)."""
    if nz.ndim == 3:
        return nz.reshape(T * nx, 2 * nx).T
    cols, rows = band_patterns(nx)
    cube = np.zeros((T, nx, 2 * nx))
    cube[:, cols, rows] = nz.reshape(-1, cols.size)[:T]
    return cube.reshape(T * nx, 2 * nx).T


@dataclass
class NewtonOutcome:
    """Result of `BandedNewton.solve`: states (nx T,), objective, IPOPT-style status, accepted steps and the largest
    shift used (IPOPT's scaled units: the shift added to H is ``max_shift / s``, s the gradient scaling)."""

    x: np.ndarray
    cost: float
    status: str
    iterations: int
    max_shift: float


class BandedNewton:
    """Damped Newton solver for ``min_x f(x)``, x (nx T,), block-tridiagonal Hessian, ``max_iter`` steps, ``tol`` as
    IPOPT's; `solve`'s objective has ``newton(x) -> (f, g (nx T,), nz (T, k), d0 (nx,))`` and ``cost(x) -> f``."""

    def __init__(self, nx: int, T: int, max_iter: int, tol: float):
        self.nx, self.T = nx, T
        self.max_iter, self.tol = int(max_iter), float(tol)
        self.acceptable_tol = max(100 * self.tol, ACCEPTABLE_TOL)
        self.decrement_tol = STALL_OBJ_CHANGE * (self.tol / DECREMENT_AT_TOL) ** 2  # docs/long_records.md

    def direction(self, nz, d0, g, shift):
        """Solve ``(H + shift I) d = -g`` for the Hessian given by its block columns' nonzeros ``nz``
        (T, k) or its band storage (T, nx, 2 nx) (`band_storage`; factorised in place) plus ``d0`` (nx,)
        on its first nx diagonal entries; None when the factorisation fails or d is not finite."""
        ab = band_storage(nz, self.nx, self.T)
        release_heap(ab.size)  # the chunks' freed temporaries, before d and the line search's trial states
        ab[-1, :self.nx] += d0
        if shift:
            ab[-1] += shift
        try:
            chol = cholesky_banded(ab, overwrite_ab=True, lower=False, check_finite=False)
        except LinAlgError:
            return None
        d = cho_solve_banded((chol, False), g, check_finite=False)
        d *= -1  # = the solve with -g, exactly; no second array of g's size
        return d if np.all(np.isfinite(d)) else None

    @staticmethod
    def _line_search(x, f, g, d):
        """Backtracking from the full step (a generator yielding ``(COST, x_trial)`` requests);
        returns ``(x_new, f_new)`` or None."""
        slope = float(g @ d)
        if not slope < 0:
            return None
        slack = 10 * np.finfo(float).eps * abs(f)
        alpha = 1.0
        while alpha >= MIN_STEP:
            xt = alpha * d
            xt += x  # one temporary of x's size, not two
            ft = float((yield COST, xt))
            if np.isfinite(ft) and ft <= f + ARMIJO * alpha * slope + slack:
                return xt, ft
            alpha *= 0.5
        return None

    def solve(self, x0: np.ndarray, objective) -> NewtonOutcome:
        """Minimise ``objective`` (see the class docstring) from ``x0`` (nx T,): `steps`
        with every request answered by ``objective`` and `direction`."""
        answer = {NEWTON: objective.newton, COST: objective.cost, DIRECTION: lambda a: self.direction(*a)}
        steps = self.steps(x0)
        try:
            kind, arg = next(steps)
            while True:  # a request's argument (a band: 576 MB at T = 10^6) is not held while the solver goes on
                reply, arg = answer[kind](arg), None
                kind, arg = steps.send(reply)
        except StopIteration as stop:
            return stop.value

    def _status(self, f, gnorm, err, finite, stalled, it):
        """The stopping tests before a step (docs/long_records.md): an IPOPT status, or None to go on."""
        tests = ((not (finite and np.isfinite(f) and np.isfinite(gnorm)), "Invalid_Number_Detected"),
                 (err <= self.tol and gnorm <= 1.0, "Solve_Succeeded"),
                 (stalled >= 3 and err <= self.acceptable_tol, "Solved_To_Acceptable_Level"),
                 (stalled >= STALL_STOP, "Search_Direction_Becomes_Too_Small"),
                 (it >= self.max_iter, "Maximum_Iterations_Exceeded"))
        status = next((name for hit, name in tests if hit), None)
        return status or ("User_Requested_Stop" if interrupted() or expired() else None)

    def _direction(self, x, g, hess, shift, shift_last, scale):
        """``(d, shift)`` with the smallest shift from ``shift`` on that factorises (IPOPT's rule; a generator of
        requests), d None past SHIFT_MAX; a band storage Hessian (T, nx, 2 nx), factorised in place, is asked again
        at x before each further DIRECTION request (docs/long_records.md)."""
        nz, d0 = hess
        while True:
            d = yield DIRECTION, (nz, d0, g, shift / scale)
            if d is not None:
                return d, shift
            shift = (SHIFT_FIRST if shift_last == 0 else max(SHIFT_MIN, shift_last / 3)) if shift == 0 \
                else shift * (100 if shift_last == 0 else 8)
            if shift > SHIFT_MAX:
                return None, shift
            if nz.ndim == 3:  # a band factorised in place
                _, _, nz, d0 = yield NEWTON, x

    def steps(self, x0: np.ndarray):
        """The solver as a generator of ``(kind, argument)`` requests (`solve_many` answers many at once):
        ``(NEWTON, x)`` -> ``objective.newton(x)``, ``(COST, x)`` -> ``objective.cost(x)``, ``(DIRECTION, (nz, d0,
        g, shift))`` -> `direction`'s result (may overwrite nz); returns the `NewtonOutcome`."""
        x = np.asarray(x0, float)  # never written in place (a copy only if it is returned unchanged, below)
        scale, shift_last, max_shift, it, stalled = None, 0.0, 0.0, 0, 0
        while True:
            f, g, nz, d0 = yield NEWTON, x
            gnorm = float(np.max(np.abs(g), initial=0.0))
            if scale is None:
                scale = min(1.0, 100.0 / gnorm) if 0 < gnorm < np.inf else 1.0
            err = scale * gnorm
            status = self._status(f, gnorm, err, _all_finite(nz), stalled, it)
            step, shift, tries, hess = None, 0.0, 0, (nz, d0)
            while status is None and step is None and tries <= MAX_RETRIES:
                if hess is None:
                    _, _, *hess = yield NEWTON, x
                d, shift = yield from self._direction(x, g, hess, shift, shift_last, scale)
                if hess[0].ndim == 3:  # factorised in place: asked again; the next Hessian must not meet it (576 MB)
                    nz = hess = None
                if d is None:
                    status = "Line_Search_Failed"
                elif np.max(np.abs(d)) <= 10 * np.finfo(float).eps * max(1.0, float(np.max(np.abs(x)))):
                    status = "Search_Direction_Becomes_Too_Small"
                elif shift == 0 and -0.5 * float(g @ d) <= self.decrement_tol * max(1.0, abs(f)):
                    # at round-off: no step, no line search (the EM step that confirms convergence took
                    # 3-4 such steps, each a Hessian, a factorisation and a line search: 5.2x the floor)
                    status = "Solve_Succeeded"
                else:
                    step = yield from self._line_search(x, f, g, d)
                    if step is None:  # too long a step: damp it (towards steepest descent)
                        shift, tries = max(shift * 10, SHIFT_FIRST), tries + 1
            if status is None and step is None:
                status = "Solved_To_Acceptable_Level" if err <= self.acceptable_tol else "Line_Search_Failed"
            if status is not None:
                return NewtonOutcome(x.copy() if it == 0 else x, f, status, it, max_shift)
            if shift:
                shift_last, max_shift = shift, max(max_shift, shift)
            x, f_new = step
            stalled = stalled + 1 if abs(f_new - f) <= 1e-12 * max(1.0, abs(f)) else 0
            it, g, d = it + 1, None, None  # not held while the next Hessian is evaluated (2 x 48 MB at T = 10^6)


def _all_finite(a: np.ndarray, block: int = 1 << 20) -> bool:
    """``np.isfinite(a).all()`` without a boolean array of a's size (a band of 72 M entries at T = 10^6)."""
    flat = a.reshape(-1)
    return all(np.isfinite(flat[i:i + block]).all() for i in range(0, flat.size, block))
