"""The joint problem max_{x, theta} J + log p(theta) as ONE IPOPT NLP over every trajectory's states and the free
parameters, its arrowhead Hessian assembled in CasADi Callbacks (docs/long_records.md, "The joint NLP")."""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import casadi as ca
import numpy as np

from ..objective._stages import StageFunctions, stack_stages
from ..runtime._callbacks import SparsityCallback
from ..runtime._schema import HESSIANS
from ..runtime._solve import ipopt_options, solve
from ..smoothing._structure import block_tridiagonal_upper
from ._hessian_blocks import ExactBlocks, gauss_newton_blocks
from ._joint_gauss_newton import JointGaussNewton

log = logging.getLogger(__name__)

__all__ = ["JOINT_HESSIANS", "JointResult", "JointSolver", "arrowhead_sparsity"]

JOINT_HESSIANS = (*HESSIANS, "auto")
# "auto": Gauss-Newton until the cost changes by less than this (relative) between iterates, then exact
AUTO_SWITCH = 1e-6


def block_tridiagonal_gather(nx: int, T: int):
    """``(sparsity, idx)``: `block_tridiagonal_upper` and, per nonzero, the (3, nnz) positions of its summands in the
    stacked ``[vec(H_obs) (nx, nx T); vec(H_dyn) (2nx, 2nx (T-1)); 0]`` (column-major stage blocks)."""
    n, two, off_d = nx, 2 * nx, nx * nx * T
    sp = block_tridiagonal_upper(n, T)
    (b, i), (c, j) = (np.divmod(np.array(a, dtype=np.int64), n) for a in sp.get_triplet())
    idx = np.full((3, b.size), off_d + two * two * (T - 1), dtype=np.int64)  # the trailing 0
    above = b < c  # block (c - 1, c): dynamics stage c - 1 at (i, n + j); else the observation stage c at (i, j)
    idx[0] = np.where(above, off_d + ((c - 1) * two + n + j) * two + i, (c * n + j) * n + i)
    idx[1] = np.where(~above & (c < T - 1), off_d + (c * two + j) * two + i, idx[1])  # dynamics stage c at (i, j)
    idx[2] = np.where(~above & (c > 0), off_d + ((c - 1) * two + n + j) * two + n + i, idx[2])  # c - 1, (n+i, n+j)
    return sp, idx


def arrowhead_sparsity(nx: int, lengths, nz: int) -> ca.Sparsity:
    """Upper triangle of the joint Hessian: per trajectory the block-tridiagonal (T_b nx)^2 pattern
    (`block_tridiagonal_upper`), then ``nz`` dense columns."""
    n_x = nx * sum(lengths)
    x_part = ca.diagcat(*[block_tridiagonal_upper(nx, int(T)) for T in lengths])
    top = ca.horzcat(x_part, ca.Sparsity.dense(n_x, nz))
    bottom = ca.horzcat(ca.Sparsity(nz, n_x), ca.Sparsity.upper(nz))
    return ca.vertcat(top, bottom)


@dataclass
class JointResult:
    """Outcome of one joint solve: flat parameter vector (np,), states (list of (T_b, nx)), IPOPT's status, iterations,
    wall (s)."""

    theta_vec: np.ndarray
    xs: list
    status: str
    iterations: int
    wall_s: float


class _Evaluator:
    """Cost, gradient and arrowhead Hessian values at one point (the last point is cached:
    IPOPT asks for the gradient and the Hessian at the same iterate)."""

    def __init__(self, model, data, stages: StageFunctions, hessian: str, use_prior: bool):
        self.model, self.data, self.hessian = model, data, hessian
        self.lengths = tuple(data.lengths)
        self.lin = JointGaussNewton(model, self.lengths, stages, use_prior=use_prior)
        self.free = model.params.free_index
        self.exact = None
        self.use_exact = hessian == "exact"
        self.last_cost = None
        if hessian in ("exact", "auto"):
            ex = stages if stages.hessian == "exact" else StageFunctions(model, "exact", stages.compile)
            self.exact = ExactBlocks(ex, sum(self.lengths), sum(T - 1 for T in self.lengths))
        nx = model.nx
        self.gathers = {T: block_tridiagonal_gather(nx, T)[1] for T in set(self.lengths)}
        self._key, self._val = None, None

    def split(self, w, p_base):
        """(theta_vec (np,), xs list of (T_b, nx)) of the decision vector ``w``."""
        nx, theta = self.model.nx, np.asarray(p_base, float).copy()
        n_x = nx * sum(self.lengths)
        theta[self.free] = w[n_x:]
        bounds = np.cumsum([0, *[nx * T for T in self.lengths]])
        return theta, [w[a:b].reshape(-1, nx) for a, b in itertools.pairwise(bounds)]

    def at(self, w: np.ndarray, p_base: np.ndarray):
        """``(cost, grad (n,), hessian nonzeros)`` at ``w`` (upper triangle, arrowhead order)."""
        key = (w.tobytes(), p_base.tobytes())
        if self._key != key:
            self._val = self._evaluate(w, p_base)
            self._key = key
        return self._val

    def _evaluate(self, w, p_base):
        m, nx, noise = self.model, self.model.nx, self.model.noise
        theta, xs = self.split(w, p_base)
        lin = self.lin
        ro, Jxo, Jpo, rd, Jzd, Jpd = lin.linearise(theta, self.data, xs)
        z = theta[self.free]
        nf = z.size
        cost = 0.5 * (ro.ravel() @ ro.ravel() + rd.ravel() @ rd.ravel())
        cost += 0.5 * float(lin.prior_w2 @ (z - lin.prior_mean) ** 2)
        w1sq = None if noise.x1_std is None else 1.0 / noise.x1_std ** 2
        if w1sq is not None:
            cost += sum(0.5 * float(w1sq @ (x[0] - noise.x1_mean) ** 2) for x in xs)
        gp = Jpd.reshape(-1, nf).T @ rd.ravel() + lin.prior_w2 * (z - lin.prior_mean)
        if Jpo is not None:
            gp += Jpo.reshape(-1, nf).T @ ro.ravel()
        if self.hessian == "auto" and not self.use_exact and self.last_cost is not None:
            # Gauss-Newton has reached its slow linear phase: switch to the exact Hessian
            self.use_exact = abs(self.last_cost - cost) <= AUTO_SWITCH * max(1.0, abs(cost))
        self.last_cost = cost
        if self.use_exact:
            Ho, Hd, Hxo, Hzd, Hpp = self.exact(m, theta, self.data, xs, self.free)
        else:
            Ho, Hd, Hxo, Hzd, Hpp = gauss_newton_blocks(Jxo, Jpo, Jzd, Jpd, nx)
        Hpp = Hpp + np.diag(lin.prior_w2)
        grads, x_vals, cross = [], [], []
        o0, d0 = 0, 0
        for b, T in enumerate(self.lengths):
            so, sd = slice(o0, o0 + T), slice(d0, d0 + T - 1)
            A, Bn = Jzd[sd, :, :nx], Jzd[sd, :, nx:]
            gx = np.einsum("tri,tr->ti", Jxo[so], ro[so])
            gx[:-1] += np.einsum("tri,tr->ti", A, rd[sd])
            gx[1:] += np.einsum("tri,tr->ti", Bn, rd[sd])
            Hob = Ho[so].copy()
            if w1sq is not None:
                gx[0] += w1sq * (xs[b][0] - noise.x1_mean)
                Hob[0][np.diag_indices(nx)] += w1sq
            grads.append(gx.ravel())
            # stacked [vec(H_obs) ; vec(H_dyn) ; 0] (column-major stage blocks), gathered into
            # the block-tridiagonal upper triangle's nonzeros
            v = np.concatenate([Hob.transpose(0, 2, 1).ravel(), Hd[sd].transpose(0, 2, 1).ravel(), [0.0]])
            idx = self.gathers[T]
            x_vals.append(v[idx[0]] + v[idx[1]] + v[idx[2]])
            Hxp = Hxo[so].copy()
            Hxp[:-1] += Hzd[sd, :nx]
            Hxp[1:] += Hzd[sd, nx:]
            cross.append(Hxp.reshape(T * nx, nf))
            o0, d0 = o0 + T, d0 + T - 1
        grad = np.concatenate([*grads, gp])
        Hxz = np.vstack(cross)  # (n_x, nf)
        # dense z columns: column j holds all x rows, then z rows 0..j
        cols = [np.concatenate([Hxz[:, j], Hpp[: j + 1, j]]) for j in range(nf)]
        return float(cost), grad, np.concatenate([*x_vals, *cols])


class _BufferCallback(SparsityCallback):
    """A CasADi Callback evaluated in numpy on CasADi's own buffers (zero copy)."""

    def __init__(self, name, sp_in, sp_out, names_in, names_out, fill):
        self.fill = fill
        super().__init__(name, sp_in, sp_out, names_in, names_out)

    def has_eval_buffer(self):
        return True

    def eval_buffer(self, arg, res):
        # an output CasADi does not need arrives as None
        args = [None if a is None else np.frombuffer(a, dtype=np.float64) for a in arg]
        outs = [None if r is None else np.frombuffer(r, dtype=np.float64) for r in res]
        self.fill(args, outs)
        return 0


class JointSolver:
    """IPOPT on the joint (x, theta) problem of one model and dataset (built once); ``hessian`` "auto": Gauss-Newton
    until the cost changes by less than ``AUTO_SWITCH`` (relative), then exact."""

    def __init__(self, model, data, stages: StageFunctions, *, hessian: str = "auto",
                 use_prior: bool = True, x_lower=None, x_upper=None, max_iter: int = 200, tol: float = 1e-10):
        if hessian not in JOINT_HESSIANS:
            raise ValueError(f"hessian must be one of {JOINT_HESSIANS}, got {hessian!r}")
        self.model, self.data = model, data
        nx, npar = model.nx, model.params.size
        self.lengths = tuple(int(T) for T in data.lengths)
        self.free = model.params.free_index
        nz, self.n_x = self.free.size, nx * sum(self.lengths)
        n = self.n_x + nz
        self.evaluator = ev = _Evaluator(model, data, stages, hessian, use_prior)
        self.sparsity = arrowhead_sparsity(nx, self.lengths, nz)

        def fill_grad(args, outs):
            f, g, _ = ev.at(args[0], args[1])
            if outs[0] is not None:
                outs[0][0] = f
            if outs[1] is not None:
                outs[1][:] = g

        def fill_hess(args, outs):
            outs[0][:] = args[2][0] * ev.at(args[0], args[1])[2]

        dense = ca.Sparsity.dense
        self._grad_cb = _BufferCallback("joint_grad_f", [dense(n, 1), dense(npar, 1)], [dense(1, 1), dense(n, 1)],
                                        ["x", "p"], ["f", "grad_f_x"], fill_grad)
        self._hess_cb = _BufferCallback("joint_hess_lag", [dense(n, 1), dense(npar, 1), dense(1, 1), ca.Sparsity(0, 1)],
                                        [self.sparsity], ["x", "p", "lam_f", "lam_g"], ["triu_hess_gamma_x_x"],
                                        fill_hess)
        w, p_base = ca.MX.sym("w", n), ca.MX.sym("p", npar)
        # warm start near the optimum (after an EM step): a small initial barrier parameter saves the
        # iterations of driving it down (measured: 17 instead of 22 IPOPT iterations, WH 4 x 500)
        opts = ipopt_options(max_iter, tol, grad_f=self._grad_cb, hess_lag=self._hess_cb, **{"ipopt.mu_init": 1e-6})
        self.solver = ca.nlpsol("joint", "ipopt", {"x": w, "p": p_base, "f": self._cost_expression(w, p_base, stages)}, opts)
        lo = np.broadcast_to(np.asarray(-np.inf if x_lower is None else x_lower, float), (nx,))
        hi = np.broadcast_to(np.asarray(np.inf if x_upper is None else x_upper, float), (nx,))
        n_t = sum(self.lengths)
        params = model.params
        self._lbw = np.concatenate([np.tile(lo, n_t), params.lower[self.free]])
        self._ubw = np.concatenate([np.tile(hi, n_t), params.upper[self.free]])

    def _cost_expression(self, w, p_base, stages: StageFunctions):
        """The objective as a CasADi expression of mapped SX stage costs (IPOPT evaluates f from it;
        CasADi must be able to differentiate it, so the raw SX Functions are used, not compiled ones)."""
        m, nx, lin = self.model, self.model.nx, self.evaluator.lin
        bounds = np.cumsum([0, *[nx * T for T in self.lengths]])
        Xb = [ca.reshape(w[int(a):int(b)], nx, T) for a, b, T in zip(bounds[:-1], bounds[1:], self.lengths)]
        (_, Uo, Yo, Mo), (_, _, U0) = stack_stages(self.data, [np.zeros((T, nx)) for T in self.lengths])
        n_p, nz = m.params.size, self.free.size
        E = ca.DM(ca.Sparsity.triplet(n_p, nz, self.free.tolist(), list(range(nz))), 1.0)
        fixed = np.ones(n_p)
        fixed[self.free] = 0.0
        z = w[self.n_x:]
        p = fixed * p_base + ca.mtimes(E, z)
        noise = m.noise
        iv = np.repeat((1.0 / noise.measurement_std)[:, None], Yo.shape[1], axis=1)
        iw = np.repeat((1.0 / noise.process_std)[:, None], U0.shape[1], axis=1)
        X0 = ca.horzcat(*[X[:, :-1] for X in Xb])
        X1 = ca.horzcat(*[X[:, 1:] for X in Xb])
        cost = ca.sum2(stages.obs_cost.map(Yo.shape[1])(ca.horzcat(*Xb), Uo, Yo, Mo, p, iv))
        cost += ca.sum2(stages.dyn_cost.map(U0.shape[1])(X0, X1, U0, p, iw))
        cost += 0.5 * ca.sumsqr(np.sqrt(lin.prior_w2) * (z - lin.prior_mean))
        if noise.x1_std is not None:
            cost += sum(0.5 * ca.sumsqr((X[:, 0] - noise.x1_mean) / noise.x1_std) for X in Xb)
        return cost

    def try_solve(self, theta_vec, xs) -> JointResult | None:
        """`solve`, or None when it raised (an evaluation error inside IPOPT's callbacks) or
        returned non-finite values."""
        try:
            jr = self.solve(theta_vec, xs)
        except RuntimeError as exc:
            log.warning("joint solve failed (%s)", exc)
            return None
        finite = np.all(np.isfinite(jr.theta_vec)) and all(np.all(np.isfinite(x)) for x in jr.xs)
        return jr if finite else None

    def solve(self, theta_vec, xs) -> JointResult:
        """Solve from ``(theta_vec (np,), xs list of (T_b, nx))``; IPOPT's last iterate is returned
        whatever its status (the caller checks that it improves J)."""
        theta_vec = np.asarray(theta_vec, float)
        w0 = np.concatenate([np.asarray(x, float).ravel() for x in xs] + [theta_vec[self.free]])
        self.evaluator.use_exact = self.evaluator.hessian == "exact"
        self.evaluator.last_cost = None
        t0 = time.perf_counter()
        sol = solve(self.solver, x0=w0, p=theta_vec, lbx=self._lbw, ubx=self._ubw)
        wall = time.perf_counter() - t0
        st = self.solver.stats()
        theta, new_xs = self.evaluator.split(np.asarray(sol["x"]).ravel(), theta_vec)
        return JointResult(theta, [x.copy() for x in new_xs], st["return_status"], int(st["iter_count"]), wall)
