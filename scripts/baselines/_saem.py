"""Particle EM: the particle filter and FFBSi E-step of `scripts.baselines._particle` with an SAEM
M-step (the baseline of section 4.1.2 of the CE-EM paper; the M-step and its step sizes: docs/baselines.md)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ceem_casadi.errors import OptionsError
from ceem_casadi.io._data import Trajectories
from ceem_casadi.io._validate import check_data
from ceem_casadi.learning._learner import Learner
from ceem_casadi.learning._options import LearnerOptions
from ceem_casadi.model._params import Theta
from ceem_casadi.runtime._schema import check_fields, renamed, require
from ceem_casadi.runtime._status import Status
from ceem_casadi.runtime._threads import blas_threads

from ._particle import ParticleFilter, ffbsi

log = logging.getLogger(__name__)


def _removed_x0_prior(value, kwargs) -> None:
    """the prior of the first state is the model's: model.with_noise(x1_mean=..., x1_std=...)"""
    raise OptionsError("ParticleEMOptions(x0_mean=..., x0_std=...) was removed: give the prior of the first state "
                       "on the model, particle_em(model.with_noise(x1_mean=..., x1_std=...), ...)")


@renamed(x0_mean=_removed_x0_prior, x0_std=_removed_x0_prior)
@dataclass(frozen=True)
class ParticleEMOptions:
    """Particle EM settings (defaults from the paper: Np = 100, Ns = 10); the prior of the first state is the
    model's (``model.with_noise(x1_mean=..., x1_std=...)``), the method: docs/baselines.md.

    Parameters
    ----------
    n_particles, n_smooth : int
        Filter particles Np; FFBSi trajectories Ns per data trajectory.
    max_iters : int
        EM iterations.
    saem_k0, saem_alpha : int, float
        SAEM step sizes ``gamma_k = 1`` (k <= k0), ``(k - k0)**-alpha`` after.
    memory : int
        Iterations of samples kept in the M-step (window of the SAEM average).
    learner : LearnerOptions
        Options of the M-step NLP.

    Raises
    ------
    OptionsError
        A value out of range.

    Examples
    --------
    >>> from scripts.baselines import ParticleEMOptions
    >>> opts = ParticleEMOptions(n_particles=200, max_iters=10)
    >>> opts.n_particles, opts.n_smooth, opts.max_iters
    (200, 10, 10)
    """

    n_particles: int = 100
    n_smooth: int = 10
    max_iters: int = 50
    saem_k0: int = 20
    saem_alpha: float = 0.7
    memory: int = 5
    learner: LearnerOptions = field(default_factory=LearnerOptions)

    def __post_init__(self):
        check_fields(self)
        require(self.n_particles >= 2, f"n_particles must be >= 2, got {self.n_particles}")
        require(self.n_smooth >= 1, f"n_smooth must be >= 1, got {self.n_smooth}")
        require(self.max_iters >= 1, f"max_iters must be >= 1, got {self.max_iters}")
        require(self.saem_k0 >= 0, f"saem_k0 must be >= 0, got {self.saem_k0}")
        require(0.5 < self.saem_alpha <= 1, f"saem_alpha must be in (0.5, 1], got {self.saem_alpha}")
        require(self.memory >= 1, f"memory must be >= 1, got {self.memory}")

    def gamma(self, k: int) -> float:
        """SAEM step size of iteration k (1-based)."""
        return 1.0 if k <= self.saem_k0 else float(k - self.saem_k0) ** -self.saem_alpha


@dataclass
class ParticleEMRecord:
    """One particle-EM iteration.

    Attributes
    ----------
    iteration : int
        1-based.
    theta : dict
        Parameters after the M-step.
    wall_s, e_step_s, m_step_s : float
        Wall time of the iteration, of its E-step and of its M-step (s).
    loglik, gamma : float
        Log-likelihood estimate at the theta used in the E-step; SAEM step size.
    learn_status : str
        Status of the M-step's solver.

    Examples
    --------
    >>> from scripts.baselines import ParticleEMRecord
    >>> rec = ParticleEMRecord(1, {"a": 0.7}, wall_s=0.3, loglik=-12.5, gamma=1.0, e_step_s=0.2, m_step_s=0.1,
    ...                        learn_status="Solve_Succeeded")
    >>> rec.iteration, rec.gamma
    (1, 1.0)
    """

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
    """Outcome of `particle_em`.

    Attributes
    ----------
    theta : dict
        Final parameters (the last good theta after a solver failure).
    history : list of ParticleEMRecord
        One record per iteration.
    status : Status
        ``"max_iters"``, ``"stopped"`` (callback) or ``"solver_failed"``.
    message : str
    build_s : float
        One-off M-step NLP construction time (s).

    Examples
    --------
    >>> from scripts.baselines import ParticleEMResult
    >>> res = ParticleEMResult({"a": 0.7}, [], "max_iters", "stopped after 50 iterations")
    >>> str(res.status), res.success
    ('max_iters', True)
    """

    theta: Theta
    history: list[ParticleEMRecord]
    status: str
    message: str
    build_s: float = 0.0

    def __post_init__(self):
        self.status = Status(self.status)

    @property
    def success(self) -> bool:
        """True for ``"max_iters"`` and ``"stopped"``."""
        return self.status in ("max_iters", "stopped")


def _initial_prior(model):
    nz = model.noise
    if nz.x1_mean is None:
        raise ValueError("particle EM needs a prior on the first state: set x1_mean/x1_std on the model "
                         "(model.with_noise(x1_mean=..., x1_std=...))")
    return nz.x1_mean, nz.x1_std ** 2


def saem_weights(gammas: list[float], memory: int) -> np.ndarray:
    """Weights (memory,) of the last ``memory`` iterations' samples, oldest first: iteration i of k gets
    ``gamma_i prod_{j>i} (1 - gamma_j)`` (0 before iteration 1), renormalised to sum to 1."""
    k = len(gammas)
    w = np.zeros(memory)
    for m in range(max(memory - k, 0), memory):
        i = k - memory + m  # 0-based iteration index of slot m
        w[m] = gammas[i] * np.prod([1.0 - g for g in gammas[i + 1:]])
    return w / w.sum()


def particle_em(model, data: Trajectories, theta0: Theta, *,
                options: ParticleEMOptions = ParticleEMOptions(), seed: int | np.random.Generator = 0,
                callback: Callable[[ParticleEMRecord], bool | None] | None = None) -> ParticleEMResult:
    """Particle EM (particle filter + FFBSi E-step, SAEM M-step) from ``theta0``.

    Parameters
    ----------
    model : StateSpaceModel
        With a prior on the first state (``x1_mean``, ``x1_std``).
    data : Trajectories
    theta0 : dict
        Initial parameters.
    options : ParticleEMOptions
    seed : int or numpy.random.Generator
        All random draws.
    callback : callable, optional
        Called with each `ParticleEMRecord`; returning True stops the loop.

    Returns
    -------
    ParticleEMResult

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from scripts.baselines import ParticleEMOptions, particle_em
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [1.0], 40, u=np.random.default_rng(0).normal(size=(40, 1)), seed=1)
    >>> opts = ParticleEMOptions(n_particles=30, n_smooth=3, max_iters=2, learner=cc.LearnerOptions(compile=False))
    >>> res = particle_em(model.with_noise(x1_mean=1.0, x1_std=0.1), data, {"a": 0.5}, options=opts, seed=0)
    >>> len(res.history), bool(0.5 < float(res.theta["a"]) < 1.0)
    (2, True)
    """
    with blas_threads(1):
        return _particle_em(model, data, theta0, options, seed, callback)


def _particle_em(model, data, theta0, options, seed, callback) -> ParticleEMResult:
    check_data(model, data)
    rng = np.random.default_rng(seed)
    theta_vec = model.theta_vector(theta0)
    m0, P0 = _initial_prior(model)
    B, Ns, K = len(data), options.n_smooth, options.memory
    t0 = time.perf_counter()
    pf = ParticleFilter(model, options.n_particles)
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
            res = pf.run(theta_vec, data.y[b], data.inputs(b), x0_mean=m0, x0_cov=P0, rng=rng)
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
