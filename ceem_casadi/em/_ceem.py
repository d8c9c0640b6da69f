"""Certainty-equivalent EM (Algorithm 1 of Menda et al., ICML 2020).

Block coordinate ascent on the joint log-density J(x_{1:T}, theta):

    repeat
        x     <- argmax_x  J(x, theta) - rho_x ||x - x_prev||^2                 (smoothing)
        theta <- argmax_th J(x, th) - rho_theta ||th - theta_prev||^2 + log p(th) (learning)
    until the increase of J + log p(theta) over one iteration is at most tol * max(1, |J|)

Both solvers are built once and reused. A step whose solver fails (non-finite result or an
IPOPT error status) is not taken: the loop stops with ``status = "solver_failed"`` and the
last good iterate. A step that lowers the objective (possible when IPOPT stops early) is
rejected the same way (recorded with ``accepted=False``), the loop stops with
``status = "stalled"``, so the returned objective never decreases.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..distributed._executors import engine_has_learner, start_engine
from ..em._options import CEEMOptions
from ..errors import OptionsError, SolverError
from ..io._data import Trajectories
from ..io._validate import check_data
from ..learning._factory import learner_for
from ..learning._protocol import LearningStep
from ..model._params import Theta
from ..objective._log_density import log_prior
from ..objective._stages import SMOOTHER_STAGES
from ..runtime._solve import deadline, expired
from ..runtime._status import Status
from ..runtime._threads import blas_threads
from ..smoothing._batch_objective import BATCHED_STAGES
from ..smoothing._batched import any_batched, prepare_batched
from ..smoothing._initial_states import check_states, eks_states
from ..smoothing._smoother import Smoother
from ._joint_gauss_newton import JointGaussNewton, LinAlgError
from ._joint_nlp import JointSolver
from ._results import CEEMResult, IterationRecord
from ._smoothing_step import SmoothingStep
from ._warm_start import leading_fit

log = logging.getLogger(__name__)


_ENGINE_LEARNER = ("learner={learner} cannot be used with executor={executor}: this engine keeps the smoothed "
                   "states on its workers and learns from them with its own map-reduced learner, which a learner "
                   "given here would silently replace; drop learner= (the engine's learner follows "
                   "options.learner) or drop executor= to use your learner")


@dataclass
class _Iterate:
    xs: list
    theta_vec: np.ndarray
    J: float
    obj: float


class _Failure(Exception):
    pass


class _TimeUp(Exception):
    pass


_INTERRUPTED = "User_Requested_Stop"  # IPOPT's status when the deadline callback stopped it


class _EMRun:
    """State of one CE-EM run: the solvers, the current iterate, the history."""

    def __init__(self, model, data, options, smoother, learner, callback, engine=None):
        self.model, self.data, self.options = model, data, options
        self.smoother, self.learner, self.callback = smoother, learner, callback
        # idle workers help nobody
        self.step = engine if engine is not None else SmoothingStep(smoother, min(options.n_jobs, len(data)))
        self.history: list[IterationRecord] = []
        self.stop_requested = False

    def objective(self, J, theta_vec):
        return J + (log_prior(self.model.params, theta_vec) if self.options.learner.use_prior else 0.0)

    def evaluate(self, xs, theta_vec) -> _Iterate:
        J = self.step.log_density(theta_vec, self.data, xs)
        return _Iterate(xs, theta_vec, J, self.objective(J, theta_vec))

    def em_step(self, it: _Iterate, kind: str, reference: _Iterate) -> tuple[_Iterate, IterationRecord]:
        """One smoothing + learning step from ``it``; the record's increase is against ``reference``."""
        k = len(self.history) + 1
        sm = self.step(it.theta_vec, self.data, it.xs)
        if any(r.status == _INTERRUPTED for r in sm):
            raise _TimeUp(f"iteration {k}: time limit reached during the smoothing step (discarded)")
        failed = [b for b, r in enumerate(sm) if not self.step.finite(r) or r.status not in _USABLE]
        if failed:
            raise _Failure(f"iteration {k}: smoothing failed on trajectories {failed} "
                           f"({[sm[b].status for b in failed]}); returning the last good iterate")
        new_xs = self.step.states(sm)
        lr = self.learner.solve(it.theta_vec, self.data, new_xs)
        if lr.status == _INTERRUPTED:
            raise _TimeUp(f"iteration {k}: time limit reached during the learning step (discarded)")
        if not np.all(np.isfinite(lr.theta_vec)) or lr.status not in _USABLE:
            raise _Failure(f"iteration {k}: learning failed ({lr.status}); returning the last good iterate")
        new = self.evaluate(new_xs, lr.theta_vec)
        accepted = new.obj >= reference.obj - 1e-9 * max(1.0, abs(reference.obj))
        rec = IterationRecord(k, new.J, new.obj, new.obj - reference.obj, sum(r.wall_s for r in sm), lr.wall_s,
                              [r.status for r in sm], lr.status, self.model.params.from_vector(lr.theta_vec),
                              accepted, kind)
        self._record(rec, new_xs)
        return new, rec

    def _record(self, rec: IterationRecord, xs: list | None = None) -> None:
        self.history.append(rec)
        log.info("CE-EM iteration %d (%s): J=%.6g (increase %.3g), smooth %.3fs, learn %.3fs%s", rec.iteration,
                 rec.kind, rec.J, rec.increase, rec.smooth_s, rec.learn_s, "" if rec.accepted else " [rejected]")
        if self.callback is None:
            return
        rec.x = xs
        try:
            if self.callback(rec) is False:
                self.stop_requested = True
        finally:
            rec.x = None

    def newton_step(self, it: _Iterate, joint: JointGaussNewton, tries: int = 3):
        """A joint Gauss-Newton (Levenberg-Marquardt) step on (x, theta) from ``it``, retried with
        more damping up to ``tries`` times; ``(new iterate, record)`` when one increases the
        objective, else None (nothing recorded)."""
        t0 = time.perf_counter()
        for _ in range(tries):
            try:
                cand = joint.step(it.theta_vec, self.data, it.xs)
            except (LinAlgError, np.linalg.LinAlgError) as exc:
                log.debug("joint Gauss-Newton step failed (%s); more damping", exc)
                joint.adapt(False)
                continue
            if np.all(np.isfinite(cand.theta_vec)) and all(np.all(np.isfinite(x)) for x in cand.xs):
                new = self.evaluate(cand.xs, cand.theta_vec)
                if new.obj > it.obj:
                    joint.adapt(True)
                    rec = IterationRecord(len(self.history) + 1, new.J, new.obj, new.obj - it.obj, 0.0,
                                          time.perf_counter() - t0, [], f"joint-gauss-newton (mu={cand.mu:.1e})",
                                          self.model.params.from_vector(new.theta_vec), True, "newton")
                    self._record(rec, new.xs)
                    return new, rec
            joint.adapt(False)
        return None

    def joint_solve(self, it: _Iterate, solver: JointSolver):
        """The joint (x, theta) NLP solved from ``it``: ``(new iterate, record)`` when it increases the
        objective (also when stopped by the time limit), else None (nothing recorded)."""
        jr = solver.try_solve(it.theta_vec, it.xs)
        new = None if jr is None else self.evaluate(jr.xs, jr.theta_vec)
        if new is None or not new.obj > it.obj:
            return None
        rec = IterationRecord(len(self.history) + 1, new.J, new.obj, new.obj - it.obj, 0.0, jr.wall_s, [],
                              f"joint-ipopt ({jr.status}, {jr.iterations} iterations)",
                              self.model.params.from_vector(new.theta_vec), True, "joint")
        self._record(rec, new.xs)
        return new, rec

    def extrapolate(self, it0: _Iterate, it1: _Iterate, it2: _Iterate) -> _Iterate | None:
        """SQUAREM (Varadhan & Roland 2008, scheme S3) point from three successive iterates,
        clipped to the parameter bounds; None when the iterates did not move."""
        r = it1.theta_vec - it0.theta_vec
        v = it2.theta_vec - it1.theta_vec - r
        nv = np.linalg.norm(v)
        if nv == 0 or np.linalg.norm(r) == 0:
            return None
        alpha = min(-1.0, -np.linalg.norm(r) / nv)
        params = self.model.params
        theta = np.clip(it0.theta_vec - 2 * alpha * r + alpha ** 2 * v, params.lower, params.upper)
        xs = [x0 - 2 * alpha * (x1 - x0) + alpha ** 2 * (x2 - 2 * x1 + x0)
              for x0, x1, x2 in zip(it0.xs, it1.xs, it2.xs)]
        if not (np.all(np.isfinite(theta)) and all(np.all(np.isfinite(x)) for x in xs)):
            return None
        return _Iterate(xs, theta, np.nan, -np.inf)


def ceem(model, data: Trajectories, theta0: Theta, *, options: CEEMOptions = CEEMOptions(),
         x_init: list | None = None, callback: Callable[[IterationRecord], None] | None = None,
         smoother: Smoother | None = None, learner: LearningStep | None = None) -> CEEMResult:
    """Identify ``model`` from ``data`` with CE-EM, starting at ``theta0``.

    Parameters
    ----------
    model : StateSpaceModel
        The gray-box model (structure and noise model).
    data : Trajectories
        B trajectories; their ny and nu must match the model.
    theta0 : dict
        Initial parameters, name -> array (every name; fixed entries stay as given).
    options : CEEMOptions
        Loop, smoother and learner options.
    x_init : list of numpy.ndarray, optional
        Initial state trajectories (T_b, nx); default: EKF + RTS smoother at ``theta0``.
    callback : callable, optional
        Called with each [`IterationRecord`][ceem_casadi.em.IterationRecord]; return ``False`` to stop early.
    smoother : Smoother, optional
        A prebuilt smoother to reuse across calls (same model and data shape).
    learner : LearningStep, optional
        The learning step: any object with the `ceem_casadi.learning.LearningStep`
        protocol's ``solve`` (e.g. a prebuilt [`Learner`][ceem_casadi.learning.Learner] or an
        [`AdamLearner`][ceem_casadi.learning.AdamLearner]); default `learning.learner_for`. Not with a Dask
        ``executor``, whose engine learns from the states kept on its workers (refused with
        `OptionsError`).

    Returns
    -------
    CEEMResult
        Status (with advice), parameters, smoothed states, the iteration history.

    Raises
    ------
    SolverError
        Only with ``options.raise_on_failure``: a solver failed (the error carries the result).

    Notes
    -----
    With ``options.acceleration == "squarem"`` every two plain EM steps are followed by one
    step from a SQUAREM extrapolation of theta (and of the states, as a warm start); that step
    is kept only if it increases the objective beyond the plain steps, so the recorded
    objective still never decreases.

    With ``options.acceleration == "newton"`` the first iteration is a plain EM step (a joint step
    when a converged warm start, `CEEMOptions.warm_start`, gave the starting theta); then each
    iteration tries a joint Gauss-Newton (Levenberg-Marquardt) step on (x, theta)
    (`ceem_casadi.em._joint_gauss_newton`), kept only when it increases the objective (record
    kind ``"newton"``, its time in ``learn_s``), and falls back to a plain EM step otherwise.
    Convergence is always judged on a plain EM step, so the result is a fixed point of
    Algorithm 1; the trust regions rho_x, rho_theta apply to the EM steps only.

    With ``"joint"``, after the first (plain EM) step IPOPT solves max_{x, theta} J + log p(theta)
    in one NLP (`ceem_casadi.em._joint_nlp`; kind ``"joint"``, time in ``learn_s``), kept when it
    increases the objective; a plain EM step follows to judge convergence. After
    ``JOINT_MAX_FAILURES`` solves without increase, only EM steps are taken.

    Examples
    --------
    Recover a = 0.8 from 60 noisy samples, starting at a = 0.5 (no C compilation):

    >>> import numpy as np
    >>> import ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(
    ...     lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(60, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [0.0], 60, u=u, process_std=0.1,
    ...                       measurement_std=0.1, seed=1)
    >>> options = cc.CEEMOptions(smoother=cc.SmootherOptions(compile=False),
    ...                          learner=cc.LearnerOptions(compile=False))
    >>> fit = cc.ceem(model, data, {"a": 0.5}, options=options)
    >>> fit.status, round(float(fit.theta["a"]), 2)
    (<Status.CONVERGED: 'converged'>, 0.8)
    >>> fit.x[0].shape                        # smoothed states of trajectory 0, (T, nx)
    (60, 1)
    """
    if learner is not None and not isinstance(learner, LearningStep):
        raise TypeError(f"learner must implement the LearningStep protocol (a solve(theta_vec, data, xs, "
                        f"rho_theta=None, weights=None) method returning a LearnResult), got {type(learner).__name__}")
    if not isinstance(options, CEEMOptions):
        raise TypeError(f"options must be a CEEMOptions, got {type(options).__name__}")
    t_start = time.perf_counter()
    expires = None if options.time_limit is None else t_start + options.time_limit
    with blas_threads(options.blas_threads), deadline(expires):
        result = _ceem(model, data, theta0, options, x_init, callback, smoother, learner)
    result.wall_s = time.perf_counter() - t_start
    return result


def _ceem(model, data, theta0, options, x_init, callback, smoother, learner) -> CEEMResult:
    check_data(model, data)
    theta0 = model.params.validate(theta0)
    theta_vec = model.params.to_vector(theta0)
    first_x = np.zeros(model.nx) if x_init is None else np.asarray(x_init[0])[0]
    model.check(theta0, first_x, data.inputs(0)[0])

    t_build = time.perf_counter()
    smoother = smoother or Smoother(model, options.smoother)
    t_warm = time.perf_counter()
    warm = leading_fit(_ceem, model, data, theta_vec, options, x_init, smoother)
    if warm is not None and Status(warm.status).usable:
        theta_vec = model.params.to_vector(warm.theta)
    t_build += time.perf_counter() - t_warm  # build_s: this fit's own solver construction
    # every group of stage Functions this fit compiles (smoother, joint step; the learner's are among
    # the joint step's or asked for next) in one background pool of compilers, before any is waited for
    # the lengths the batched smoother does not take (ceem_casadi.batched_smoother) need SMOOTHER_STAGES
    unbatched = [T for T in set(data.lengths) if not any_batched(smoother.options, [T] * data.lengths.count(T))]
    smoother.stages.prefetch(*([SMOOTHER_STAGES] if unbatched else []),
                             *([JointGaussNewton.stage_names(smoother.stages)] if options.acceleration == "newton"
                               else []),
                             *([BATCHED_STAGES] if len(unbatched) < len(set(data.lengths)) else []))
    if learner is not None and engine_has_learner(options.executor):
        raise OptionsError(_ENGINE_LEARNER.format(learner=type(learner).__name__,
                                                  executor=type(options.executor).__name__))
    engine = None if options.executor is None else start_engine(options.executor, model, data, options, smoother)
    # long records: the learner's data terms piece by piece (no T-sized graph; ceem_casadi.learner_pieces)
    if learner is not None and getattr(engine, "learner", None) is not None:  # (refused before starting)
        engine.close()
        raise OptionsError(_ENGINE_LEARNER.format(learner=type(learner).__name__,
                                                  executor=type(options.executor).__name__))
    learner = learner or getattr(engine, "learner", None) or learner_for(model, data.lengths, options.learner,
                                                                         smoother.stages)
    joint = (JointGaussNewton(model, data.lengths, smoother.stages, use_prior=options.learner.use_prior)
             if options.acceleration == "newton" else None)
    if options.acceleration == "joint":
        joint = JointSolver(model, data, smoother.stages, hessian=options.joint_hessian,
                            use_prior=options.learner.use_prior, x_lower=options.smoother.x_lower,
                            x_upper=options.smoother.x_upper)
    # batched lengths: their mapped Functions, for the shards the worker processes (forked with
    # this smoother) will take; the others: one solver per length. An engine builds its own.
    if engine is None:
        prepare_batched(smoother, data.lengths, min(options.n_jobs, len(data)))
    for T in sorted(unbatched):
        smoother.for_length(T)
    build_s = time.perf_counter() - t_build
    xs = eks_states(model, theta_vec, data) if x_init is None else check_states(model, data, x_init)

    run = _EMRun(model, data, options, smoother, learner, callback, engine)
    current = run.evaluate(xs, theta_vec)
    result = CEEMResult(Status.MAX_ITERS, f"reached max_iters={options.max_iters} without meeting tol",
                        model.params.from_vector(theta_vec), xs, current.J, history=run.history,
                        build_s=build_s, init_J=current.J, warm_start=warm)
    recent: list[_Iterate] = [current]  # plain EM iterates since the last extrapolation

    def finish(status, message):
        result.status, result.message = Status(status), message

    def keep(it: _Iterate) -> None:  # the result always holds the last accepted iterate
        result.theta = model.params.from_vector(it.theta_vec)
        result.x, result.J = it.xs, it.J

    def time_up() -> bool:
        if expired():
            finish(Status.TIME_LIMIT, f"{_limit(options)} reached after {len(run.history)} "
                                      "iterations; returning the last accepted iterate")
            return True
        return False

    try:
        # the first iteration is a plain EM step (the EKF states at theta0 can be far from smoothed ones),
        # except for "newton" after a converged warm start: theta is then near this record's optimum
        # and the EKF states at it near the smoothed ones (T = 10^5: 5 iterations instead of 6, 11 s
        # instead of 17, same fixed point; tests/test_warm_start.py)
        try_newton = (options.acceleration == "newton" and warm is not None
                      and Status(warm.status) == Status.CONVERGED)
        joint_failures = 0
        while len(run.history) < options.max_iters and not time_up():
            stepped = None
            if joint is not None and try_newton:
                stepped = (run.newton_step if options.acceleration == "newton" else run.joint_solve)(current, joint)
                joint_failures += stepped is None
            if stepped is None:
                new, rec = run.em_step(current, "em", current)
                if not rec.accepted:
                    finish(Status.STALLED, f"iteration {rec.iteration}: the step lowered the objective by "
                                           f"{-rec.increase:.3g}; rejected, kept the previous iterate")
                    break
            else:
                new, rec = stepped
            improvement, current = new.obj - current.obj, new
            keep(current)
            small = improvement <= options.tol * max(1.0, abs(current.obj))
            # convergence is judged on plain EM steps: after a small joint step, check with one
            try_newton = joint is not None and not (stepped is not None and small)
            if options.acceleration == "joint":  # after a joint solve, check it with an EM step
                try_newton = stepped is None and joint_failures < JOINT_MAX_FAILURES
            if stepped is not None and small:
                small = False
            if options.acceleration == "squarem":  # (others: no history of states; 48 MB each at T = 10^6)
                recent.append(current)
            if options.acceleration == "squarem" and len(recent) == 3 and len(run.history) < options.max_iters:
                point = run.extrapolate(*recent)
                recent = [current]
                if point is not None:
                    try:
                        ext, rec = run.em_step(point, "extrapolated", current)
                    except _Failure:
                        ext, rec = None, None
                    if rec is not None and rec.accepted and ext.obj > current.obj:
                        improvement, current = ext.obj - current.obj, ext
                        recent = [current]
                    elif rec is not None:
                        rec.accepted = False
            keep(current)
            if small:
                finish("converged", f"objective increase {improvement:.3g} below tol after "
                                    f"{len(run.history)} iterations")
                break
            if run.stop_requested:
                finish("stopped", f"stopped by the callback after {len(run.history)} iterations")
                break
    except _Failure as exc:
        finish("solver_failed", str(exc))
    except _TimeUp as exc:
        finish(Status.TIME_LIMIT, f"{_limit(options)} reached: {exc}; returning the "
                                  f"last accepted iterate ({len(run.history)} iterations)")
    finally:
        result.x = list(result.x)  # distributed states are fetched from the workers here
        run.step.close()
    if result.status == "solver_failed" and options.raise_on_failure:
        raise SolverError(result.message, result)
    _check_learning_hessian(result, learner, model, data)
    return result


JOINT_MAX_FAILURES = 2  # joint solves without increase of the objective before EM steps only



def _limit(options) -> str:
    """'the time limit of 5 s', or 'the time limit' when the deadline came from an enclosing call."""
    return "the time limit" if options.time_limit is None else f"the time limit of {options.time_limit:g} s"


# above this many free parameters the final identifiability check (an eigen-decomposition) is skipped
IDENTIFIABILITY_CHECK_MAX = 1000
# relative eigenvalue below which a direction of the learning Hessian counts as singular
IDENTIFIABILITY_TOL = 1e-10


def _check_learning_hessian(result: CEEMResult, learner: LearningStep, model, data) -> None:
    """Warn (``result.warnings`` and the log) when the learning step's Hessian at the final
    iterate is singular in some direction (see `ceem_casadi.objective._identifiability`)."""
    from ..objective._identifiability import describe, entry_names, weak_directions

    free = model.params.free_index
    hessian = getattr(learner, "hessian_matrix", None)  # custom learners (e.g. Adam) may have none
    if hessian is None or result.x is None or not 0 < free.size <= IDENTIFIABILITY_CHECK_MAX:
        return
    H = hessian(model.params.to_vector(result.theta), data, result.x)
    if H is None or not np.all(np.isfinite(H)):
        return
    dirs = weak_directions(H, entry_names(model.params, free), IDENTIFIABILITY_TOL)
    if dirs:
        msg = describe(dirs, "the learning step's Hessian")
        result.warnings.append(msg)
        log.warning(msg)


# IPOPT statuses whose iterate is usable (a step stopped by the iteration limit is still
# checked for improvement of the objective before it is accepted)
_USABLE = {"Solve_Succeeded", "Solved_To_Acceptable_Level", "Search_Direction_Becomes_Too_Small",
           "Maximum_Iterations_Exceeded", "Maximum_CpuTime_Exceeded", "Feasible_Point_Found"}
