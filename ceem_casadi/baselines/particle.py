"""Particle EM: fully adapted particle filter, FFBSi backward simulation and an SAEM M-step.

The baseline of section 4.1.2 of the CE-EM paper, on the same model and data objects as CE-EM.
Model (Gaussian noise from ``model.noise`` unless overridden)::

    x[t+1] = f(x[t], u[t], p) + w[t],   w ~ N(0, Q),  Q = diag(process_std**2)
    y[t]   = g(x[t], u[t], p) + v[t],   v ~ N(0, R),  R = diag(measurement_std**2)
    x[1]   ~ N(x0_mean, x0_cov)

**Filter.** When ``g`` is linear in x (``g = C(u, p) x + d(u, p)``, detected symbolically: the
Jacobian dg/dx does not depend on x), the filter is *fully adapted* (Pitt & Shephard 1999):
the first-stage weights are ``w[t-1]^i p(y[t] | x[t-1]^i)`` with
``p(y | x') = N(y; C f(x') + d, C Q C^T + R)``, and particles are propagated from the optimal
proposal ``p(x[t] | x[t-1], y[t]) = N(f + K (y - C f - d), Q - K C Q)``, ``K = Q C^T S^-1``.
Otherwise a bootstrap proposal ``f(x) + w`` is used (with a warning). Systematic resampling
is triggered when the effective sample size falls below ``ess_threshold * N``. NaN entries of
``y`` are skipped. ``f`` is evaluated on all particles at once (``model.f.map(N)``).

**Smoother.** FFBSi (Godsill, Doucet & West 2004) draws ``Ns`` trajectories backwards with
weights ``w[t]^i N(x*[t+1]; f(x[t]^i), Q)``: O(N Ns) per step, vectorised.

**M-step (SAEM, Delyon, Lavielle & Moulines 1999).** The SAEM objective after iteration k is
``Q_k(theta) = sum_i gamma_i prod_{j>i} (1 - gamma_j) (1/Ns) sum_s log p(x^(i,s), y | theta)``.
It is maximised with the CE-EM learning NLP (:class:`~ceem_casadi.learner.Learner`), built
once on a fixed memory window of the last ``memory`` iterations' samples, each sampled
trajectory weighted by its SAEM weight (weights renormalised to sum to one per data
trajectory over the window; the truncation drops at most ``prod (1 - gamma_j)`` of the mass).
Step sizes: ``gamma_k = 1`` for ``k <= saem_k0`` (plain Monte Carlo EM while far from the
optimum), then ``gamma_k = (k - saem_k0)**-saem_alpha`` with ``0.5 < alpha <= 1`` (the SAEM
conditions ``sum gamma = inf``, ``sum gamma^2 < inf``). The shift by ``k0`` avoids a jump from
1 to ``k0**-alpha`` (e.g. 0.12 for k0 = 20) that would freeze the estimate right after the
burn-in. Defaults ``k0 = 20``, ``alpha = 0.7``: on single Lorenz (sigma_w = 0.1, sigma_v = 0.5,
4 trajectories) plain Monte Carlo EM still makes steady progress for ~20 iterations from a
10 % initial error, while averaging from the start (k0 = 3) had barely moved after 20.
"""
from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import casadi as ca
import numpy as np
from scipy.special import logsumexp

from .._threads import blas_threads
from ..data import Trajectories, single_trajectory
from ..filtering import as_cov
from ..learner import Learner
from ..options import LearnerOptions
from ..params import Theta
from ..status import Status

log = logging.getLogger(__name__)
_LOG2PI = np.log(2 * np.pi)


# ------------------------------------------------------------------------------------------
# options and results
@dataclass(frozen=True)
class ParticleEMOptions:
    """Particle EM settings (defaults from the paper: Np = 100, Ns = 10).

    n_particles : filter particles Np.  n_smooth : FFBSi trajectories Ns per data trajectory.
    max_iters : EM iterations.  ess_threshold : resample when ESS < ess_threshold * Np.
    saem_k0, saem_alpha : SAEM step sizes ``gamma_k = 1`` (k <= k0), ``(k - k0)**-alpha`` after.
    memory : iterations of samples kept in the M-step (window of the SAEM average).
    x0_mean, x0_std : (nx,) initial-state prior used when the model has no ``x1_mean``/``x1_std``.
    proposal : ``"auto"`` (fully adapted when g is linear in x, else bootstrap), ``"bootstrap"``.
    learner : options of the M-step NLP.
    blas_threads : BLAS threads during the run (1 by default, as for CE-EM; ``None`` leaves them):
        on the shared 2-core machine one six-coupled-Lorenz epoch took 208 s with threaded BLAS
        and 14.5 s with one thread.
    """

    n_particles: int = 100
    n_smooth: int = 10
    max_iters: int = 50
    ess_threshold: float = 0.5
    saem_k0: int = 20
    saem_alpha: float = 0.7
    memory: int = 5
    x0_mean: tuple | None = None
    x0_std: tuple | None = None
    proposal: str = "auto"
    learner: LearnerOptions = field(default_factory=LearnerOptions)
    blas_threads: int | None = 1

    def __post_init__(self):
        checks = [
            (self.blas_threads is None or (isinstance(self.blas_threads, int) and self.blas_threads >= 1),
             f"blas_threads must be None or an int >= 1, got {self.blas_threads!r}"),
            (self.n_particles >= 2, f"n_particles must be >= 2, got {self.n_particles}"),
            (self.n_smooth >= 1, f"n_smooth must be >= 1, got {self.n_smooth}"),
            (self.max_iters >= 1, f"max_iters must be >= 1, got {self.max_iters}"),
            (0 < self.ess_threshold <= 1, f"ess_threshold must be in (0, 1], got {self.ess_threshold}"),
            (self.saem_k0 >= 0, f"saem_k0 must be >= 0, got {self.saem_k0}"),
            (0.5 < self.saem_alpha <= 1, f"saem_alpha must be in (0.5, 1], got {self.saem_alpha}"),
            (self.memory >= 1, f"memory must be >= 1, got {self.memory}"),
            (self.proposal in ("auto", "bootstrap"), f"proposal must be 'auto' or 'bootstrap', got {self.proposal!r}"),
            ((self.x0_mean is None) == (self.x0_std is None), "give both x0_mean and x0_std, or neither"),
            (isinstance(self.learner, LearnerOptions), "learner must be a LearnerOptions"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        if self.x0_std is not None and np.any(np.asarray(self.x0_std, float) <= 0):
            raise ValueError(f"x0_std must be positive, got {self.x0_std}")

    def gamma(self, k: int) -> float:
        """SAEM step size of iteration k (1-based)."""
        return 1.0 if k <= self.saem_k0 else float(k - self.saem_k0) ** -self.saem_alpha


@dataclass
class ParticleFilterResult:
    """One trajectory (T steps) filtered with N particles.

    particles (T, N, nx) and normalised weights (T, N) represent p(x[t] | y[1:t]);
    f_particles (T-1, N, nx) = f(particles[t]) (used by FFBSi); ancestors (T, N) (-1 at t = 0);
    ess (T,) effective sample size of the weights that decided resampling; resampled (T,) bool;
    loglik : unbiased-in-likelihood estimate of log p(y[1:T]); Q_chol (nx, nx): process noise factor.
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


@dataclass
class ParticleEMRecord:
    """One particle-EM iteration: the theta after the M-step, the epoch's wall time (s), the
    log-likelihood estimate at the theta used in the E-step, the SAEM step size, timings."""

    iteration: int
    theta: Theta
    wall_s: float
    loglik: float
    gamma: float
    e_step_s: float
    m_step_s: float
    learn_status: str


@dataclass
class ParticleEMResult:
    """Outcome of :func:`particle_em`: status ``"max_iters"``, ``"stopped"`` (callback) or
    ``"solver_failed"`` (the last good theta is returned); build_s: one-off M-step NLP build."""

    theta: Theta
    history: list[ParticleEMRecord]
    status: str
    message: str
    build_s: float = 0.0

    def __post_init__(self):
        self.status = Status(self.status)

    @property
    def success(self) -> bool:
        return self.status in ("max_iters", "stopped")


# ------------------------------------------------------------------------------------------
# particle filter
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
            C, Ro = Cs[0][obs], R[np.ix_(obs, obs)]
            S = C @ P0 @ C.T + Ro
            Ls = _chol(S)
            e = y[0, obs] - C @ m0 - ds[0, obs]
            loglik += float(_gauss_logpdf(e[None], Ls)[0])
            K = np.linalg.solve(Ls.T, np.linalg.solve(Ls, C @ P0)).T
            X[0] = m0 + K @ e + eps[0] @ _chol(P0 - K @ C @ P0).T
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
                C, Ro = Cs[t][obs], R[np.ix_(obs, obs)]
                S = C @ Q @ C.T + Ro
                Ls = _chol(S)
                resid = y[t, obs] - F @ C.T - ds[t, obs]  # (N, no)
                with np.errstate(divide="ignore"):
                    logw = np.log(w_prev) + _gauss_logpdf(resid, Ls)
                loglik += float(logsumexp(logw))
                w = np.exp(logw - logsumexp(logw))
                a, W[t] = self._maybe_resample(w, t, ess, resampled, ess_threshold, rng)
                K = np.linalg.solve(Ls.T, np.linalg.solve(Ls, C @ Q)).T
                X[t] = F[a] + resid[a] @ K.T + eps[t] @ _chol(Q - K @ C @ Q).T
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
    """Run the particle filter on one trajectory (see the module docstring).

    ``theta_vec`` flat parameters; ``y`` (T, ny) with NaN = missing; ``u`` (T, nu) or None;
    ``x0_mean`` (nx,), ``x0_cov`` (scalar, (nx,) or (nx, nx)); ``Q``, ``R`` override the
    model's noise. For repeated calls build a :class:`ParticleFilter` once.
    """
    pf = ParticleFilter(model, n_particles, proposal)
    return pf.run(theta_vec, y, u, x0_mean=x0_mean, x0_cov=x0_cov, rng=rng, Q=Q, R=R,
                  ess_threshold=ess_threshold)


def ffbsi(result: ParticleFilterResult, n_smooth: int, *, rng: np.random.Generator) -> np.ndarray:
    """Forward-filtering backward-simulation: ``n_smooth`` trajectories (Ns, T, nx).

    Rejection-free backward simulation, O(N Ns nx) per step: at each t the index of every
    trajectory is drawn with probability ``w[t]^i N(x*[t+1]; f(x[t]^i), Q)``.
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


# ------------------------------------------------------------------------------------------
# particle EM
def _initial_prior(model, options: ParticleEMOptions):
    nz = model.noise
    if nz.x1_mean is not None:
        return nz.x1_mean, nz.x1_std ** 2
    if options.x0_mean is None:
        raise ValueError("particle EM needs a prior on the first state: set x1_mean/x1_std on the model "
                         "(model.with_noise(x1_mean=..., x1_std=...)) or pass ParticleEMOptions(x0_mean=..., "
                         "x0_std=...)")
    mean = np.broadcast_to(np.asarray(options.x0_mean, float), (model.nx,))
    std = np.broadcast_to(np.asarray(options.x0_std, float), (model.nx,))
    return mean.copy(), std ** 2


def saem_weights(gammas: list[float], memory: int) -> np.ndarray:
    """Weights (memory,) of the last ``memory`` iterations' samples, oldest first, summing to 1.

    Iteration i of k gets ``gamma_i prod_{j>i} (1 - gamma_j)`` (slots before iteration 1 get 0),
    renormalised over the window.
    """
    k = len(gammas)
    w = np.zeros(memory)
    for m in range(memory):
        i = k - memory + m  # 0-based iteration index of slot m
        if i < 0:
            continue
        w[m] = gammas[i] * np.prod([1.0 - g for g in gammas[i + 1:]])
    return w / w.sum()


def particle_em(model, data: Trajectories, theta0: Theta, *,
                options: ParticleEMOptions = ParticleEMOptions(), seed: int | np.random.Generator = 0,
                callback: Callable[[ParticleEMRecord], bool | None] | None = None) -> ParticleEMResult:
    """Particle EM (particle filter + FFBSi E-step, SAEM M-step) from ``theta0`` (dict).

    ``callback(record)`` is called after every iteration; returning True stops the loop.
    All random draws come from ``seed`` (an int or a numpy Generator).
    """
    with blas_threads(options.blas_threads):
        return _particle_em(model, data, theta0, options, seed, callback)


def _particle_em(model, data, theta0, options, seed, callback) -> ParticleEMResult:
    data.check_model(model)
    rng = np.random.default_rng(seed)
    theta_vec = model.theta_vector(theta0)
    m0, P0 = _initial_prior(model, options)
    B, Ns, K = len(data), options.n_smooth, options.memory
    t0 = time.perf_counter()
    pf = ParticleFilter(model, options.n_particles, options.proposal)
    # slot m, sample s, trajectory b  ->  flat position (m * Ns + s) * B + b
    reps = K * Ns
    data_rep = Trajectories([data.y[b] for _ in range(reps) for b in range(B)],
                            None if data.u is None else [data.u[b] for _ in range(reps) for b in range(B)],
                            data.dt)
    learner = Learner(model, data_rep.lengths, options.learner)
    build_s = time.perf_counter() - t0
    slots: list[list[np.ndarray] | None] = [None] * K
    gammas: list[float] = []
    history: list[ParticleEMRecord] = []
    status, message = "max_iters", f"stopped after {options.max_iters} iterations"
    for k in range(1, options.max_iters + 1):
        t_start = time.perf_counter()
        loglik, samples = 0.0, [None] * (Ns * B)
        for b in range(B):
            res = pf.run(theta_vec, data.y[b], data.inputs(b), x0_mean=m0, x0_cov=P0, rng=rng,
                         ess_threshold=options.ess_threshold)
            loglik += res.loglik
            xs = ffbsi(res, Ns, rng=rng)
            for s in range(Ns):
                samples[s * B + b] = xs[s]
        t_e = time.perf_counter()
        gammas.append(options.gamma(k))
        slot_w = np.roll(saem_weights(gammas, K), k)  # window order (oldest first) -> ring slot order
        slots[(k - 1) % K] = samples
        xs_all, weights = [], []
        for m in range(K):
            xs_all.extend(slots[m] if slots[m] is not None else samples)
            weights.extend([slot_w[m] / Ns if slots[m] is not None else 0.0] * (Ns * B))
        lr = learner.solve(theta_vec, data_rep, xs_all, weights=np.array(weights))
        t_end = time.perf_counter()
        if not lr.success:
            status = "solver_failed"
            message = f"M-step solver failed at iteration {k} ({lr.status}); returning the last good theta"
            log.warning(message)
            break
        theta_vec = lr.theta_vec
        rec = ParticleEMRecord(k, model.params.from_vector(theta_vec), t_end - t_start, loglik, gammas[-1],
                               t_e - t_start, t_end - t_e, lr.status)
        history.append(rec)
        log.info("particle EM %d: loglik %.3f gamma %.3f (%.2f s)", k, loglik, gammas[-1], rec.wall_s)
        if callback is not None and callback(rec):
            status, message = "stopped", f"stopped by the callback after iteration {k}"
            break
    return ParticleEMResult(model.params.from_vector(theta_vec), history, status, message, build_s)
