"""The trust-region subproblem of the Levenberg-Marquardt engine: the damped Gauss-Newton step,
with equality constraints through the bordered normal equations, and the second-order correction."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sps
import scipy.sparse.linalg as spla

DENSE_MAX = 600         # unknowns + constraints up to which the step is solved densely


class Subproblem:
    """The scaled subproblem ``min 0.5 d^T H d + g^T d`` s.t. ``||d|| <= radius`` (and ``C d = -c``): eigendecomposition
    of H (small, unconstrained) or ``(H + lambda I) d = -g - C^T y`` with lambda searched on a log scale."""

    def __init__(self, H, g, C, c):
        self.H, self.g, self.C, self.c = H, g, C, c
        self.n = H.shape[0]
        self.q = 0 if C is None else C.shape[0]
        self.eig = None
        if self.q == 0 and self.n <= DENSE_MAX:
            S, V = np.linalg.eigh(H.toarray())
            self.eig = (np.maximum(S, 0.0), V, V.T @ g)
        self.lam = self.used = 0.0   # the last bracket of lambda; lambda of the last step returned
        self.gauss_newton = None   # the undamped step (d, y), solved once

    def solve_lam(self, lam, g=None):
        """``(d, y)`` of ``(H + lam I) d = -g`` (default g: this problem's gradient)."""
        if self.eig is not None:
            S, V, gt = self.eig
            gt = gt if g is None else V.T @ g
            return -V @ (gt / np.maximum(S + lam, 1e-14 * max(float(S.max(initial=0.0)), 1e-300))), None
        return _step(self.H, self.g if g is None else g, lam, self.C, self.c)

    def solve(self, radius):
        if self.gauss_newton is None:
            self.gauss_newton = self.solve_lam(0.0)
        d, y = self.gauss_newton
        self.used = 0.0
        if np.linalg.norm(d) <= radius:
            return d, y
        if self.eig is not None:  # secular equation 1/||d(lam)|| = 1/radius by Newton (More-Sorensen)
            S, V, gt = self.eig
            lam = 1e-14 * max(float(S.max(initial=0.0)), 1e-300)   # S >= 0; a zero eigenvalue needs lam > 0
            for _ in range(50):
                den = S + lam
                dn = np.sqrt(float(np.sum(gt ** 2 / den ** 2)))
                if abs(dn - radius) <= 1e-3 * radius:
                    break
                dphi = float(np.sum(gt ** 2 / den ** 3)) / dn ** 3
                lam = max(lam + (1.0 / radius - 1.0 / dn) / dphi, 0.5 * lam + 1e-300)
            self.used = lam
            return -V @ (gt / (S + lam)), None
        lo, hi = 0.0, max(self.lam, 1e-8 * max(float(self.H.diagonal().max(initial=0.0)), 1e-300))
        while True:  # bracket
            d, y = _step(self.H, self.g, hi, self.C, self.c)
            if np.linalg.norm(d) <= radius or hi > 1e30:
                break
            lo, hi = hi, hi * 10.0
        for _ in range(6):  # refine on a log scale; keep a step inside the region
            mid = np.sqrt(max(lo, hi * 1e-3) * hi)
            dm, ym = _step(self.H, self.g, mid, self.C, self.c)
            if np.linalg.norm(dm) <= radius:
                hi, d, y = mid, dm, ym
            else:
                lo = mid
        self.lam = self.used = hi
        if np.linalg.norm(d) > radius and self.q == 0:
            d = d * (radius / np.linalg.norm(d))
        return d, y


def second_order_correction(Cf, c_scaled, free, n):
    """Least-norm scaled correction ``d`` (n,) with ``C_f d_free = -c`` (None when it fails)."""
    try:
        M = (Cf @ Cf.T).tocsc()
        y = spla.splu(M + 1e-14 * max(float(M.diagonal().max(initial=0.0)), 1e-300)
                      * sps.identity(M.shape[0], format="csc")).solve(-c_scaled)
    except (RuntimeError, ValueError):
        return None
    d = np.zeros(n)
    d[free] = np.asarray(Cf.T @ y).ravel()
    return d if np.all(np.isfinite(d)) else None


def _step(H, g, lam, C, c):
    """Damped Gauss-Newton step (and multipliers) of the scaled problem: ``(H + lam I) d + C^T y = -g``,
    ``C d = -c``."""
    n = H.shape[0]
    q = 0 if C is None else C.shape[0]
    if q == 0:   # more than DENSE_MAX unknowns (fewer: the eigendecomposition of `Subproblem`)
        return spla.spsolve((H + lam * sps.identity(n, format="csc")).tocsc(), -g), None
    # sparse LU of the bordered system (docs/output_error.md); a singular H at lam = 0 gets a round-off-sized damping
    lam = max(lam, 1e-12 * max(float(H.diagonal().max(initial=0.0)), 1e-300))
    K = sps.bmat([[H + lam * sps.identity(n, format="csc"), C.T], [C, None]], format="csc")
    sol = spla.splu(K).solve(np.concatenate([-g, -c]))
    return sol[:n], sol[n:]
