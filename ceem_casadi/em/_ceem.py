"""Certainty-equivalent EM (Algorithm 1 of Menda et al., ICML 2020): smoothing and learning steps alternated on
J(x, theta), a failed or descending step never taken (the loop and its stopping rules: docs/algorithms.md)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..distributed._executors import engine_has_learner, start_engine
from ..em._options import CEEMOptions, FitPlan
from ..errors import OptionsError, SolverError
from ..io._data import Trajectories
from ..io._validate import check_data
from ..learning._factory import learner_for
from ..learning._protocol import LearningStep
from ..model._params import Theta
from ..objective._identifiability import describe, entry_names, weak_directions
from ..objective._log_density import log_prior
from ..objective._stages import SMOOTHER_STAGES
from ..runtime._solve import ACCEPTABLE, TimeLimitReached, deadline, expired
from ..runtime._status import Status
from ..runtime._threads import blas_threads
from ..smoothing._batch_objective import BATCHED_STAGES
from ..smoothing._batched import any_batched, prepare_batched
from ..smoothing._initial_states import check_states, eks_states
from ..smoothing._smoother import Smoother
from ._accelerations import Iterate, StepFailure
from ._results import CEEMResult, IterationRecord
from ._smoothing_step import SmoothingStep
from ._warm_start import leading_fit, warm_start_length

log = logging.getLogger(__name__)


_ENGINE_LEARNER = ("learner={learner} cannot be used with executor={executor}: this engine keeps the smoothed "
                   "states on its workers and learns from them with its own map-reduced learner, which a learner "
                   "given here would silently replace; drop learner= (the engine's learner follows "
                   "options.learner) or drop executor= to use your learner")


_INTERRUPTED = "User_Requested_Stop"  # IPOPT's status when the deadline callback stopped it


class _EMRun:
    """State of one CE-EM run: the solvers, the current iterate, the history."""

    def __init__(self, model, data, plan: FitPlan, learner, callback, step):
        self.model, self.data, self.plan = model, data, plan
        self.learner, self.callback, self.step = learner, callback, step
        self.history: list[IterationRecord] = []
        self.stop_requested = False

    def objective(self, J, theta_vec):
        return J + (log_prior(self.model.params, theta_vec) if self.plan.learner.use_prior else 0.0)

    def evaluate(self, xs, theta_vec) -> Iterate:
        J = self.step.log_density(theta_vec, self.data, xs)
        return Iterate(xs, theta_vec, J, self.objective(J, theta_vec))

    def em_step(self, it: Iterate, kind: str, reference: Iterate) -> tuple[Iterate, IterationRecord]:
        """One smoothing + learning step from ``it``; the record's increase is against ``reference``."""
        k = len(self.history) + 1
        sm = self.step(it.theta_vec, self.data, it.xs)
        if any(r.status == _INTERRUPTED for r in sm):
            raise TimeLimitReached(f"iteration {k}: time limit reached during the smoothing step (discarded)")
        failed = [b for b, r in enumerate(sm) if not self.step.finite(r) or r.status not in _USABLE]
        if failed:
            raise StepFailure(f"iteration {k}: smoothing failed on trajectories {failed} "
                              f"({[sm[b].status for b in failed]}); returning the last good iterate")
        new_xs = self.step.states(sm)
        lr = self.learner.solve(it.theta_vec, self.data, new_xs)
        if lr.status == _INTERRUPTED:
            raise TimeLimitReached(f"iteration {k}: time limit reached during the learning step (discarded)")
        if not np.all(np.isfinite(lr.theta_vec)) or lr.status not in _USABLE:
            raise StepFailure(f"iteration {k}: learning failed ({lr.status}); returning the last good iterate")
        new = self.evaluate(new_xs, lr.theta_vec)
        accepted = new.obj >= reference.obj - 1e-9 * max(1.0, abs(reference.obj))
        return self.record(new, reference, kind, lr.status, lr.wall_s, sm, accepted)

    def record(self, new: Iterate, reference: Iterate, kind: str, learn_status: str, learn_s: float, smoothed=(),
               accepted: bool = True) -> tuple[Iterate, IterationRecord]:
        """``(new, its record)``: the step (its increase against ``reference``) logged and given to the callback."""
        rec = IterationRecord(len(self.history) + 1, new.J, new.obj, new.obj - reference.obj,
                              sum((r.wall_s for r in smoothed), 0.0), learn_s, [r.status for r in smoothed],
                              learn_status, self.model.params.from_vector(new.theta_vec), accepted, kind)
        self.history.append(rec)
        log.info("CE-EM iteration %d (%s): J=%.6g (increase %.3g), smooth %.3fs, learn %.3fs%s", rec.iteration,
                 rec.kind, rec.J, rec.increase, rec.smooth_s, rec.learn_s, "" if rec.accepted else " [rejected]")
        if self.callback is not None:
            rec.x = new.xs
            try:
                if self.callback(rec) is False:
                    self.stop_requested = True
            finally:
                rec.x = None
        return new, rec


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
        Any object with the `ceem_casadi.learning.LearningStep` protocol's ``solve`` (e.g. a prebuilt
        [`Learner`][ceem_casadi.learning.Learner]); default `learning.learner_for`. Not with a Dask
        ``executor``, whose engine learns on its workers (`OptionsError`).

    Returns
    -------
    CEEMResult
        Status (with advice), parameters, smoothed states, the iteration history. Convergence is judged on a
        plain EM step: a fixed point of Algorithm 1 whatever the acceleration (docs/algorithms.md).

    Raises
    ------
    SolverError
        Only with ``options.raise_on_failure``: a solver failed (the error carries the result).

    Examples
    --------
    Recover a = 0.8 from 60 noisy samples, starting at a = 0.5 (no C compilation):

    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(60, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [0.0], 60, u=u, process_std=0.1, measurement_std=0.1, seed=1)
    >>> options = cc.CEEMOptions(smoother=cc.SmootherOptions(compile=False), learner=cc.LearnerOptions(compile=False))
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
    plan = FitPlan.of(options)  # the strategies, resolved once: each floor gets its own object
    t_start = time.perf_counter()
    expires = None if plan.time_limit is None else t_start + plan.time_limit
    with blas_threads(1), deadline(expires):  # threaded BLAS measured slower (docs/algorithms.md)
        result = _ceem(model, data, theta0, plan, x_init, callback, smoother, learner)
    result.wall_s = time.perf_counter() - t_start
    return result


def _ceem(model, data, theta0, plan: FitPlan, x_init, callback, smoother, learner) -> CEEMResult:
    check_data(model, data)
    theta0 = model.params.validate(theta0)
    theta_vec = model.params.to_vector(theta0)
    first_x = np.zeros(model.nx) if x_init is None else np.asarray(x_init[0])[0]
    model.check(theta0, first_x, data.inputs(0)[0])

    t_build = time.perf_counter()
    smoother = smoother or Smoother(model, plan.smoother)
    t_warm = time.perf_counter()
    lead_plan = replace(plan, warm_start=0, raise_on_failure=False)
    warm = leading_fit(lambda lead, theta: _ceem(model, lead, theta, lead_plan, None, None, smoother, None),
                       model, data, theta_vec, warm_start_length(plan.warm_start, data.lengths, x_init, plan.executor))
    if warm is not None and Status(warm.status).usable:
        theta_vec = model.params.to_vector(warm.theta)
    t_build += time.perf_counter() - t_warm  # build_s: this fit's own solver construction
    if warm is not None and expired():  # a long record whose warm start (or reading, building) used the time
        return _stopped_early(model, theta_vec, warm, plan, "before the initial states of the whole record")
    engine, learner, stepper = _build(model, data, plan, smoother, learner, warm)
    build_s = time.perf_counter() - t_build
    try:
        xs = eks_states(model, theta_vec, data, stop_at_deadline=True) if x_init is None else \
            check_states(model, data, x_init)
    except TimeLimitReached:
        return _stopped_early(model, theta_vec, warm, plan, "during the initial states (EKF)")

    # idle workers help nobody; an engine smooths on its own workers
    step = engine if engine is not None else SmoothingStep(smoother, min(plan.n_jobs, len(data)))
    run = _EMRun(model, data, plan, learner, callback, step)
    current = run.evaluate(xs, theta_vec)
    result = CEEMResult(Status.MAX_ITERS, f"reached max_iters={plan.max_iters} without meeting tol",
                        model.params.from_vector(theta_vec), xs, current.J, history=run.history,
                        build_s=build_s, init_J=current.J, warm_start=warm)
    start, xs, current = [current], None, None  # held by _iterate alone: the first states go once replaced (48 MB)
    try:
        _iterate(run, stepper, start, result)
    except StepFailure as exc:
        _finish(result, Status.SOLVER_FAILED, str(exc))
    except TimeLimitReached as exc:
        _finish(result, Status.TIME_LIMIT, f"{_limit(plan)} reached: {exc}; returning the "
                                           f"last accepted iterate ({len(run.history)} iterations)")
    finally:
        result.x = list(result.x)  # distributed states are fetched from the workers here
        step.close()
    if result.status == Status.SOLVER_FAILED and plan.raise_on_failure:
        raise SolverError(result.message, result)
    if result.status != Status.TIME_LIMIT:  # a diagnostic over the whole record: not past the time limit
        _check_learning_hessian(result, learner, model, data)
    return result


def _stopped_early(model, theta_vec, warm, plan: FitPlan, when: str) -> CEEMResult:
    """The result of a long record's fit whose time limit passed before the EKF states of the whole record: the warm
    start's parameters when it ran (else theta0), no states (``x`` None), J NaN."""
    source = "the warm start's parameters" if warm is not None and Status(warm.status).usable else "theta0"
    return CEEMResult(Status.TIME_LIMIT, f"{_limit(plan)} reached {when}; returning {source} (no states of "
                      f"the whole record)", model.params.from_vector(theta_vec), None, float("nan"), history=[],
                      init_J=float("nan"), warm_start=warm)


def _build(model, data, plan: FitPlan, smoother: Smoother, learner, warm):
    """``(engine or None, learning step, acceleration stepper)`` of one fit, with every stage Function
    it needs compiled (in one background pool) and the smoother's solvers built for every length."""
    # the lengths the batched smoother does not take (ceem_casadi.smoothing._batched) need SMOOTHER_STAGES
    lengths = data.lengths
    unbatched = [T for T in set(lengths) if not any_batched(smoother.options, [T] * lengths.count(T))]
    smoother.stages.prefetch(*([SMOOTHER_STAGES] if unbatched else []),
                             *plan.acceleration.stage_groups(smoother.stages),
                             *([BATCHED_STAGES] if len(unbatched) < len(set(lengths)) else []))
    engine = _engine(model, data, plan, smoother, learner)
    # long records: the learner's data terms piece by piece (no T-sized graph; ceem_casadi.learning._pieces)
    learner = learner or getattr(engine, "learner", None) or learner_for(model, lengths, plan.learner,
                                                                         smoother.stages)
    stepper = plan.acceleration.start(model, data, smoother.stages, use_prior=plan.learner.use_prior,
                                      smoother_options=plan.smoother, warm=warm)
    # batched lengths: their mapped Functions, for the shards the worker processes (forked with
    # this smoother) will take; the others: one solver per length. An engine builds its own.
    if engine is None:
        prepare_batched(smoother, lengths, min(plan.n_jobs, len(data)))
    for T in sorted(unbatched):
        smoother.for_length(T)
    return engine, learner, stepper


def _engine(model, data, plan: FitPlan, smoother: Smoother, learner):
    """The distributed engine of ``plan.executor`` (None without one); refuses a user's learner
    where the engine learns on its own workers."""
    if plan.executor is None:
        return None
    if learner is not None and engine_has_learner(plan.executor):
        raise OptionsError(_ENGINE_LEARNER.format(learner=type(learner).__name__,
                                                  executor=type(plan.executor).__name__))
    return start_engine(plan.executor, model, data, plan.smoother, plan.learner, smoother)


def _iterate(run: _EMRun, stepper, start: list, result: CEEMResult) -> None:
    """The loop from ``start.pop()`` (the first iterate): the acceleration's step when it proposes one, else a plain
    EM step; stops on convergence (judged on plain EM steps), the callback, the budget of iterations or time."""
    plan, current = run.plan, start.pop()
    while len(run.history) < plan.max_iters:
        if expired():
            _finish(result, Status.TIME_LIMIT, f"{_limit(plan)} reached after {len(run.history)} iterations; "
                                               "returning the last accepted iterate")
            return
        stepped = stepper.propose(run, current)
        if stepped is None:
            new, rec = run.em_step(current, "em", current)
            if not rec.accepted:
                _finish(result, Status.STALLED, f"iteration {rec.iteration}: the step lowered the objective by "
                                                f"{-rec.increase:.3g}; rejected, kept the previous iterate")
                return
        else:
            new, rec = stepped
        improvement, current = new.obj - current.obj, new
        _keep(result, run.model, current)
        small = improvement <= plan.tol * max(1.0, abs(current.obj))
        stepper.after(run, current, stepped is not None, small)
        extrapolated = stepper.extrapolate(run, current, len(run.history) < plan.max_iters)
        if extrapolated is not None:
            improvement, current = extrapolated[0].obj - current.obj, extrapolated[0]
            _keep(result, run.model, current)
        if small and stepped is None:  # convergence is judged on plain EM steps
            _finish(result, Status.CONVERGED, f"objective increase {improvement:.3g} below tol after "
                                              f"{len(run.history)} iterations")
            return
        if run.stop_requested:
            _finish(result, Status.STOPPED, f"stopped by the callback after {len(run.history)} iterations")
            return


def _finish(result: CEEMResult, status, message: str) -> None:
    result.status, result.message = Status(status), message


def _keep(result: CEEMResult, model, it: Iterate) -> None:
    """The result always holds the last accepted iterate."""
    result.theta = model.params.from_vector(it.theta_vec)
    result.x, result.J = it.xs, it.J


def _limit(plan: FitPlan) -> str:
    """'the time limit of 5 s', or 'the time limit' when the deadline came from an enclosing call."""
    return "the time limit" if plan.time_limit is None else f"the time limit of {plan.time_limit:g} s"


# above this many free parameters the final identifiability check (an eigen-decomposition) is skipped
IDENTIFIABILITY_CHECK_MAX = 1000
# relative eigenvalue below which a direction of the learning Hessian counts as singular
IDENTIFIABILITY_TOL = 1e-10


def _check_learning_hessian(result: CEEMResult, learner: LearningStep, model, data) -> None:
    """Warn (``result.warnings`` and the log) when the learning step's Hessian at the final
    iterate is singular in some direction (see `ceem_casadi.objective._identifiability`)."""
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
_USABLE = ACCEPTABLE | {"Maximum_Iterations_Exceeded", "Maximum_CpuTime_Exceeded", "Feasible_Point_Found"}
