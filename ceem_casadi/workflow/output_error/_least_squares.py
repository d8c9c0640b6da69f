"""The output-error problem of the Levenberg-Marquardt engine: weighted residuals, continuity gaps
and their exact sparse Jacobians from forward sensitivities (docs/output_error.md)."""
from __future__ import annotations

import logging

import casadi as ca
import numpy as np
import scipy.sparse as sps

from ...io._data import Trajectories
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


class OutputErrorLeastSquares(LeastSquaresProblem):
    """The output-error problem of one model, set of trajectory lengths and shooting (cached, one per
    thread: `output_error_problem`). ``evaluate(w, jac)``: the weighted residuals (prior rows
    appended), their Jacobian (dense for single shooting with few unknowns, else sparse CSC), the
    continuity gaps and their sparse Jacobian; ``w`` = (free parameters, nodes (n_nodes, nx) by row).
    """

    def __init__(self, model, lengths, shooting, compiled: bool = False):
        from ...model._simulation import rollout

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
        E = ca.DM(ca.Sparsity.triplet(npar, nf, self.free.tolist(), list(range(nf))), 1.0)
        pvec = syms["p_base"] + ca.mtimes(E, z)
        Yhat, g = layout.free_runs(lambda L: rollout(model, L), nodes, syms["U"], pvec)
        r = ca.vec(syms["M"] * ca.repmat(syms["iv"], 1, n_obs) * (syms["Y"] - Yhat))
        self.F = ca.Function("oe_residuals", [w, *syms.values()], [r, g])
        self._F_compiled = False
        self._sens = None          # built at the first Jacobian (a problem used for values only never builds it)
        self.n_con = int(g.numel())
        self.nw = int(w.numel())
        self.c_scale = np.ones(self.n_con)
        self._data = self._last = None      # the bound data; the last Jacobian evaluation (w, result)
        self._single = None
        self._prior = (np.zeros(nf), np.zeros(nf))

    def _build_sensitivities(self, model, nf):
        """``x[t+1] = f``, ``S_x[t+1] = f_x S_x``, ``S_z[t+1] = f_x S_z + f_p E`` as one SX step mapped
        over chunks of time (``mapaccum``, `_chunked`) and over the segments of every length, and the index
        arrays that scatter ``dy/dx0``, ``dy/dz`` and the gaps' derivatives into J and C."""
        nx, nu, npar = model.nx, model.nu, model.params.size
        x, u = ca.SX.sym("x", nx), ca.SX.sym("u", nu)
        Sx, Sz = ca.SX.sym("Sx", nx, nx), ca.SX.sym("Sz", nx, nf)
        pb, z = ca.SX.sym("pb", npar), ca.SX.sym("z", nf)
        E = ca.DM(ca.Sparsity.triplet(npar, nf, self.free.tolist(), list(range(nf))), 1.0)
        p = pb + ca.mtimes(E, z)
        fx_, gx_ = model.f(x, u, p), model.g(x, u, p)
        fx, fp = ca.jacobian(fx_, x), ca.jacobian(fx_, z)       # d/dz = d/dp E (p = pb + E z)
        gx, gp = ca.jacobian(gx_, x), ca.jacobian(gx_, z)
        xa = ca.vertcat(x, ca.vec(Sx), ca.vec(Sz))
        step = ca.Function("oe_sens_step", [xa, u, pb, z],
                           [ca.vertcat(fx_, ca.vec(ca.mtimes(fx, Sx)), ca.vec(ca.mtimes(fx, Sz) + fp))])
        out = ca.Function("oe_sens_out", [xa, u, pb, z],
                          [ca.vertcat(gx_, ca.vec(ca.mtimes(gx, Sx)), ca.vec(ca.mtimes(gx, Sz) + gp))])
        na = xa.numel()
        if self.compiled:
            compiled = compile_or_none([step, out], f"oe_sens_{model.name}", logger, "output error: the sensitivity step")
            self.compiled = compiled is not None
            step, out = compiled or (step, out)
        self._sens = [self._chunked(step, out, L, len(idx), na, nu, npar, nf) for L, idx in self.groups]
        # scatter indices: residual rows (obs column c, output j) -> r index c * ny + j
        cols_node, tcols = [], []
        u_col = 0
        for L, idx in self.groups:
            for jj, i in enumerate(idx):
                n = self.segs[i][2]
                cols_node.append(np.full(n, i))
                tcols.append(u_col + jj * L + np.arange(n))        # column of the group's outputs
            u_col += L * len(idx)
        self._obs_node = np.concatenate(cols_node)
        self._obs_src = np.concatenate(tcols)                      # column in the concatenated group outputs
        self._gap_list = [(i, gi, jj) for gi, (L, idx) in enumerate(self.groups)
                          for jj, i in enumerate(idx) if self.segs[i][3]]

    @staticmethod
    def _chunked(step, out, L, n_seg, na, nu, npar, nf):
        """``[(start, K, call)]`` covering the L samples of n_seg segments in chunks of K samples (at
        most `CHUNK_DOUBLES` augmented states per call); ``call(xa (na, n_seg), U (nu, n_seg K), pb, z)``
        -> the chunk's augmented outputs, its last augmented state and the next one (dense)."""
        K = int(max(1, min(L, CHUNK_DOUBLES // (na * n_seg))))
        calls = {}
        for k in {K, L % K} - {0}:
            xa, Um, pbm, zm = ca.MX.sym("xa", na), ca.MX.sym("U", nu, k), ca.MX.sym("pb", npar), ca.MX.sym("z", nf)
            Xa = xa if k == 1 else ca.horzcat(xa, step.mapaccum(k - 1)(xa, Um[:, :k - 1], pbm, zm))
            last = Xa[:, k - 1]
            one = ca.Function(f"oe_sens_K{k}", [xa, Um, pbm, zm],
                              [ca.densify(out.map(k)(Xa, Um, pbm, zm)), ca.densify(last),
                               ca.densify(step(last, Um[:, k - 1], pbm, zm))])
            calls[k] = BufferedCall(one.map(n_seg, [False, False, True, True], [False, False, False])
                                    if n_seg > 1 else one)
        return [(a, min(K, L - a), calls[min(K, L - a)]) for a in range(0, L, K)]

    def _sensitivity_run(self, chunks, L, xa, U, pb, z):
        """The augmented outputs (rows, n_seg, L) and last augmented states (na, n_seg) of one group."""
        (n_seg, nu), m = (xa.shape[1], U.shape[0]), self.model
        U, Ya = U.reshape(nu, n_seg, L), np.empty((m.ny * (1 + m.nx + self.free.size), n_seg, L))
        for a, k, call in chunks:
            Yc, last, nxt = call(xa, U[:, :, a:a + k].reshape(nu, n_seg * k), pb, z)
            Ya[:, :, a:a + k] = Yc.reshape(-1, k, n_seg, order="F").transpose(0, 2, 1)   # columns j k + t
            xa = nxt.reshape(-1, n_seg, order="F").copy()
        return Ya, last.reshape(-1, n_seg, order="F").copy()

    def _jacobian(self, w):
        """``(r, J, g, C)`` from the forward sensitivities (see `_build_sensitivities`)."""
        nx, ny, nf = self.model.nx, self.model.ny, self.free.size
        if self._sens is None:
            self._build_sensitivities(self.model, nf)
        z, nodes, pb, U = w[:nf], w[nf:].reshape(-1, nx), self._pbase, self._U
        Ys, ends, u_col = [], [], 0
        for (L, idx), chunks in zip(self.groups, self._sens):
            xa = np.vstack([nodes[idx].T, np.tile(np.eye(nx).ravel(order="F")[:, None], (1, len(idx))),
                            np.zeros((nx * nf, len(idx)))])
            Ya, Xe = self._sensitivity_run(chunks, L, xa, U[:, u_col:u_col + L * len(idx)], pb, z)
            Ys.append(Ya.reshape(Ya.shape[0], L * len(idx)))
            ends.append(Xe)
            u_col += L * len(idx)
        Ya = (np.hstack(Ys) if len(Ys) > 1 else Ys[0])[:, self._obs_src]                      # (ny (1 + nx + nf), n_obs)
        n_obs = Ya.shape[1]
        wgt = self._M * self._iv[:, None]                          # (ny, n_obs)
        r = (wgt * (self._Y - Ya[:ny])).ravel(order="F")
        if not np.all(np.isfinite(Ya)):
            return None
        dx0 = Ya[ny:ny + ny * nx].reshape(nx, ny, n_obs)           # [k, j, c] = dy_j/dx0_k
        dz = Ya[ny + ny * nx:].reshape(nf, ny, n_obs)
        vz = -(wgt[None] * dz)                                     # (nf, ny, n_obs)
        vx = -(wgt[None] * dx0)
        if self.shooting is None and self.nw <= DENSE_MAX and n_obs * ny * self.nw <= 5e7:   # dense: cheaper
            J = np.zeros((n_obs, ny, self.nw))
            J[:, :, :nf] = vz.transpose(2, 1, 0)
            for b_node in np.unique(self._obs_node):
                sel = self._obs_node == b_node
                J[sel, :, nf + b_node * nx:nf + (b_node + 1) * nx] = vx[:, :, sel].transpose(2, 1, 0)
            J = J.reshape(n_obs * ny, self.nw)
        else:
            rows = (np.arange(n_obs)[None, :] * ny + np.arange(ny)[:, None])  # (ny, n_obs): r index
            R1 = np.broadcast_to(rows[None], (nf, ny, n_obs))
            C1 = np.broadcast_to(np.arange(nf)[:, None, None], (nf, ny, n_obs))
            R2 = np.broadcast_to(rows[None], (nx, ny, n_obs))
            C2 = nf + self._obs_node[None, None, :] * nx + np.arange(nx)[:, None, None]
            J = sps.csc_matrix((np.concatenate([vz.ravel(), vx.ravel()]),
                                (np.concatenate([R1.ravel(), R2.ravel()]),
                                 np.concatenate([C1.ravel(), np.broadcast_to(C2, R2.shape).ravel()]))),
                               shape=(n_obs * ny, self.nw))
        q = len(self._gap_list)
        g = np.zeros(q * nx)
        Cr, Cc, Cv = [], [], []
        for k, (i, gi, jj) in enumerate(self._gap_list):
            xa = ends[gi][:, jj]
            g[k * nx:(k + 1) * nx] = xa[:nx] - nodes[i + 1]
            Sx = xa[nx:nx + nx * nx].reshape(nx, nx, order="F")
            Sz = xa[nx + nx * nx:].reshape(nx, nf, order="F")
            rr = k * nx + np.arange(nx)
            Cr += [np.repeat(rr, nf), np.repeat(rr, nx), rr]
            Cc += [np.tile(np.arange(nf), nx), np.tile(nf + i * nx + np.arange(nx), nx), nf + (i + 1) * nx + np.arange(nx)]
            Cv += [Sz.ravel(), Sx.ravel(), -np.ones(nx)]
        G = sps.csc_matrix((np.concatenate(Cv), (np.concatenate(Cr), np.concatenate(Cc))), shape=(q * nx, self.nw)) \
            if q else sps.csc_matrix((0, self.nw))
        if not (np.all(np.isfinite(g)) and np.all(np.isfinite(G.data))):
            return None
        return r, J, g, G

    # -- data ---------------------------------------------------------------------------------
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
        self._data = [ca.DM(a) for a in (base, self._U, self._Y, self._M, self._iv)]
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
        nf = self.free.size
        mu, wp = self._prior
        if np.any(wp):      # the prior's rows
            r = np.concatenate([r, wp * (w[:nf] - mu)])
            if J is not None:
                Jp = sps.csc_matrix((wp, (np.arange(nf), np.arange(nf))), shape=(nf, self.nw))
                J = np.vstack([J, Jp.toarray()]) if isinstance(J, np.ndarray) else sps.vstack([J, Jp], format="csc")
        if jac:
            self._last = (np.array(w, float), (r, J, g, G))
        return r, J, g, G

    def _casadi(self, w, jac):
        """``(r, None, g, None)`` by CasADi's residual Function (compiled at its first call when the
        sensitivities are); None when not finite."""
        if self.compiled and not self._F_compiled:
            self._F_compiled = True
            self.F = (compile_or_none([self.F], f"oe_residuals_{self.model.name}", logger,
                                      "output error: the residuals") or [self.F])[0]
        r, g = (np.asarray(a, float).ravel() for a in self.F(w, *self._data))
        return (r, None, g, None) if np.all(np.isfinite(r)) and np.all(np.isfinite(g)) else None

    def reference_cost(self) -> float:
        """``0.5 ||weighted y||^2``: the objective of predicting zero output (exploding-run guard)."""
        return 0.5 * float(np.sum((self._M * self._iv[:, None] * self._Y) ** 2))

    def first_nodes(self) -> list[int]:
        """Index of every trajectory's first node."""
        return [i for i, (_, s0, _, _) in enumerate(self.segs) if s0 == 0]

    def objective(self, w, r=None):
        """Single-shooting objective (free run from every trajectory's first node)."""
        if self.shooting is None:
            return LeastSquaresProblem.objective(self, w, r)
        nf, nx = self.free.size, self.model.nx
        nodes = w[nf:].reshape(-1, nx)
        ws = np.concatenate([w[:nf], nodes[self.first_nodes()].ravel()])
        with np.errstate(all="ignore"):
            return self._single.objective(ws)

    def initial_nodes(self, model, theta_vec, data: Trajectories, x0: np.ndarray) -> np.ndarray:
        """(n_nodes, nx): the free run from x0 at the nodes (EKF/RTS states where it is not finite)."""
        from ...model._simulation import run
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
    mask = np.isfinite(y)
    e = np.where(mask, (y - yhat) * inv_std, 0.0)
    z = np.where(mask, y * inv_std, 0.0)
    return 2 * half_squared_norm(e.ravel()) > EXPLODING * max(2 * half_squared_norm(z.ravel()), 1e-300)


def output_error_problem(model, lengths, shooting, compiled: bool = False) -> OutputErrorLeastSquares:
    """The cached `OutputErrorLeastSquares` of ``model`` for these lengths and shooting (``compiled``:
    the sensitivity step compiled to native code, from `COMPILE_SAMPLES` samples)."""
    key = (tuple(int(t) for t in lengths), None if shooting is None else int(shooting), bool(compiled))
    # per thread: the problem keeps its data and evaluation buffers (runtime/_model_cache.py)
    return cached(model, "output-error least squares", key, lambda: OutputErrorLeastSquares(model, *key),
                  per_thread=True)
