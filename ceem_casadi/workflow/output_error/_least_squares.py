"""The output-error problem of the Levenberg-Marquardt engine: weighted residuals, continuity gaps
and their exact sparse Jacobians from forward sensitivities (docs/output_error.md)."""
from __future__ import annotations

import logging

import casadi as ca
import numpy as np
import scipy.sparse as sps

from ...io._data import Trajectories
from ...model._simulation import rollout, run
from ...runtime._compile import compile_or_none
from ...runtime._linalg import BufferedCall
from ...runtime._model_cache import cached
from ._lm import EXPLODING, LeastSquaresProblem, half_squared_norm
from ._shooting import ShootingLayout
from ._trust_region import DENSE_MAX

__all__ = ["OutputErrorLeastSquares", "output_error_problem"]

logger = logging.getLogger(__name__)
#: doubles of augmented states (x, dx/dx0, dx/dz) per mapped sensitivity call (chunks of time, docs/output_error.md)
CHUNK_DOUBLES = 5e5
SEGMENT_GROWTH = 10.0   # growth of the output error over one segment of the advised multiple shooting (measured)


class OutputErrorLeastSquares(LeastSquaresProblem):
    """The output-error problem of one model, set of lengths and shooting (`output_error_problem`): ``evaluate``
    gives the weighted residuals (prior rows appended), their Jacobian (dense for single shooting with few
    unknowns, else sparse CSC), the gaps and their Jacobian at ``w`` = (free parameters, nodes (n_nodes, nx))."""

    def __init__(self, model, lengths, shooting, compiled: bool = False):
        self.compiled = bool(compiled)
        self.model, self.lengths, self.shooting = model, tuple(lengths), shooting
        nx, nu, ny = model.nx, model.nu, model.ny
        self.free = model.params.free_index
        nf = self.free.size
        layout = ShootingLayout.of(self.lengths, shooting)
        self.segs, self.groups, n_u, n_obs = layout.segs, layout.groups, layout.n_u, layout.n_obs
        w = ca.MX.sym("w", nf + nx * len(self.segs))
        z, nodes = w[:nf], ca.reshape(w[nf:], nx, len(self.segs))
        npar = model.params.size
        syms = dict(p_base=ca.MX.sym("p_base", npar), U=ca.MX.sym("U", nu, n_u), Y=ca.MX.sym("Y", ny, n_obs),
                    M=ca.MX.sym("M", ny, n_obs), iv=ca.MX.sym("iv", ny))
        self._E = ca.DM(ca.Sparsity.triplet(npar, nf, self.free.tolist(), list(range(nf))), 1.0)   # p = p_base + E z
        pvec = syms["p_base"] + ca.mtimes(self._E, z)
        Yhat, g = layout.free_runs(lambda L: rollout(model, L), nodes, syms["U"], pvec)
        r = ca.vec(syms["M"] * ca.repmat(syms["iv"], 1, n_obs) * (syms["Y"] - Yhat))
        self.F = ca.Function("oe_residuals", [w, *syms.values()], [r, g])
        self._F_call = None        # the residual Function's buffered call (compiled first for long records)
        self._sens = None          # built at the first Jacobian (a problem used for values only never builds it)
        self.n_con, self.nw = int(g.numel()), int(w.numel())
        self.c_scale = np.ones(self.n_con)
        self._data = self._last = self._single = None   # the bound data; the last Jacobian evaluation (w, result)
        self._prior = (np.zeros(nf), np.zeros(nf))

    def _build_sensitivities(self, model, nf):
        """``x[t+1] = f``, ``S[t+1] = f_x S + [f_z 0]`` for the directions ``(z, x0)`` (``S[0] = [0 I]``) as SX
        step mapped over chunks of time (``mapaccum``, `_chunked`) and over the segments of every length (one
        step: the model and its Jacobians once per sample); the observations of every node."""
        nx, nu, ny, npar = model.nx, model.nu, model.ny, model.params.size
        x, u, pb, z = ca.SX.sym("x", nx), ca.SX.sym("u", nu), ca.SX.sym("pb", npar), ca.SX.sym("z", nf)
        p = pb + ca.mtimes(self._E, z)
        fx_, gx_ = model.f(x, u, p), model.g(x, u, p)
        fx, gx = ca.jacobian(fx_, x), ca.jacobian(gx_, x)
        seed_f = ca.horzcat(ca.jacobian(fx_, z), ca.SX(nx, nx))     # d/dz = d/dp E (p = pb + E z); x0: no seed
        seed_g = ca.horzcat(ca.jacobian(gx_, z), ca.SX(ny, nx))
        S = ca.SX.sym("S", nx, nf + nx)
        xa = ca.vertcat(x, ca.vec(S))
        step = ca.Function("oe_sens", [xa, u, pb, z], [ca.vertcat(fx_, ca.vec(fx @ S + seed_f)),
                                                       ca.vertcat(gx_, ca.vec(gx @ S + seed_g))])
        if self.compiled:
            compiled = compile_or_none([step], f"oe_sens_{model.name}", logger, "output error: the sensitivity step")
            self.compiled, step = compiled is not None, (compiled or [step])[0]
        self._sens = [self._chunked(step, L, len(idx), xa.numel(), nu, npar, nf) for L, idx in self.groups]
        obs_src, self._node_obs, u_col, n_obs = [], [], 0, 0    # observation -> column of the groups' outputs
        for L, idx in self.groups:
            for jj, i in enumerate(idx):
                n = self.segs[i][2]
                obs_src.append(u_col + jj * L + np.arange(n))
                self._node_obs.append((i, slice(n_obs, n_obs + n)))
                n_obs += n
            u_col += L * len(idx)
        obs_src = np.concatenate(obs_src)
        self._obs_src = None if np.array_equal(obs_src, np.arange(u_col)) else obs_src
        self._gap_list = [(i, gi, jj) for gi, (L, idx) in enumerate(self.groups)
                          for jj, i in enumerate(idx) if self.segs[i][3]]

    @staticmethod
    def _chunked(step, L, n_seg, na, nu, npar, nf):
        """``[(start, K, call)]`` covering the L samples of n_seg segments in chunks of K samples (at most
        `CHUNK_DOUBLES` augmented states per call); ``call(xa (na, n_seg), U (nu, n_seg K), pb, z)`` -> the
        chunk's outputs and their derivatives, its last augmented states and the next ones (dense)."""
        K = int(max(1, min(L, CHUNK_DOUBLES // (na * n_seg))))
        calls = {}
        for k in {K, L % K} - {0}:
            xa, Um, pbm, zm = ca.MX.sym("xa", na), ca.MX.sym("U", nu, k), ca.MX.sym("pb", npar), ca.MX.sym("z", nf)
            Xa, Y = step.mapaccum(k)(xa, Um, pbm, zm)       # the states after samples 1..k, the outputs of 0..k-1
            one = ca.Function(f"oe_sens_K{k}", [xa, Um, pbm, zm],
                              [ca.densify(Y), ca.densify(xa if k == 1 else Xa[:, k - 2]), ca.densify(Xa[:, k - 1])])
            calls[k] = BufferedCall(one.map(n_seg, [False, False, True, True], [False, False, False])
                                    if n_seg > 1 else one)
        return [(a, min(K, L - a), calls[min(K, L - a)]) for a in range(0, L, K)]

    def _sensitivity_run(self, chunks, L, xa, U, pb, z):
        """The outputs and their derivatives (n_seg, L, 1 + nf + nx, ny) and the last states and sensitivities
        (n_seg, 1 + nf + nx, nx) of one group of segments from ``xa`` (na, n_seg)."""
        m, (n_seg, nu) = self.model, (xa.shape[1], U.shape[0])
        U, Ya = U.reshape(nu, n_seg, L), np.empty((n_seg, L, 1 + self.free.size + m.nx, m.ny))
        for a, k, call in chunks:
            Yc, last, nxt = call(xa, U[:, :, a:a + k].reshape(nu, n_seg * k), pb, z)
            Ya[:, a:a + k] = Yc.reshape(n_seg, k, -1, m.ny)       # columns j k + t
            xa = nxt.reshape(-1, n_seg, order="F").copy()
        return Ya, last.reshape(n_seg, -1, m.nx).copy()

    def _jacobian(self, w):
        """``(r, J, g, C)`` from the forward sensitivities (see `_build_sensitivities`)."""
        nx, ny, nf = self.model.nx, self.model.ny, self.free.size
        if self._sens is None:
            self._build_sensitivities(self.model, nf)
        z, nodes, pb, U = w[:nf], w[nf:].reshape(-1, nx), self._pbase, self._U
        S0 = np.hstack([np.zeros((nx, nf)), np.eye(nx)]).ravel(order="F")[:, None]     # (z, x0) directions
        Ys, ends, u_col = [], [], 0
        for (L, idx), chunks in zip(self.groups, self._sens):
            xa = np.vstack([nodes[idx].T, np.tile(S0, (1, len(idx)))])
            Ya, Xe = self._sensitivity_run(chunks, L, xa, U[:, u_col:u_col + L * len(idx)], pb, z)
            Ys.append(Ya.reshape(L * len(idx), 1 + nf + nx, ny))
            ends.append(Xe)
            u_col += L * len(idx)
        Ya = np.concatenate(Ys) if len(Ys) > 1 else Ys[0]
        Ya = Ya if self._obs_src is None else Ya[self._obs_src]         # (n_obs, 1 + nf + nx, ny)
        n_obs = Ya.shape[0]
        if not np.all(np.isfinite(Ya)):
            return None
        wgt = (self._M * self._iv[:, None]).T                      # (n_obs, ny)
        r = (wgt * (self._Y.T - Ya[:, 0])).ravel()
        d = Ya[:, 1:].transpose(0, 2, 1)                           # [c, j, k] = dy_j / d(z, x0)_k
        mw, wp = -wgt[:, :, None], self._prior[1]
        n_p = nf if np.any(wp) else 0                              # the prior's rows
        if self.shooting is None and self.nw <= DENSE_MAX and n_obs * ny * self.nw <= 5e7:   # dense: cheaper
            J = np.zeros((n_obs * ny + n_p, self.nw))
            J[n_obs * ny + np.arange(n_p), np.arange(n_p)] = wp[:n_p]
            Jo = J[:n_obs * ny].reshape(n_obs, ny, self.nw)
            np.multiply(mw, d[:, :, :nf], out=Jo[:, :, :nf])
            for i, s in self._node_obs:
                np.multiply(mw[s], d[s, :, nf:], out=Jo[s, :, nf + i * nx:nf + (i + 1) * nx])
        else:
            rows = np.broadcast_to(np.arange(n_obs * ny).reshape(n_obs, ny, 1), d.shape)
            cols = np.broadcast_to(np.arange(nf + nx), d.shape).copy()
            for i, s in self._node_obs:
                cols[s, :, nf:] += i * nx
            J = sps.csc_matrix((np.r_[(mw * d).ravel(), wp[:n_p]], (np.r_[rows.ravel(), n_obs * ny + np.arange(n_p)],
                                np.r_[cols.ravel(), np.arange(n_p)])), shape=(n_obs * ny + n_p, self.nw))
        q = len(self._gap_list)
        g = np.zeros(q * nx)
        Cr, Cc, Cv = [], [], []
        for k, (i, gi, jj) in enumerate(self._gap_list):
            xa = ends[gi][jj]                                      # (1 + nf + nx, nx): x, then S^T
            g[k * nx:(k + 1) * nx] = xa[0] - nodes[i + 1]
            rr, cols = k * nx + np.arange(nx), np.r_[np.arange(nf), nf + i * nx + np.arange(nx)]
            Cr += [np.repeat(rr, nf + nx), rr]
            Cc += [np.tile(cols, nx), nf + (i + 1) * nx + np.arange(nx)]
            Cv += [xa[1:].T.ravel(), -np.ones(nx)]
        G = sps.csc_matrix((np.concatenate(Cv), (np.concatenate(Cr), np.concatenate(Cc))), shape=(q * nx, self.nw)) \
            if q else sps.csc_matrix((0, self.nw))
        if not (np.all(np.isfinite(g)) and np.all(np.isfinite(G.data))):
            return None
        return r, J, g, G

    def set_data(self, model, theta_vec, data: Trajectories, use_prior: bool) -> None:
        """Bind the data (segment order), weights and base parameters (free entries zeroed)."""
        self._last = None
        base = np.asarray(theta_vec, float).copy()
        base[self.free] = 0.0
        U, Y = [], []
        for L, idx in self.groups:
            for i in idx:
                b, s0, n, _ = self.segs[i]
                U.append(data.inputs(b)[s0:s0 + L].T)
                Y.append(data.y[b][s0:s0 + n].T)
        Y = np.hstack(Y)
        mask = np.isfinite(Y)
        self._U, self._Y, self._M = np.hstack(U), np.where(mask, Y, 0.0), mask.astype(float)
        self._pbase, self._iv = base, np.asarray(model.noise.inv_measurement_std, float)
        self._data = (base, self._U, self._Y, self._M, self._iv)
        self._records = [(data.inputs(b), data.y[b]) for b in range(len(data))]
        mean, wp = model.params.prior
        self._prior = (np.asarray(mean, float)[self.free], (np.asarray(wp, float) if use_prior
                                                            else np.zeros(model.params.size))[self.free])
        if self.shooting is not None:
            self._single = output_error_problem(model, self.lengths, None)
            self._single.set_data(model, theta_vec, data, use_prior)

    def evaluate(self, w, jac):
        """``(r, J, g, C)`` at ``w`` (module docstring; J, C None without ``jac``), None when not finite."""
        if jac and self._last is not None and np.array_equal(self._last[0], w):
            return self._last[1]
        with np.errstate(all="ignore"):
            out = self._jacobian(w) if jac else self._casadi(w, jac)
        if out is None:
            return None
        r, J, g, G = out
        mu, wp = self._prior
        if np.any(wp):      # the prior's rows (J has them: `_jacobian`)
            r = np.concatenate([r, wp * (w[:self.free.size] - mu)])
        if jac:
            self._last = (np.array(w, float), (r, J, g, G))
        return r, J, g, G

    def _casadi(self, w, jac):
        """``(r, None, g, None)`` from the residual Function (compiled first for long records); None when not finite."""
        if self._F_call is None:      # numpy buffers: converting 10^5 residuals from DM cost half the call
            if self.compiled:
                self.F = (compile_or_none([self.F], f"oe_residuals_{self.model.name}", logger,
                                          "output error: the residuals") or [self.F])[0]
            self._F_call = BufferedCall(self.F)
        r, g = (a.copy() for a in self._F_call(w, *self._data))
        return (r, None, g, None) if np.all(np.isfinite(r)) and np.all(np.isfinite(g)) else None

    def reference_cost(self) -> float:
        """``0.5 ||weighted y||^2``: the objective of predicting zero output (exploding-run guard)."""
        return 0.5 * float(np.sum((self._M * self._iv[:, None] * self._Y) ** 2))

    def exploding_advice(self, w) -> str | None:
        """Advice naming the segment length over which the free run from ``w`` grows by at most `SEGMENT_GROWTH`
        (measured as docs/output_error.md says); None when segments as long as the shortest record would do."""
        tv, nodes = self._pbase.copy(), w[self.free.size:].reshape(-1, self.model.nx)[self.first_nodes()]
        tv[self.free] = w[:self.free.size]
        rho = 0.0
        for x0, (u, y) in zip(nodes, self._records):
            with np.errstate(all="ignore"):
                e = np.abs((y - run(self.model, tv, x0, u)[0]) * self._iv)
            e = np.where(np.isfinite(e), e, 0.0).max(axis=1)     # 0: missing or overflowed
            ts = np.arange(int(np.argmax(e)) // 2, int(np.argmax(e)) + 1)
            ts = ts[e[ts] > 0]
            rho = max(rho, np.exp(np.polyfit(ts, np.log(e[ts]), 1)[0]) if ts.size >= 2 else 0.0)
        k = max(1, int(np.log(SEGMENT_GROWTH) / np.log(rho))) if rho > 1.0 else min(self.lengths)
        grows = f"The free run's output error grows by a factor {rho:.3g} per sample"
        if k >= min(self.lengths):
            return None
        if self.shooting is not None and k >= self.shooting:
            return f"{grows}; segments of {self.shooting} samples are short enough: try another start (starts=...)."
        return (f"{grows}: use multiple shooting with shooting={k} (segments of {k} samples, over which it grows by "
                f"at most {SEGMENT_GROWTH:g}), another start (starts=...), or bounds that keep the model stable.")

    def first_nodes(self) -> list[int]:
        """Index of every trajectory's first node."""
        return [i for i, (_, s0, _, _) in enumerate(self.segs) if s0 == 0]

    def objective(self, w, r=None):
        """Single-shooting objective (free run from every trajectory's first node)."""
        if self.shooting is None:
            return LeastSquaresProblem.objective(self, w, r)
        nf, nx = self.free.size, self.model.nx
        ws = np.concatenate([w[:nf], w[nf:].reshape(-1, nx)[self.first_nodes()].ravel()])
        with np.errstate(all="ignore"):
            return self._single.objective(ws)

    def initial_nodes(self, model, theta_vec, data: Trajectories, x0: np.ndarray) -> np.ndarray:
        """(n_nodes, nx): the free run from x0 at the nodes (EKF/RTS states where it is not finite)."""
        from ...smoothing._initial_states import eks_states

        runs = []
        for b in range(len(data)):
            with np.errstate(all="ignore"):
                yh, x = run(model, theta_vec, x0[b], data.inputs(b))
            if self.shooting is not None and _explodes(yh, data.y[b], model.noise.inv_measurement_std):
                x = eks_states(model, theta_vec, data[b])[0]
                x[0] = x0[b]
            runs.append(x)
        return np.array([runs[b][s0] for b, s0, _, _ in self.segs])


def _explodes(yhat, y, inv_std) -> bool:
    """Whether a free run's outputs ``yhat`` (T, ny) are not finite or explode (`EXPLODING`): multiple
    shooting then starts its nodes from the EKF/RTS states."""
    if not np.all(np.isfinite(yhat)):
        return True
    e, z = (np.where(np.isfinite(y), v * inv_std, 0.0) for v in (y - yhat, y))
    return 2 * half_squared_norm(e.ravel()) > EXPLODING * max(2 * half_squared_norm(z.ravel()), 1e-300)


def output_error_problem(model, lengths, shooting, compiled: bool = False) -> OutputErrorLeastSquares:
    """The cached `OutputErrorLeastSquares` of ``model`` for these lengths and shooting (``compiled``:
    the sensitivity step compiled to native code, from `COMPILE_SAMPLES` samples)."""
    key = (tuple(int(t) for t in lengths), None if shooting is None else int(shooting), bool(compiled))
    # per thread: the problem keeps its data and evaluation buffers (runtime/_model_cache.py)
    return cached(model, "output-error least squares", key, lambda: OutputErrorLeastSquares(model, *key),
                  per_thread=True)
