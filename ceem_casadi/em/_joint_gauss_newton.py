"""Joint Gauss-Newton (Levenberg-Marquardt) steps on J(x_{1:T}, theta) over states AND parameters, the acceleration
``CEEMOptions(acceleration="newton")``: the states eliminated through the banded Cholesky factor of Hxx, chunk by chunk,
theta's step from the damped Schur complement (docs/long_records.md, "The joint Gauss-Newton step")."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import LinAlgError
from scipy.linalg.lapack import dpbtrf, dtbtrs, dtrtrs

from ..objective._stages import stack_stages
from ..runtime import _policy as policy
from ..runtime._linalg import BufferedCall, gram
from ..smoothing._banded import release_heap


@dataclass
class JointStep:
    """A candidate step: new flat parameter vector (np,), new states (list of (T_b, nx)) and the damping used."""

    theta_vec: np.ndarray
    xs: list
    mu: float


def banded_upper(D: np.ndarray, Off: np.ndarray) -> np.ndarray:
    """LAPACK upper band storage (2n, T n) of the symmetric block-tridiagonal matrix with
    diagonal blocks ``D`` (T, n, n) and super-diagonal blocks ``Off`` (T-1, n, n)."""
    T, n, _ = D.shape
    ab = np.zeros((2 * n, T * n), order="F")
    Dv, Offv = band_views(ab, n)
    iu, ju = np.triu_indices(n)
    Dv[:, iu, ju] = D[:, iu, ju]
    Offv[:] = Off
    return ab


def band_views(ab: np.ndarray, n: int):
    """``(D, Off)``: strided views (T, n, n), (T-1, n, n) of the Fortran-ordered band ``ab`` (2n, T n); ``D[t, i, j]``
    is valid for i <= j ONLY (i > j aliases other entries: never write them), ``Off[t]`` the block (t, t + 1)."""
    if not ab.flags.f_contiguous or ab.shape[0] != 2 * n:
        raise ValueError(f"expected a Fortran-ordered ({2 * n}, T {n}) band array, got shape {ab.shape}")
    T, s, u = ab.shape[1] // n, ab.itemsize, 2 * n - 1
    strides = (2 * n * n * s, s, (2 * n - 1) * s)  # t, i, j: entry (u + i - j, t n + j) of ab
    D = np.lib.stride_tricks.as_strided(ab[u:], (T, n, n), strides)
    Off = np.lib.stride_tricks.as_strided(ab[u - n:, n:], (max(T - 1, 0), n, n), strides)
    return D, Off


def _tmul(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Per stage ``A[t].T @ B[t]`` of (n, r, i) and (n, r, j) stacks (batched matmul)."""
    return np.matmul(A.transpose(0, 2, 1), B)


def _tbsolve(ab: np.ndarray, b: np.ndarray, trans: str) -> np.ndarray:
    """``U^-1 b`` (trans "N") or ``U^-T b`` ("T") for U upper triangular in LAPACK band storage ``ab``."""
    out, info = dtbtrs(ab, b if b.ndim == 2 else b[:, None], uplo="U", trans=trans, overwrite_b=1)
    if info != 0:
        raise LinAlgError(f"banded triangular solve failed (info {info})")
    return out if b.ndim == 2 else out[:, 0]


# damping of the states' block relative to the parameters' (docs/long_records.md)
STATE_DAMPING = 1e-6


class JointGaussNewton:
    """Joint Levenberg-Marquardt steps for one model and dataset shape (built once); the stages' Gauss-Newton blocks are
    evaluated in chunks of ``policy.JOINT_CHUNK`` stages: nothing of size T x n_free is held."""

    def __init__(self, model, lengths, stages, *, use_prior: bool = True):
        self.model, self.lengths, self.stages = model, tuple(int(T) for T in lengths), stages
        self._obs_p = bool(stages.obs_uses_p)  # observation residuals depend on theta (else Jpo = 0)
        self._maps: dict = {}  # (name, n): the stage Function mapped over n stages, each output's (rows, cols)
        self._calls: dict = {}  # their evaluation buffers, of one step (released after it)
        self._group = self.stage_names(stages)  # compiled or not together (as prefetched)
        self.free = model.params.free_index
        mean, w = model.params.prior
        self.prior_mean, self.prior_w2 = mean[self.free], (w[self.free] ** 2 if use_prior else 0 * w[self.free])
        self.mu = 1e-3

    @staticmethod
    def stage_names(stages) -> tuple[str, ...]:
        """The stage Functions a joint step evaluates (for `StageFunctions.prefetch`)."""
        by_blas = stages.products_by_blas
        return (*(("obs_res_jac_x", "obs_p_jac") if by_blas["obs"] else ("obs_gn", "obs_gn_dz")),
                *(("dyn_res_jac_z", "dyn_p_jac") if by_blas["dyn"] else ("dyn_gn", "dyn_gn_dz")))

    def _evaluate(self, name: str, args) -> list:
        """Flat column-major outputs of the stage Function ``name`` over n stages (``args``: the per-stage inputs
        (rows, n), then the shared ones, repeated here: CasADi's map wrapper for shared inputs kept every stage's
        outputs in its work arrays too). Views of buffers kept for this step."""
        per_column, n = (4 if name.startswith("obs") else 3), args[0].shape[1]
        if (name, n) not in self._calls:
            if (name, n) not in self._maps:
                group = self._group if name in self._group else (name,)
                f = self.stages.get(*group, columns=sum(self.lengths))[group.index(name)]
                self._maps[name, n] = (f.map(n, "serial"), [f.sparsity_out(i).get_triplet() for i in range(f.n_out())])
            self._calls[name, n] = BufferedCall(self._maps[name, n][0])
        shared = [np.repeat(np.reshape(a, (-1, 1)), n, 1) for a in args[per_column:]]
        return self._calls[name, n](*args[:per_column], *shared)

    def _jacobians(self, kind, args):
        """Residuals (n, rows), Jacobians in the states (n, rows, cols) and in the free parameters (n, rows, n_free;
        None for observations that do not depend on theta) of the n stages of ``args`` (views of the evaluation
        buffers); rows: ny or nx."""
        npar, n, rows = self.model.params.size, args[0].shape[1], self.model.ny if kind == "obs" else self.model.nx
        r, Jx = self._evaluate("obs_res_jac_x" if kind == "obs" else "dyn_res_jac_z", args)
        # column-major (rows, n * cols) outputs: stage k, column j, row i at (k * cols + j) * rows + i
        cols = self.model.nx * (1 if kind == "obs" else 2)
        out = (r.reshape(n, rows), Jx.reshape(n, cols, rows).transpose(0, 2, 1))
        if kind == "obs" and not self._obs_p:
            return (*out, None)
        (Jp,) = self._evaluate(f"{kind}_p_jac", args)
        return (*out, Jp.reshape(n, npar, rows)[:, self.free, :].transpose(0, 2, 1))

    def linearise(self, theta_vec, data, xs):
        """Residuals and Jacobians of ALL stages stacked (obs: ro (No, ny), Jxo (No, ny, nx), Jpo
        (No, ny, n_free) or None; dyn: rd, Jzd (Nd, nx, 2 nx), Jpd) as copies: for
        `ceem_casadi.workflow.assessment._uncertainty`, not for long records."""
        m = self.model
        (Xo, Uo, Yo, Mo), (X0, X1, U0) = stack_stages(data, xs)
        iv, iw = m.noise.inv_measurement_std, m.noise.inv_process_std
        obs = [None if a is None else a.copy()
               for a in self._jacobians("obs", [Xo, Uo, Yo, Mo, theta_vec, iv])]
        dyn = [a.copy() for a in self._jacobians("dyn", [X0, X1, U0, theta_vec, iw])]
        self._calls.clear()
        return (*obs, *dyn)

    def _chunks(self, theta_vec, y, u, x):
        """Per chunk of n = min(``policy.JOINT_CHUNK``, T) stages from a: ``(a, m, md, obs, dyn)``, the arguments of
        the observation stages a .. a + n - 1 and of the dynamics stages (x_s to x_{s+1}) from a (None if none), of
        which the first m and md count (the last chunk repeats a stage: one map size)."""
        m, T = self.model, x.shape[0]
        iv, iw, n = m.noise.inv_measurement_std, m.noise.inv_process_std, min(policy.JOINT_CHUNK, T)
        for a in range(0, T, n):
            s = np.minimum(np.arange(a, a + n), T - 1)
            mask = np.isfinite(y[s])
            obs = [x[s].T, u[s].T, np.where(mask, y[s], 0.0).T, mask.T.astype(float), theta_vec, iv]
            s = np.minimum(s, T - 2)
            dyn = [x[s].T, x[s + 1].T, u[s].T, theta_vec, iw] if T > a + 1 else None
            yield a, min(n, T - a), min(n, T - 1 - a), obs, dyn

    def _chunk_blocks(self, m, md, obs, dyn, D, Off, R):
        """Add the Gauss-Newton blocks of one chunk's first m observation stages (arguments ``obs``) and md dynamics
        stages (``dyn`` or None) into D (m + 1, nx, nx) (Hxx's diagonal blocks a .. a + m, upper triangles), Off (md,
        nx, nx) and R (m + 1, nx, 1 + n_free) ([gx Hxp], rows a .. a + m); returns their (Hpp, gp)."""
        nf = self.free.size
        Hpp, gp = np.zeros((nf, nf)), np.zeros(nf)
        for k, args, kind in ((m, obs, "obs"), (md, dyn, "dyn")):
            if args is None:
                continue
            by_blas = self.stages.products_by_blas[kind]
            h, g, blocks, off = (self._blas_blocks if by_blas else self._compiled_blocks)(kind, k, args)
            Hpp, gp = Hpp + h, gp + g
            for j, (Dj, Rj) in enumerate(blocks):  # x_s's blocks, then x_{s+1}'s (in the next block row)
                D[j:j + k] += Dj
                R[j:j + k, :, :Rj.shape[2]] += Rj  # [gx] alone when the stages do not depend on theta
            if off is not None:
                Off[:] = off
        return Hpp, gp

    def _compiled_blocks(self, kind, k, args):
        """``(Hpp, gp, [(Dj, Rj)] per state block, Off or None)`` of the first k stages of ``args`` from the compiled
        Gauss-Newton blocks (StageFunctions' "obs_gn", "dyn_gn"): Dj (k, nx, nx) upper triangles, Rj (k, nx, 1 + n_free)
        or (k, nx, 1)."""
        nx, nf, n, name = self.model.nx, self.free.size, args[0].shape[1], f"{kind}_gn"
        hp, g, *out = self._evaluate(name, args)
        (hr, hc), (gr, _) = self._maps[name, n][1][:2]
        Hpp, gp = np.zeros((nf, nf)), np.zeros(nf)
        Hpp[hr, hc] = hp.reshape(n, -1)[:k].sum(0)
        gp[gr] = g.reshape(n, -1)[:k].sum(0)
        blocks = [(out[j].reshape(n, nx, nx)[:k], out[j + 1].reshape(n, nx, -1)[:k]) for j in (0, 2)[:len(out) // 2]]
        return Hpp, gp, blocks, out[4].reshape(n, nx, nx)[:k] if len(out) > 4 else None

    def _blas_blocks(self, kind, k, args):
        """The same as `_compiled_blocks` from the residual Jacobians, the products by BLAS (many parameters)."""
        nx, nf = self.model.nx, self.free.size
        r, J, Jp = (a[:k] for a in self._jacobians(kind, args))
        Jp2 = Jp.reshape(-1, nf)
        rJp = np.concatenate([r[:, :, None], Jp], axis=2)
        Jw = [J[:, :, j:j + nx] for j in range(0, J.shape[2], nx)]
        return (gram(Jp2), Jp2.T @ r.ravel(), [(_tmul(Jj, Jj), _tmul(Jj, rJp)) for Jj in Jw],
                _tmul(Jw[0], Jw[1]) if len(Jw) > 1 else None)

    def _trajectory(self, theta_vec, y, u, x, mu):
        """Hxx + damping of one trajectory factorised chunk by chunk in LAPACK's upper band storage ``ab`` (2 nx, T nx)
        (H = U^T U, in place) while W = U^-T [gx Hxp] is streamed: returns (ab, w0 = U^-T gx, W1 = U^-T Hxp (kept
        only for a single chunk, else None), W1^T W1, W1^T w0, Hpp, gp)."""
        noise, nx, nf, T = self.model.noise, self.model.nx, self.free.size, x.shape[0]
        ab, w0 = np.zeros((2 * nx, T * nx), order="F"), np.empty(T * nx)
        Dv, Offv = band_views(ab, nx)
        (iu, ju), idx = np.triu_indices(nx), np.arange(nx)
        Hpp, gp, WW, Ww = np.zeros((nf, nf)), np.zeros(nf), np.zeros((nf, nf)), np.zeros(nf)
        D, R = np.zeros((1, nx, nx)), np.zeros((1, nx, 1 + nf))  # block a's parts from the chunk before
        dmax, W_last, W1 = 1.0, None, None
        for a, m, md, obs, dyn in self._chunks(theta_vec, y, u, x):
            D = np.concatenate([D[-1:], np.zeros((m, nx, nx))])
            R = np.concatenate([R[-1:], np.zeros((m, nx, 1 + nf))])
            h, g = self._chunk_blocks(m, md, obs, dyn, D, Offv[a:a + md], R)
            Hpp, gp = Hpp + h, gp + g
            if a == 0 and noise.x1_std is not None:
                D[0, idx, idx] += noise.inv_x1_std ** 2
                R[0, :, 0] += noise.inv_x1_std ** 2 * (x[0] - noise.x1_mean)
            diag = D[:m, idx, idx]  # damping of the states' block (docs/long_records.md)
            dmax = max(dmax, diag.max())
            D[:m, idx, idx] = diag + STATE_DAMPING * mu * np.maximum(diag, 1e-12 * dmax)
            Dv[a:a + m, iu, ju] = D[:m, iu, ju]
            W = self._factor_and_solve(ab, a, a + m, R[:m].reshape(-1, 1 + nf), W_last)
            WW += W[:, 1:].T @ W[:, 1:]
            Ww += W[:, 1:].T @ W[:, 0]
            w0[a * nx:(a + m) * nx], W_last = W[:, 0], W[-nx:]
            W1 = W[:, 1:] if m == T else None
        return ab, w0, W1, WW, Ww, Hpp, gp

    @staticmethod
    def _factor_and_solve(ab, a, b, rhs, W_last):
        """Cholesky factor of block columns [a, b) of the band ``ab`` (in place; block a's diagonal block
        first takes the Schur update of the factor before it) and ``U^-T rhs`` for rows [a, b)."""
        nx = ab.shape[0] // 2
        Dv, Offv = band_views(ab, nx)
        if a > 0:  # U[a-1, a] = U[a-1, a-1]^-T Off[a-1]; U[a, a]^T U[a, a] = D[a] - U[a-1, a]^T U[a-1, a]
            C, _ = dtrtrs(np.triu(Dv[a - 1]), Offv[a - 1], trans=1)  # (scipy's solve_triangular: 5 ms a call)
            Offv[a - 1] = C
            iu, ju = np.triu_indices(nx)
            Dv[a, iu, ju] -= (C.T @ C)[iu, ju]
            rhs[:nx] -= C.T @ W_last
        part = ab[:, a * nx:b * nx]
        chol, info = dpbtrf(part, lower=0, overwrite_ab=1)
        if info != 0:
            raise LinAlgError(f"banded Cholesky factorisation failed (info {info})")
        part[...] = chol  # no copy when LAPACK worked in place (a Fortran-ordered slice)
        return _tbsolve(part, rhs, "T")

    def _hxp_times(self, theta_vec, y, u, x, dz):
        """``Hxp dz`` (T nx,) of one trajectory, from a second pass over its stage Jacobians."""
        nx = self.model.nx
        v = np.zeros((x.shape[0], nx))
        for a, m, md, obs, dyn in self._chunks(theta_vec, y, u, x):
            for k, args, kind in ((m, obs if self._obs_p else None, "obs"), (md, dyn, "dyn")):
                if args is None:
                    continue
                if self.stages.products_by_blas[kind]:
                    _, J, Jp = self._jacobians(kind, args)
                    q = (Jp[:k] @ dz)[:, :, None]
                    parts = [_tmul(J[:k, :, j:j + nx], q)[:, :, 0] for j in range(0, J.shape[2], nx)]
                else:
                    parts = [w.reshape(-1, nx)[:k] for w in self._evaluate(f"{kind}_gn_dz", [*args, dz])]
                for j, w in enumerate(parts):
                    v[a + j:a + j + k] += w
        return v.ravel()

    def step(self, theta_vec, data, xs, mu: float | None = None) -> JointStep:
        """One damped Gauss-Newton step from ``(theta_vec, xs)`` (no acceptance test)."""
        mu = self.mu if mu is None else mu
        theta_vec = np.asarray(theta_vec, float)
        z = theta_vec[self.free]
        nf = z.size
        release_heap(2 * self.model.nx ** 2 * max(self.lengths))
        per_traj = [self._trajectory(theta_vec, data.y[b], data.inputs(b), x, mu) for b, x in enumerate(xs)]
        Hpp = sum(t[5] for t in per_traj) + np.diag(self.prior_w2)
        gp = sum(t[6] for t in per_traj) + self.prior_w2 * (z - self.prior_mean)
        S = Hpp - sum(t[3] for t in per_traj)
        S = 0.5 * (S + S.T)
        rhs = gp - sum(t[4] for t in per_traj)
        # Marquardt's scaling of the reduced problem: the Schur complement's diagonal (docs/long_records.md)
        Dp = np.maximum(np.diag(S).copy(), 1e-12 * max(1.0, np.abs(np.diag(Hpp)).max(initial=0.0)))
        S[np.diag_indices(nf)] += mu * Dp
        dz = -np.linalg.solve(S, rhs) if nf else np.zeros(0)
        params = self.model.params
        new_theta = theta_vec.copy()
        new_theta[self.free] = np.clip(z + dz, params.lower[self.free], params.upper[self.free])
        dz = new_theta[self.free] - z
        new_xs = []
        release_heap(2 * self.model.nx ** 2 * max(self.lengths))  # the chunks' freed temporaries
        for b, (x, (ab, w, W1, *_)) in enumerate(zip(xs, per_traj)):  # dx = -U^-1 (w0 + U^-T Hxp dz), in place
            w += W1 @ dz if W1 is not None else \
                _tbsolve(ab, self._hxp_times(theta_vec, data.y[b], data.inputs(b), x, dz), "T")
            new_xs.append(x - _tbsolve(ab, w, "N").reshape(x.shape))
        self._calls.clear()  # their buffers (T = 10^6: 0.2 GB) are not held between the steps
        return JointStep(new_theta, new_xs, mu)

    def adapt(self, accepted: bool) -> None:
        """Levenberg-Marquardt damping update after a step was accepted or rejected."""
        self.mu = max(self.mu / 3.0, 1e-8) if accepted else min(self.mu * 10.0, 1e8)


__all__ = ["JointGaussNewton", "JointStep", "LinAlgError"]
