"""Learning step (M-step): the parameters that maximise J for fixed state trajectories.

With z the free entries of the flat parameter vector p (fixed entries held at their values),

    min_z  sum_{b,t} 0.5||r_o||^2 + sum_{b,t} 0.5||r_d||^2 + rho_theta ||z - z_prev||^2
           + 0.5 ||(z - mu_p) / s_p||^2        (the optional Gaussian prior, -log p(theta))

subject to the parameters' bounds. All stages of all trajectories are stacked into one long
map whose outputs are summed (``reduce_out``), so gradient and Hessian (exact or Gauss-Newton,
sparse in p) are built from small per-stage SX Functions. Built once per dataset shape.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import casadi as ca
import numpy as np

from ._ipopt import ACCEPTABLE, grad_f_function, hess_lag_function, ipopt_options
from .options import LearnerOptions
from .stages import StageFunctions


@dataclass
class LearnResult:
    """Flat parameter vector (np,), objective value, solver status."""

    theta_vec: np.ndarray
    cost: float
    status: str
    success: bool
    iterations: int
    wall_s: float


def stack_stages(data, xs: list[np.ndarray]):
    """Stack all trajectories' stages column-wise.

    Returns observation columns (X, U, Y, M) with N_obs = sum T_b columns and dynamics columns
    (X_t, X_{t+1}, U_t) with N_dyn = sum (T_b - 1) columns.
    """
    Xo, Uo, Yo, Mo, X0, X1, U0 = [], [], [], [], [], [], []
    for b, x in enumerate(xs):
        y, u = data.y[b], data.inputs(b)
        mask = np.isfinite(y)
        Xo.append(x.T), Uo.append(u.T), Yo.append(np.where(mask, y, 0.0).T), Mo.append(mask.T.astype(float))
        X0.append(x[:-1].T), X1.append(x[1:].T), U0.append(u[:-1].T)
    return [np.hstack(a) for a in (Xo, Uo, Yo, Mo)], [np.hstack(a) for a in (X0, X1, U0)]


class Learner:
    """IPOPT learning solver for one model and one set of trajectory lengths (built once)."""

    def __init__(self, model, lengths, options: LearnerOptions = LearnerOptions(),
                 stages: StageFunctions | None = None):
        t0 = time.perf_counter()
        self.model, self.options, self.lengths = model, options, tuple(lengths)
        kind = "exact" if options.hessian == "limited-memory" else options.hessian
        stages = stages if stages is not None and stages.hessian == kind else StageFunctions(model, kind)
        params = model.params
        nx, nu, ny, npar = model.nx, model.nu, model.ny, params.size
        self.free = params.free_index
        nfree = self.free.size
        n_obs, n_dyn = sum(self.lengths), sum(T - 1 for T in self.lengths)
        z = ca.MX.sym("z", nfree)
        syms = dict(p_base=ca.MX.sym("p_base", npar), Xo=ca.MX.sym("Xo", nx, n_obs),
                    Uo=ca.MX.sym("Uo", nu, n_obs), Yo=ca.MX.sym("Yo", ny, n_obs), Mo=ca.MX.sym("Mo", ny, n_obs),
                    X0=ca.MX.sym("X0", nx, n_dyn), X1=ca.MX.sym("X1", nx, n_dyn), U0=ca.MX.sym("U0", nu, n_dyn),
                    iw=ca.MX.sym("iw", nx, n_dyn), iv=ca.MX.sym("iv", ny, n_obs), z_prev=ca.MX.sym("z_prev", nfree),
                    rho=ca.MX.sym("rho"), mu=ca.MX.sym("mu", nfree), w=ca.MX.sym("w", nfree))
        self._names = list(syms)
        sizes = [s.numel() for s in syms.values()]
        P = ca.MX.sym("P", sum(sizes))
        parts = ca.vertsplit(P, np.concatenate([[0], np.cumsum(sizes)]).tolist())
        s = {k: ca.reshape(part, v.shape[0], v.shape[1]) for (k, v), part in zip(syms.items(), parts)}
        self._sizes = dict(zip(self._names, sizes))
        E = ca.DM(ca.Sparsity.triplet(npar, nfree, self.free.tolist(), list(range(nfree))), 1.0)
        p = s["p_base"] + ca.mtimes(E, z)

        obs_args = [s["Xo"], s["Uo"], s["Yo"], s["Mo"], p, s["iv"]]
        dyn_args = [s["X0"], s["X1"], s["U0"], p, s["iw"]]
        psym = ca.SX.sym("p", npar)
        obs_uses_p = ca.depends_on(model.g(ca.SX.sym("x", nx), ca.SX.sym("u", nu), psym), psym)
        terms = [(stages.dyn_cost, stages.dyn_p_grad, stages.dyn_p_hess, n_dyn, dyn_args)]
        if obs_uses_p:
            terms.append((stages.obs_cost, stages.obs_p_grad, stages.obs_p_hess, n_obs, obs_args))
        dz = z - s["z_prev"]
        reg_cost = s["rho"] * ca.sumsqr(dz) + 0.5 * ca.sumsqr(s["w"] * (z - s["mu"]))
        cost, grad, hess = reg_cost, 2 * s["rho"] * dz + s["w"] ** 2 * (z - s["mu"]), ca.diag(2 * s["rho"] + s["w"] ** 2)
        for fcost, fgrad, fhess, n, args in terms:
            cost = cost + self._reduce(fcost, n)(*args)
            grad = grad + self._reduce(fgrad, n)(*args)[1][self.free.tolist()]
            hess = hess + self._reduce(fhess, n)(*args)[self.free.tolist(), self.free.tolist()]
        extra = dict(grad_f=grad_f_function(z, P, cost, grad))
        if options.hessian == "limited-memory":
            extra["ipopt.hessian_approximation"] = "limited-memory"
        else:
            extra["hess_lag"] = hess_lag_function(z, P, ca.triu(hess))
        self.solver = ca.nlpsol("learner", "ipopt", {"x": z, "p": P, "f": cost},
                                ipopt_options(options.max_iter, options.tol, **extra))
        self.cost_function = ca.Function("learn_cost", [z, P], [cost])
        self.build_s = time.perf_counter() - t0

    @staticmethod
    def _reduce(fun: ca.Function, n: int) -> ca.Function:
        """``fun`` mapped over n columns with all outputs summed."""
        return fun.map(n, [False] * fun.n_in(), [True] * fun.n_out())

    def parameter_vector(self, theta_vec, data, xs, rho: float, weights=None) -> np.ndarray:
        params, noise = self.model.params, self.model.noise
        (Xo, Uo, Yo, Mo), (X0, X1, U0) = stack_stages(data, xs)
        w_traj = np.ones(len(xs)) if weights is None else np.asarray(weights, float)
        if w_traj.shape != (len(xs),) or np.any(w_traj < 0) or not np.all(np.isfinite(w_traj)):
            raise ValueError(f"weights: expected {len(xs)} finite non-negative values, got {weights}")
        # a weight w scales a trajectory's squared residuals: multiply 1/sigma by sqrt(w)
        sq = np.sqrt(w_traj)
        iw = np.outer(1.0 / noise.process_std, np.repeat(sq, [T - 1 for T in data.lengths]))
        iv = np.outer(1.0 / noise.measurement_std, np.repeat(sq, data.lengths))
        base = np.asarray(theta_vec, float).copy()
        base[self.free] = 0.0
        mean, w = params.prior
        if not self.options.use_prior:
            w = np.zeros_like(w)
        vals = dict(p_base=base, Xo=Xo, Uo=Uo, Yo=Yo, Mo=Mo, X0=X0, X1=X1, U0=U0,
                    iw=iw, iv=iv,
                    z_prev=np.asarray(theta_vec, float)[self.free], rho=np.array([rho]),
                    mu=mean[self.free], w=w[self.free])
        return np.concatenate([np.asarray(vals[k], float).ravel(order="F") for k in self._names])

    def solve(self, theta_vec: np.ndarray, data, xs: list[np.ndarray], rho_theta: float | None = None,
              weights=None) -> LearnResult:
        """Learn the free parameters for fixed states ``xs`` (list of (T_b, nx)), warm-started at
        ``theta_vec`` (also the trust-region centre). Returns the full flat vector.

        ``weights`` (B,) optionally scales each trajectory's terms of J (e.g. SAEM weights of
        sampled trajectories); default 1.
        """
        rho = self.options.rho_theta if rho_theta is None else rho_theta
        P = self.parameter_vector(theta_vec, data, xs, rho, weights)
        params = self.model.params
        t0 = time.perf_counter()
        sol = self.solver(x0=np.asarray(theta_vec)[self.free], p=P,
                          lbx=params.lower[self.free], ubx=params.upper[self.free])
        wall = time.perf_counter() - t0
        st = self.solver.stats()
        out = np.asarray(theta_vec, float).copy()
        out[self.free] = np.asarray(sol["x"]).ravel()
        status = st["return_status"]
        return LearnResult(out, float(sol["f"]), status, status in ACCEPTABLE and np.all(np.isfinite(out)),
                           int(st["iter_count"]), wall)
