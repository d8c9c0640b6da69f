"""Certainty-equivalent EM (Algorithm 1 of Menda et al., ICML 2020).

Block coordinate ascent on the joint log-density J(x_{1:T}, theta):

    repeat
        x     <- argmax_x  J(x, theta) - rho_x ||x - x_prev||^2                 (smoothing)
        theta <- argmax_th J(x, th) - rho_theta ||th - theta_prev||^2 + log p(th) (learning)
    until the increase of J + log p(theta) over one iteration is at most tol * max(1, |J|)

Both solvers are built once and reused. A step whose solver fails (non-finite result or an
IPOPT error status) is not taken: the loop stops with ``status = "solver_failed"`` and the
last good iterate. A step that lowers the objective (possible when IPOPT stops early) is
rejected the same way, so the recorded objective never decreases.
"""
from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .data import Trajectories
from .errors import SolverError
from .initialise import check_states, eks_states
from .learner import Learner
from .objective import joint_log_density, log_prior
from .options import CEEMOptions
from .params import Theta
from .smoother import Smoother

log = logging.getLogger(__name__)


@dataclass
class IterationRecord:
    """One EM iteration: objective values, timings (s), solver statuses, the new theta."""

    iteration: int
    J: float
    objective: float
    decrease: float
    smooth_s: float
    learn_s: float
    smooth_status: list[str]
    learn_status: str
    theta: Theta
    accepted: bool = True


@dataclass
class CEEMResult:
    """Outcome of :func:`ceem`.

    status : ``"converged"``, ``"max_iters"`` or ``"solver_failed"``; message says more.
    theta : final parameters (dict); x : smoothed states, list of (T_b, nx) arrays.
    history : one :class:`IterationRecord` per iteration; build_s : one-off solver build time.
    """

    status: str
    message: str
    theta: Theta
    x: list
    J: float
    history: list[IterationRecord] = field(default_factory=list)
    build_s: float = 0.0
    init_J: float = float("nan")

    @property
    def success(self) -> bool:
        return self.status in ("converged", "max_iters")

    @property
    def iterations(self) -> int:
        return len(self.history)


# --- process pool for the smoothing step -------------------------------------------------
_WORKER: dict = {}


def _worker_init(model, smoother_options):
    _WORKER["smoother"] = Smoother(model, smoother_options)


def _worker_smooth(args):
    theta_vec, y, u, x0 = args
    sm = _WORKER["smoother"]
    return sm.for_length(y.shape[0]).solve(sm.model, theta_vec, y, u, x0)


class _SmoothingStep:
    """Sequential or process-parallel smoothing of all trajectories."""

    def __init__(self, smoother: Smoother, n_jobs: int):
        self.smoother, self.pool = smoother, None
        if n_jobs > 1:
            ctx = multiprocessing.get_context("fork")
            self.pool = ProcessPoolExecutor(n_jobs, mp_context=ctx, initializer=_worker_init,
                                            initargs=(smoother.model, smoother.options))

    def __call__(self, theta_vec, data, xs):
        if self.pool is None:
            return self.smoother.solve(theta_vec, data, xs)
        jobs = [(theta_vec, y, data.inputs(b), xs[b]) for b, y in enumerate(data.y)]
        return list(self.pool.map(_worker_smooth, jobs))

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()


def ceem(model, data: Trajectories, theta0: Theta, *, options: CEEMOptions = CEEMOptions(),
         x_init: list | None = None, callback: Callable[[IterationRecord], None] | None = None,
         smoother: Smoother | None = None, learner: Learner | None = None) -> CEEMResult:
    """Identify ``model`` from ``data`` with CE-EM, starting at ``theta0``.

    Parameters
    ----------
    model : :class:`~ceem_casadi.model.StateSpaceModel`.
    data : :class:`~ceem_casadi.data.Trajectories` (ny, nu must match the model).
    theta0 : initial parameters, a dict name -> array (all names; fixed entries stay as given).
    x_init : initial state trajectories, list of (T_b, nx); default: EKF + RTS with ``theta0``.
    callback : called with each :class:`IterationRecord`; return ``False`` to stop early.
    smoother, learner : prebuilt solvers to reuse across calls (same model / data shape).
    """
    if not isinstance(options, CEEMOptions):
        raise TypeError(f"options must be a CEEMOptions, got {type(options).__name__}")
    data.check_model(model)
    theta0 = model.params.validate(theta0)
    theta_vec = model.params.to_vector(theta0)
    first_x = np.zeros(model.nx) if x_init is None else np.asarray(x_init[0])[0]
    model.check(theta0, first_x, data.inputs(0)[0])

    t_build = time.perf_counter()
    smoother = smoother or Smoother(model, options.smoother)
    learner = learner or Learner(model, data.lengths, options.learner, smoother.stages)
    xs = eks_states(model, theta_vec, data) if x_init is None else check_states(model, data, x_init)
    for T in sorted(set(data.lengths)):
        smoother.for_length(T)
    build_s = time.perf_counter() - t_build
    use_prior = options.learner.use_prior

    def objective(J, tv):
        return J + (log_prior(model.params, tv) if use_prior else 0.0)

    J = joint_log_density(smoother, theta_vec, data, xs)
    obj = objective(J, theta_vec)
    result = CEEMResult("max_iters", "", model.params.from_vector(theta_vec), xs, J,
                        build_s=build_s, init_J=J)
    step = _SmoothingStep(smoother, options.n_jobs)
    try:
        for k in range(1, options.max_iters + 1):
            sm = step(theta_vec, data, xs)
            smooth_s = sum(r.wall_s for r in sm)
            failed = [b for b, r in enumerate(sm) if not np.all(np.isfinite(r.x))
                      or r.status not in _USABLE]
            if failed:
                result.status = "solver_failed"
                result.message = (f"iteration {k}: smoothing failed on trajectories {failed} "
                                  f"({[sm[b].status for b in failed]}); returning the last good iterate")
                break
            new_xs = [r.x for r in sm]
            lr = learner.solve(theta_vec, data, new_xs)
            if not np.all(np.isfinite(lr.theta_vec)) or lr.status not in _USABLE:
                result.status = "solver_failed"
                result.message = (f"iteration {k}: learning failed ({lr.status}); "
                                  "returning the last good iterate")
                break
            new_J = joint_log_density(smoother, lr.theta_vec, data, new_xs)
            new_obj = objective(new_J, lr.theta_vec)
            accepted = new_obj >= obj - 1e-9 * max(1.0, abs(obj))
            rec = IterationRecord(k, new_J, new_obj, new_obj - obj, smooth_s, lr.wall_s,
                                  [r.status for r in sm], lr.status,
                                  model.params.from_vector(lr.theta_vec), accepted)
            result.history.append(rec)
            log.info("CE-EM iteration %d: J=%.6g (increase %.3g), smooth %.3fs, learn %.3fs",
                     k, new_J, new_obj - obj, smooth_s, lr.wall_s)
            stop_cb = callback is not None and callback(rec) is False
            if not accepted:
                result.status = "converged"
                result.message = (f"iteration {k}: the step lowered the objective by {obj - new_obj:.3g} "
                                  "(solver tolerance reached); kept the previous iterate")
                break
            improvement = new_obj - obj
            xs, theta_vec, J, obj = new_xs, lr.theta_vec, new_J, new_obj
            result.theta, result.x, result.J = rec.theta, xs, J
            if improvement <= options.tol * max(1.0, abs(obj)):
                result.status = "converged"
                result.message = f"objective increase {improvement:.3g} below tol after {k} iterations"
                break
            if stop_cb:
                result.status = "stopped"
                result.message = f"stopped by the callback after {k} iterations"
                break
        else:
            result.message = f"reached max_iters={options.max_iters} without meeting tol"
    finally:
        step.close()
    if result.status == "solver_failed" and options.raise_on_failure:
        raise SolverError(result.message)
    return result


# IPOPT statuses whose iterate is usable (a step stopped by the iteration limit is still
# checked for improvement of the objective before it is accepted)
_USABLE = {"Solve_Succeeded", "Solved_To_Acceptable_Level", "Search_Direction_Becomes_Too_Small",
           "Maximum_Iterations_Exceeded", "Maximum_CpuTime_Exceeded", "Feasible_Point_Found"}
