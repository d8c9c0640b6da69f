"""Fully adapted particle filter and FFBSi backward simulation (the E-step of particle EM); the filter, its
proposals and the smoother are described in docs/baselines.md."""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import casadi as ca
import numpy as np
from scipy.special import logsumexp

from ceem_casadi.filtering import as_cov
from ceem_casadi.io._data import single_trajectory

log = logging.getLogger(__name__)
_LOG2PI = np.log(2 * np.pi)


@dataclass
class ParticleFilterResult:
    """One trajectory (T steps) filtered with N particles.

    Attributes
    ----------
    loglik : float
        Unbiased-in-likelihood estimate of log p(y[1:T]).
    particles, weights : numpy.ndarray
        (T, N, nx) and (T, N) normalised weights: p(x[t] | y[1:t]).
    f_particles : numpy.ndarray
        (T-1, N, nx) ``f(particles[t])`` (used by FFBSi).
    ancestors : numpy.ndarray
        (T, N) ancestor indices (-1 at t = 0).
    ess, resampled : numpy.ndarray
        (T,) effective sample size of the weights that decided resampling, and whether it did.
    proposal : str
        ``"fully-adapted"`` or ``"bootstrap"``.
    Q_chol : numpy.ndarray
        (nx, nx) Cholesky factor of the process noise covariance.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from scripts.baselines import particle_filter
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x, lambda x, u, p: x, nx=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.8)))
    >>> y = np.random.default_rng(0).normal(size=(40, 1))
    >>> res = particle_filter(model, [0.8], y, n_particles=50, x0_mean=[0.0], x0_cov=1.0, rng=np.random.default_rng(2))
    >>> res.weights.shape, bool(np.allclose(res.weights.sum(axis=1), 1.0))
    ((40, 50), True)
    """

    loglik: float
    particles: np.ndarray
    weights: np.ndarray
    f_particles: np.ndarray
    ancestors: np.ndarray
    ess: np.ndarray
    resampled: np.ndarray
    proposal: str
    Q_chol: np.ndarray


def systematic_resample(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Ancestor indices (N,) by systematic resampling of normalised ``weights`` (N,)."""
    n = weights.size
    positions = (rng.random() + np.arange(n)) / n
    return np.minimum(np.searchsorted(np.cumsum(weights), positions), n - 1)


def _chol(M: np.ndarray) -> np.ndarray:
    M = 0.5 * (M + M.T)
    try:
        return np.linalg.cholesky(M)
    except np.linalg.LinAlgError:
        return np.linalg.cholesky(M + 1e-12 * np.trace(M) / len(M) * np.eye(len(M)))


def _update(C: np.ndarray, P: np.ndarray, Ro: np.ndarray):
    """``(Ls, K, Lpost)`` of observing ``C x`` (no, nx) plus noise of covariance ``Ro`` under a prior covariance
    ``P`` (nx, nx): Cholesky factor of ``S = C P C^T + Ro``, the gain ``P C^T S^-1`` and the posterior's factor."""
    Ls = _chol(C @ P @ C.T + Ro)
    K = np.linalg.solve(Ls.T, np.linalg.solve(Ls, C @ P)).T
    return Ls, K, _chol(P - K @ C @ P)


def _gauss_logpdf(resid: np.ndarray, L: np.ndarray) -> np.ndarray:
    """log N(resid; 0, L L^T) for rows of ``resid`` (n, d)."""
    z = np.linalg.solve(L, resid.T)
    return -0.5 * np.sum(z * z, axis=0) - np.log(np.diag(L)).sum() - 0.5 * L.shape[0] * _LOG2PI


class ParticleFilter:
    """Particle filter Functions for one model and particle count (CasADi maps built once)."""

    def __init__(self, model, n_particles: int, proposal: str = "auto"):
        self.model, self.n = model, int(n_particles)
        self.f_map = model.f.map(self.n)
        self.g_map = model.g.map(self.n)
        x, u, p = ca.SX.sym("x", model.nx), ca.SX.sym("u", model.nu), ca.SX.sym("p", model.params.size)
        gx = model.g(x, u, p)
        Cx = ca.jacobian(gx, x)
        self.linear_obs = not ca.depends_on(Cx, x)
        if self.linear_obs:
            d = ca.substitute(gx, x, ca.DM.zeros(model.nx))
            self.obs_affine = ca.Function("obs_affine", [u, p], [Cx, d], ["u", "p"], ["C", "d"])
        self.proposal = "fully-adapted" if (self.linear_obs and proposal == "auto") else "bootstrap"
        if self.proposal == "bootstrap" and proposal == "auto":
            warnings.warn("the observation function is not linear in x: the particle filter falls back to a "
                          "bootstrap proposal (expect a noisier likelihood and more resampling)", stacklevel=2)

    def run(self, theta_vec, y, u=None, *, x0_mean, x0_cov, rng: np.random.Generator, Q=None, R=None,
            ess_threshold: float = 0.5) -> ParticleFilterResult:
        """Filter one trajectory ``y`` (T, ny) (NaN = missing) with inputs ``u`` (T, nu) or None."""
        model, N, nx, ny = self.model, self.n, self.model.nx, self.model.ny
        y, u = single_trajectory(model, y, u)
        T = y.shape[0]
        p = np.asarray(theta_vec, float)
        Q = as_cov("Q", model.noise.process_std ** 2 if Q is None else Q, nx)
        R = as_cov("R", model.noise.measurement_std ** 2 if R is None else R, ny)
        m0 = np.asarray(x0_mean, float).reshape(nx)
        P0 = as_cov("x0_cov", x0_cov, nx)
        Lq = _chol(Q)
        X = np.empty((T, N, nx))
        W = np.empty((T, N))
        Fp = np.empty((max(T - 1, 0), N, nx))
        anc = np.full((T, N), -1, dtype=int)
        ess, resampled = np.full(T, float(N)), np.zeros(T, dtype=bool)
        adapted = self.proposal == "fully-adapted"
        if adapted:
            Cs, ds = self.obs_affine.map(T)(u.T, p)
            Cs = np.asarray(Cs).reshape(ny, T, nx).transpose(1, 0, 2)  # horzcat of T (ny, nx) blocks
            ds = np.asarray(ds).T
        loglik = 0.0
        eps = rng.standard_normal((T, N, nx))
        # --- t = 0: exact Gaussian step from the prior (fully adapted) or prior draw + weights
        obs = np.isfinite(y[0])
        if adapted and obs.any():
            C = Cs[0][obs]
            Ls, K, Lpost = _update(C, P0, R[np.ix_(obs, obs)])
            e = y[0, obs] - C @ m0 - ds[0, obs]
            loglik += float(_gauss_logpdf(e[None], Ls)[0])
            X[0] = m0 + K @ e + eps[0] @ Lpost.T
            W[0] = 1.0 / N
        else:
            X[0] = m0 + eps[0] @ _chol(P0).T
            logw = self._obs_logpdf(X[0], y[0], u[0], p, R) - np.log(N)
            loglik += float(logsumexp(logw))
            W[0] = np.exp(logw - logsumexp(logw))
        # --- t >= 1
        for t in range(1, T):
            F = np.asarray(self.f_map(X[t - 1].T, u[t - 1], p)).T  # (N, nx)
            Fp[t - 1] = F
            obs = np.isfinite(y[t])
            w_prev = W[t - 1]
            if adapted and obs.any():
                C = Cs[t][obs]
                Ls, K, Lpost = _update(C, Q, R[np.ix_(obs, obs)])
                resid = y[t, obs] - F @ C.T - ds[t, obs]  # (N, no)
                with np.errstate(divide="ignore"):
                    logw = np.log(w_prev) + _gauss_logpdf(resid, Ls)
                loglik += float(logsumexp(logw))
                w = np.exp(logw - logsumexp(logw))
                a, W[t] = self._maybe_resample(w, t, ess, resampled, ess_threshold, rng)
                X[t] = F[a] + resid[a] @ K.T + eps[t] @ Lpost.T
            else:
                a, w = self._maybe_resample(w_prev, t, ess, resampled, ess_threshold, rng)
                X[t] = F[a] + eps[t] @ Lq.T
                with np.errstate(divide="ignore"):
                    logw = np.log(w) + self._obs_logpdf(X[t], y[t], u[t], p, R)
                loglik += float(logsumexp(logw))
                W[t] = np.exp(logw - logsumexp(logw))
            anc[t] = a
        return ParticleFilterResult(loglik, X, W, Fp, anc, ess, resampled, self.proposal, Lq)

    def _obs_logpdf(self, X, yt, ut, p, R) -> np.ndarray:
        obs = np.isfinite(yt)
        if not obs.any():
            return np.zeros(X.shape[0])
        G = np.asarray(self.g_map(X.T, ut, p)).T
        return _gauss_logpdf(yt[obs] - G[:, obs], _chol(R[np.ix_(obs, obs)]))

    def _maybe_resample(self, w, t, ess, resampled, threshold, rng):
        ess[t] = 1.0 / np.sum(w * w)
        if ess[t] < threshold * w.size:
            resampled[t] = True
            return systematic_resample(w, rng), np.full(w.size, 1.0 / w.size)
        return np.arange(w.size), w


def particle_filter(model, theta_vec, y, u=None, *, n_particles: int, x0_mean, x0_cov,
                    rng: np.random.Generator, Q=None, R=None, ess_threshold: float = 0.5,
                    proposal: str = "auto") -> ParticleFilterResult:
    """Run the particle filter on one trajectory (docs/baselines.md; for repeated calls build a
    `ParticleFilter` once).

    Parameters
    ----------
    model : StateSpaceModel
    theta_vec : numpy.ndarray
        (n_p,) flat parameter vector.
    y, u : numpy.ndarray
        (T, ny) observations, NaN = missing; (T, nu) inputs (optional).
    n_particles : int
        Number of particles N.
    x0_mean, x0_cov : array_like
        (nx,) prior mean of x[1] and its covariance: scalar, (nx,) or (nx, nx).
    rng : numpy.random.Generator
    Q, R : float or numpy.ndarray, optional
        Override the model's noise covariances.
    ess_threshold : float
        Resample when ESS < ess_threshold * N.
    proposal : str
        ``"auto"`` or ``"bootstrap"``.

    Returns
    -------
    ParticleFilterResult

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from scripts.baselines import particle_filter
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x, lambda x, u, p: x, nx=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.8)))
    >>> y = np.random.default_rng(0).normal(size=(40, 1))
    >>> res = particle_filter(model, [0.8], y, n_particles=50, x0_mean=[0.0], x0_cov=1.0, rng=np.random.default_rng(2))
    >>> res.particles.shape, bool(np.isfinite(res.loglik))
    ((40, 50, 1), True)
    """
    pf = ParticleFilter(model, n_particles, proposal)
    return pf.run(theta_vec, y, u, x0_mean=x0_mean, x0_cov=x0_cov, rng=rng, Q=Q, R=R,
                  ess_threshold=ess_threshold)


def ffbsi(result: ParticleFilterResult, n_smooth: int, *, rng: np.random.Generator) -> np.ndarray:
    """Forward-filtering backward-simulation of smoothed state trajectories (O(N Ns nx) per step;
    docs/baselines.md).

    Parameters
    ----------
    result : ParticleFilterResult
    n_smooth : int
        Number of trajectories Ns.
    rng : numpy.random.Generator

    Returns
    -------
    numpy.ndarray
        (Ns, T, nx) draws from p(x[1:T] | y[1:T]).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from scripts.baselines import ffbsi, particle_filter
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x, lambda x, u, p: x, nx=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.8)))
    >>> y = np.random.default_rng(0).normal(size=(40, 1))
    >>> res = particle_filter(model, [0.8], y, n_particles=50, x0_mean=[0.0], x0_cov=1.0, rng=np.random.default_rng(2))
    >>> ffbsi(res, 5, rng=np.random.default_rng(3)).shape                # 5 smoothed trajectories (T, nx)
    (5, 40, 1)
    """
    X, W, Fp, Lq = result.particles, result.weights, result.f_particles, result.Q_chol
    T, N, nx = X.shape
    out = np.empty((n_smooth, T, nx))
    idx = _draw(np.broadcast_to(np.log(W[-1]), (n_smooth, N)), rng)
    out[:, -1] = X[-1, idx]
    for t in range(T - 2, -1, -1):
        # whitened distances between each trajectory's next state and each particle's prediction
        Zf = np.linalg.solve(Lq, Fp[t].T).T  # (N, nx)
        Zs = np.linalg.solve(Lq, out[:, t + 1].T).T  # (Ns, nx)
        d2 = np.sum(Zs * Zs, 1)[:, None] + np.sum(Zf * Zf, 1)[None, :] - 2.0 * Zs @ Zf.T
        with np.errstate(divide="ignore"):
            logb = np.log(W[t])[None, :] - 0.5 * d2
        out[:, t] = X[t, _draw(logb, rng)]
    return out


def _draw(logw: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of unnormalised log-weights (M, N)."""
    w = np.exp(logw - logw.max(axis=1, keepdims=True))
    cdf = np.cumsum(w, axis=1)
    r = rng.random(w.shape[0]) * cdf[:, -1]
    return np.minimum((cdf < r[:, None]).sum(axis=1), w.shape[1] - 1)
