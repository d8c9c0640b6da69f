"""Variable projection for output error: the parameters that enter the free run's outputs linearly
are eliminated by linear least squares at every evaluation (Golub-Pereyra with Kaufman's Jacobian;
docs/output_error.md)."""
from __future__ import annotations

import casadi as ca
import numpy as np
import scipy.linalg as sla
import scipy.sparse as sps

from ._lm import LeastSquaresProblem

_C_RTOL = 1e-4   # relative change of c beyond which the Jacobian is re-linearised at c*(a)


def linear_parameters(model) -> np.ndarray:
    """Positions (in ``model.params.free_index``) of the free, unbounded parameter entries that enter the
    free run's outputs linearly (docs/output_error.md), sorted."""
    params = model.params
    free = params.free_index
    pos = {int(k): i for i, k in enumerate(free)}
    x, u, p = ca.SX.sym("x", model.nx), ca.SX.sym("u", model.nu), ca.SX.sym("p", params.size)
    f, g = model.f(x, u, p), model.g(x, u, p)
    lo, hi = np.asarray(params.lower, float), np.asarray(params.upper, float)
    groups = []
    for name in params.names:
        sl = params.slice(name)
        groups.append([k for k in range(sl.start, sl.stop) if k in pos and np.isneginf(lo[k]) and np.isposinf(hi[k])])
    chosen: list[int] = []
    for idx in sorted(filter(None, groups), key=len, reverse=True):
        if _affine(f, g, x, p, chosen + idx):
            chosen += idx
    return np.array(sorted(pos[k] for k in chosen), int)


def _affine(f, g, x, p, entries) -> bool:
    """Whether the rollout is affine in ``p[entries]`` (module docstring)."""
    c = ca.vertcat(*[p[k] for k in entries])
    reached: set[int] = set()
    while True:
        drivers = ca.vertcat(c, *[x[i] for i in sorted(reached)])
        new = {i for i in range(x.numel()) if i not in reached and ca.depends_on(f[i], drivers)}
        if not new:
            break
        reached |= new
    v = ca.vertcat(c, *[x[i] for i in sorted(reached)])
    out = ca.vertcat(g, *[f[i] for i in sorted(reached)])
    return not ca.depends_on(ca.jacobian(out, v), v)


class ProjectedProblem(LeastSquaresProblem):
    """The reduced problem around the single-shooting problem ``full`` (data bound): unknowns ``a``
    (n_a,) = the full unknowns without the positions ``linear``; `full_vector` adds ``c*(a)``."""

    def __init__(self, full, linear: np.ndarray, c0: np.ndarray):
        self.full = full
        self.linear = np.asarray(linear, int)
        self.other = np.setdiff1d(np.arange(full.nw), self.linear)
        self.c_ref = np.asarray(c0, float).copy()
        self._key = self._val = self._lin = None

    def _project(self, a, c):
        """``(r*, Kaufman's J*, c*, dc, dc*/da)`` from one evaluation at ``(a, c)`` (None when not finite)."""
        w = np.empty(self.full.nw)
        w[self.other], w[self.linear] = a, c
        out = self.full.evaluate(w, True)
        if out is None:
            return None
        r, J = out[0], out[1]
        J = J.toarray() if sps.issparse(J) else np.asarray(J)
        Jc, Ja = J[:, self.linear], J[:, self.other]
        Q, R = sla.qr(Jc, mode="economic")
        diag = np.abs(np.diag(R))
        if np.all(diag > 1e-12 * max(float(diag.max(initial=0.0)), 1e-300)):
            dc = sla.solve_triangular(R, -(Q.T @ r))
        else:  # rank-deficient linear part: minimum-norm solution, projector on its range
            dc = sla.lstsq(Jc, -r, cond=1e-12)[0]
            U, sv, _ = sla.svd(Jc, full_matrices=False)
            Q = U[:, sv > 1e-12 * max(float(sv.max(initial=0.0)), 1e-300)]
        QtJa = Q.T @ Ja
        r_star = r - Q @ (Q.T @ r)
        J_star = Ja - Q @ QtJa
        if not (np.all(np.isfinite(r_star)) and np.all(np.isfinite(J_star)) and np.all(np.isfinite(dc))):
            return None
        # dc*/da ~ -Jc^+ Ja (Kaufman): predicts c*(a') of the next trial, linearised near it (docs/output_error.md)
        slope = sla.lstsq(Jc, Ja, cond=1e-12)[0] if Q.shape[1] < self.linear.size else sla.solve_triangular(R, QtJa)
        return r_star, J_star, c + dc, dc, slope

    def _solve(self, a, jac: bool):
        """The cached projection at ``a``; with ``jac`` linearised at ``c*(a)`` (re-evaluated there when
        ``c`` moved by more than `_C_RTOL`)."""
        a = np.asarray(a, float)
        if self._key is None or not np.array_equal(self._key, a):
            c = self.c_ref
            if self._lin is not None:         # c*(a) predicted from the last linearisation
                a_k, c_k, slope = self._lin
                c = c_k - slope @ (a - a_k)
            self._val = self._project(a, c)
            self._key = a.copy()
        val = self._val
        if jac and val is not None and np.linalg.norm(val[3]) > _C_RTOL * (np.linalg.norm(val[2]) + 1e-300):
            val = self._val = self._project(a, val[2])
        if val is not None:
            self.c_ref = val[2]
            if jac:
                self._lin = (a.copy(), val[2], val[4])
        return val

    def full_vector(self, a) -> np.ndarray:
        """(n,) the full unknowns at ``a`` with the eliminated entries at their optimum ``c*(a)``."""
        out = self._solve(a, False)
        w = np.empty(self.full.nw)
        w[self.other], w[self.linear] = a, self.c_ref if out is None else out[2]
        return w

    def evaluate(self, a, jac):
        out = self._solve(a, jac)
        if out is None:
            return None
        return out[0], (out[1] if jac else None), np.zeros(0), None

    def reference_cost(self):
        return self.full.reference_cost()

    def exploding_advice(self, a):
        return self.full.exploding_advice(self.full_vector(a))
