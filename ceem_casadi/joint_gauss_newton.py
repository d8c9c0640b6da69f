"""Joint Gauss-Newton (Levenberg-Marquardt) steps on J(x_{1:T}, theta) over states AND parameters.

CE-EM (Algorithm 1) is block coordinate ascent on J. When states and parameters are strongly
coupled (nearly deterministic dynamics, many hidden states) it converges linearly and slowly.
Near the optimum a joint Gauss-Newton step on the same objective converges quadratically; used
as an *acceleration* of the EM iterations (``CEEMOptions(acceleration="newton")``), a step is
kept only when it increases the objective, so the fixed point is the one CE-EM converges to.

With r the stacked residuals (observation and dynamics stages of every trajectory, see
:mod:`ceem_casadi.stages`), Jx and Jp their Jacobians in the states and in the free parameters,
one step solves

    [Hxx + mu Dx    Hxp        ] [dx]     [gx]
    [Hxp^T          Hpp + mu Dp] [dp] = - [gp],   H = [Jx Jp]^T [Jx Jp],  g = [Jx Jp]^T r

(plus the x_1 and theta priors), with Marquardt's scaling D = diag(H). Hxx is block diagonal over
trajectories and block tridiagonal in time, so the Schur complement on p costs
O(B T nx^2 (nx + np)) with LAPACK's banded Cholesky; nothing of size (B T nx)^2 is formed.
Parameter bounds are honoured by projecting the step.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from scipy.linalg import LinAlgError, cho_solve_banded, cholesky_banded

from ._linalg import BufferedCall, gram
from .stages import stack_stages

log = logging.getLogger(__name__)


@dataclass
class JointStep:
    """A candidate step: new flat parameter vector (np,), new states (list of (T_b, nx)),
    the Gauss-Newton model's predicted decrease of -J and the damping used."""

    theta_vec: np.ndarray
    xs: list
    predicted_decrease: float
    mu: float


def _banded_upper(D: np.ndarray, Off: np.ndarray) -> np.ndarray:
    """LAPACK upper band storage (2n rows) of the symmetric block-tridiagonal matrix with
    diagonal blocks ``D`` (T, n, n) and super-diagonal blocks ``Off`` (T-1, n, n)."""
    T, n, _ = D.shape
    u = 2 * n - 1
    ab = np.zeros((u + 1, T * n))
    i, j = np.triu_indices(n)
    t = np.arange(T)[:, None]
    ab[u + i - j, t * n + j] = D[:, i, j]
    if T > 1:
        i2, j2 = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
        t1 = np.arange(T - 1)[:, None]
        ab[u + i2 - n - j2, (t1 + 1) * n + j2] = Off[:, i2, j2]
    return ab


class JointGaussNewton:
    """Joint Levenberg-Marquardt steps for one model and one dataset shape (built once).

    Parameters
    ----------
    model : the :class:`~ceem_casadi.model.StateSpaceModel`.
    lengths : trajectory lengths T_b.
    stages : the model's :class:`~ceem_casadi.stages.StageFunctions` (shared with the smoother).
    use_prior : include the parameters' Gaussian priors.
    """

    def __init__(self, model, lengths, stages, *, use_prior: bool = True):
        self.model, self.lengths = model, tuple(int(T) for T in lengths)
        obs, dyn = stages.get("obs_res_jac", "dyn_res_jac")
        # p and the noise weights are shared by every stage (reduce_in), the rest is per column
        self._obs = BufferedCall(obs.map(sum(self.lengths), [False] * 4 + [True] * 2, [False] * 3))
        self._dyn = BufferedCall(dyn.map(sum(T - 1 for T in self.lengths), [False] * 3 + [True] * 2, [False] * 3))
        self._obs_p = bool(stages.obs_uses_p)  # observation residuals depend on theta (else Jpo = 0)
        self.free = model.params.free_index
        mean, w = model.params.prior
        self._prior_mean, self._prior_w2 = mean[self.free], (w[self.free] ** 2 if use_prior else 0 * w[self.free])
        self.mu = 1e-3

    def _linearise(self, theta_vec, data, xs):
        m, nx, ny = self.model, self.model.nx, self.model.ny
        (Xo, Uo, Yo, Mo), (X0, X1, U0) = stack_stages(data, xs)
        iv, iw = m.noise.inv_measurement_std, m.noise.inv_process_std
        No, Nd, npar = Xo.shape[1], X0.shape[1], m.params.size
        f = self.free
        # column-major (rows, N * cols) outputs: stage k, column j, row i at (k * cols + j) * rows + i
        ro, Jxo, Jpo = self._obs(Xo, Uo, Yo, Mo, theta_vec, iv)
        obs = (ro.reshape(No, ny).copy(), Jxo.reshape(No, nx, ny).transpose(0, 2, 1).copy(),
               Jpo.reshape(No, npar, ny)[:, f, :].transpose(0, 2, 1).copy() if self._obs_p else None)
        rd, Jzd, Jpd = self._dyn(X0, X1, U0, theta_vec, iw)
        dyn = (rd.reshape(Nd, nx).copy(), Jzd.reshape(Nd, 2 * nx, nx).transpose(0, 2, 1).copy(),
               Jpd.reshape(Nd, npar, nx)[:, f, :].transpose(0, 2, 1).copy())
        return (*obs, *dyn)

    def step(self, theta_vec, data, xs, mu: float | None = None) -> JointStep:
        """One damped Gauss-Newton step from ``(theta_vec, xs)`` (no acceptance test)."""
        mu = self.mu if mu is None else mu
        m, nx = self.model, self.model.nx
        noise = m.noise
        theta_vec = np.asarray(theta_vec, float)
        ro, Jxo, Jpo, rd, Jzd, Jpd = self._linearise(theta_vec, data, xs)
        z = theta_vec[self.free]
        nf = z.size
        Nd, No = Jpd.shape[0] * Jpd.shape[1], ro.size  # residual rows (explicit: nf may be 0)
        # parameter blocks summed over every stage
        Hpp, gp = gram(Jpd.reshape(Nd, nf)), Jpd.reshape(Nd, nf).T @ rd.ravel()
        if Jpo is not None:
            Hpp += gram(Jpo.reshape(No, nf))
            gp += Jpo.reshape(No, nf).T @ ro.ravel()
        Hpp[np.diag_indices(nf)] += self._prior_w2
        gp += self._prior_w2 * (z - self._prior_mean)
        Dp = np.maximum(np.diag(Hpp).copy(), 1e-12 * max(1.0, np.abs(np.diag(Hpp)).max(initial=0.0)))
        S, rhs = Hpp + np.diag(mu * Dp), gp.copy()
        solved, o0, d0 = [], 0, 0
        w1sq = None if noise.x1_std is None else noise.inv_x1_std ** 2
        for T in self.lengths:
            so, sd = slice(o0, o0 + T), slice(d0, d0 + T - 1)
            Jo, A, Bn = Jxo[so], Jzd[sd, :, :nx], Jzd[sd, :, nx:]
            D = np.einsum("tri,trj->tij", Jo, Jo)
            D[:-1] += np.einsum("tri,trj->tij", A, A)
            D[1:] += np.einsum("tri,trj->tij", Bn, Bn)
            Off = np.einsum("tri,trj->tij", A, Bn)
            gx = np.einsum("tri,tr->ti", Jo, ro[so])
            gx[:-1] += np.einsum("tri,tr->ti", A, rd[sd])
            gx[1:] += np.einsum("tri,tr->ti", Bn, rd[sd])
            Hxp = np.zeros((T, nx, nf)) if Jpo is None else np.einsum("tri,trk->tik", Jo, Jpo[so])
            Hxp[:-1] += np.einsum("tri,trk->tik", A, Jpd[sd])
            Hxp[1:] += np.einsum("tri,trk->tik", Bn, Jpd[sd])
            if w1sq is not None:
                D[0][np.diag_indices(nx)] += w1sq
                gx[0] += w1sq * (xs[len(solved)][0] - noise.x1_mean)
            diag = np.einsum("tii->ti", D)
            diag += mu * np.maximum(diag, 1e-12 * max(1.0, diag.max()))
            chol = cholesky_banded(_banded_upper(D, Off), lower=False)
            Z = cho_solve_banded((chol, False), np.column_stack([gx.ravel(), Hxp.reshape(T * nx, nf)]))
            Hxp = Hxp.reshape(T * nx, nf)
            S -= Hxp.T @ Z[:, 1:]
            rhs -= Hxp.T @ Z[:, 0]
            solved.append(Z)
            o0, d0 = o0 + T, d0 + T - 1
        S = 0.5 * (S + S.T)
        dz = -np.linalg.solve(S, rhs) if nf else np.zeros(0)
        params = m.params
        new_theta = theta_vec.copy()
        new_theta[self.free] = np.clip(z + dz, params.lower[self.free], params.upper[self.free])
        dz = new_theta[self.free] - z
        new_xs = [x - (Z[:, 0] + Z[:, 1:] @ dz).reshape(x.shape) for x, Z in zip(xs, solved)]
        return JointStep(new_theta, new_xs, float(-(rhs @ dz) * 0.5), mu)

    def adapt(self, accepted: bool) -> None:
        """Levenberg-Marquardt damping update after a step was accepted or rejected."""
        self.mu = max(self.mu / 3.0, 1e-8) if accepted else min(self.mu * 10.0, 1e8)


__all__ = ["JointGaussNewton", "JointStep", "LinAlgError"]
