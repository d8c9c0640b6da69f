"""The accelerations of the EM loop as strategy objects (``CEEMOptions(acceleration=...)``), each building the
per-fit stepper the loop asks for a step of its own (docs/algorithms.md)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from ..runtime._checks import is_integer
from ..runtime._schema import ACCELERATIONS, HESSIANS, require
from ..runtime._status import Status
from ._joint_gauss_newton import JointGaussNewton, LinAlgError
from ._joint_nlp import JointSolver

__all__ = ["Acceleration", "Iterate", "Joint", "Newton", "Plain", "StepFailure", "Squarem", "acceleration_of",
           "squarem_point"]

log = logging.getLogger(__name__)


@dataclass
class Iterate:
    """One iterate of the loop: states (list of (T_b, nx)), flat theta, J and the objective."""

    xs: list
    theta_vec: np.ndarray
    J: float
    obj: float


class StepFailure(Exception):
    """A smoothing or learning solve failed: the loop returns the last good iterate."""


class _Stepper:
    """Plain EM: no step of its own, no extrapolation."""

    def propose(self, run, current: Iterate):
        """``(new iterate, record)`` of the acceleration's own step from ``current``, or None (take an EM step)."""
        return None

    def after(self, run, current: Iterate, accelerated: bool, small: bool) -> None:
        """The outcome of the iteration: whether it was the acceleration's step, whether its increase was small."""

    def extrapolate(self, run, current: Iterate, room: bool):
        """``(iterate, record)`` of an extrapolated step kept after ``current``, or None."""
        return None


@dataclass(frozen=True)
class Acceleration:
    """Base of the accelerations; an instance of it is plain EM (Algorithm 1 of the paper).

    Attributes
    ----------
    name : str
        The shorthand of ``CEEMOptions(acceleration=...)`` for this strategy with its defaults.

    Examples
    --------
    >>> from ceem_casadi.em import Acceleration, Newton
    >>> isinstance(Newton(), Acceleration), Acceleration.name
    (True, 'none')
    """

    name: str = field(default="none", init=False, repr=False)

    def stage_groups(self, stages) -> tuple:
        """Names of the stage Functions this acceleration evaluates (compiled with the smoother's)."""
        return ()

    def start(self, model, data, stages, *, use_prior: bool, smoother_options, warm) -> _Stepper:
        """The per-fit stepper (``warm``: the warm start's result or None)."""
        return _Stepper()


@dataclass(frozen=True)
class Plain(Acceleration):
    """Plain EM steps only (``"none"``).

    Attributes
    ----------
    name : str
        ``"none"``.

    Examples
    --------
    >>> from ceem_casadi.em import Plain, acceleration_of
    >>> acceleration_of("none") == Plain(), Plain.name
    (True, 'none')
    """


# --- SQUAREM --------------------------------------------------------------------------------------
def squarem_point(params, it0: Iterate, it1: Iterate, it2: Iterate) -> Iterate | None:
    """SQUAREM (Varadhan & Roland 2008, scheme S3) point from three successive iterates, clipped to
    the parameter bounds (``params.lower``, ``params.upper``); None when the iterates did not move or
    the point is not finite."""
    r = it1.theta_vec - it0.theta_vec
    v = it2.theta_vec - it1.theta_vec - r
    nv = np.linalg.norm(v)
    if nv == 0 or np.linalg.norm(r) == 0:
        return None
    alpha = min(-1.0, -np.linalg.norm(r) / nv)
    theta = np.clip(it0.theta_vec - 2 * alpha * r + alpha ** 2 * v, params.lower, params.upper)
    xs = [x0 - 2 * alpha * (x1 - x0) + alpha ** 2 * (x2 - 2 * x1 + x0) for x0, x1, x2 in zip(it0.xs, it1.xs, it2.xs)]
    if not (np.all(np.isfinite(theta)) and all(np.all(np.isfinite(x)) for x in xs)):
        return None
    return Iterate(xs, theta, np.nan, -np.inf)


class _SquaremStepper(_Stepper):
    def __init__(self):
        self.recent: list[Iterate] | None = None  # plain EM iterates since the last extrapolation

    def propose(self, run, current):
        if self.recent is None:
            self.recent = [current]
        return None

    def extrapolate(self, run, current, room):
        self.recent.append(current)
        if len(self.recent) < 3 or not room:
            return None
        point = squarem_point(run.model.params, *self.recent)
        self.recent = [current]
        if point is None:
            return None
        try:
            ext, rec = run.em_step(point, "extrapolated", current)
        except StepFailure:
            return None
        if rec.accepted and ext.obj > current.obj:
            self.recent = [ext]
            return ext, rec
        rec.accepted = False
        return None


@dataclass(frozen=True)
class Squarem(Acceleration):
    """After every two EM steps, one EM step from a SQUAREM extrapolation of theta and the states
    (Varadhan & Roland 2008, S3), kept only if it improves the objective (``"squarem"``).

    Attributes
    ----------
    name : str
        ``"squarem"``.

    Examples
    --------
    >>> from ceem_casadi.em import Squarem, acceleration_of
    >>> acceleration_of("squarem") == Squarem()
    True
    """

    name: str = field(default="squarem", init=False, repr=False)

    def start(self, model, data, stages, *, use_prior, smoother_options, warm):
        return _SquaremStepper()


# --- joint Gauss-Newton ---------------------------------------------------------------------------
class _NewtonStepper(_Stepper):
    def __init__(self, joint: JointGaussNewton, tries: int, due: bool):
        self.joint, self.tries, self.due = joint, tries, due

    def propose(self, run, current):
        return self._step(run, current) if self.due else None

    def after(self, run, current, accelerated, small):
        self.due = not (accelerated and small)  # convergence is judged on plain EM steps: check with one

    def _step(self, run, it: Iterate):
        """A joint Levenberg-Marquardt step on (x, theta) from ``it``, retried with more damping up to
        ``tries`` times; ``(new iterate, record)`` when one increases the objective, else None."""
        t0 = time.perf_counter()
        joint = self.joint
        for _ in range(self.tries):
            try:
                cand = joint.step(it.theta_vec, run.data, it.xs)
            except (LinAlgError, np.linalg.LinAlgError) as exc:
                log.debug("joint Gauss-Newton step failed (%s); more damping", exc)
                joint.adapt(False)
                continue
            if np.all(np.isfinite(cand.theta_vec)) and all(np.all(np.isfinite(x)) for x in cand.xs):
                new = run.evaluate(cand.xs, cand.theta_vec)
                if new.obj > it.obj:
                    joint.adapt(True)
                    return run.record(new, it, "newton", f"joint-gauss-newton (mu={cand.mu:.1e})",
                                      time.perf_counter() - t0)
            joint.adapt(False)
        return None


@dataclass(frozen=True)
class Newton(Acceleration):
    """After the first EM step, joint Gauss-Newton (Levenberg-Marquardt) steps on (x, theta), each
    kept only if it increases the objective, a plain EM step whenever one fails (``"newton"``;
    `ceem_casadi.em._joint_gauss_newton`).

    Parameters
    ----------
    tries : int
        Damping increases tried per iteration before falling back to an EM step (>= 1).

    Examples
    --------
    >>> from ceem_casadi.em import Newton, acceleration_of
    >>> acceleration_of("newton") == Newton(), Newton(tries=5).tries
    (True, 5)
    """

    name: str = field(default="newton", init=False, repr=False)
    tries: int = 3

    def __post_init__(self):
        require(is_integer(self.tries) and self.tries >= 1, f"Newton.tries must be an int >= 1, got {self.tries!r}")

    def stage_groups(self, stages):
        return (JointGaussNewton.stage_names(stages),)

    def start(self, model, data, stages, *, use_prior, smoother_options, warm):
        # the first iteration is a plain EM step (the EKF states at theta0 can be far from smoothed ones),
        # except after a converged warm start: theta is then near this record's optimum and the EKF states
        # at it near the smoothed ones (T = 10^5: 5 iterations instead of 6; tests/test_warm_start.py)
        due = warm is not None and Status(warm.status) == Status.CONVERGED
        return _NewtonStepper(JointGaussNewton(model, data.lengths, stages, use_prior=use_prior), self.tries, due)


# --- joint IPOPT NLP ------------------------------------------------------------------------------
class _JointStepper(_Stepper):
    def __init__(self, solver: JointSolver, max_failures: int):
        self.solver, self.max_failures, self.failures, self.due = solver, max_failures, 0, False

    def propose(self, run, current):
        if not self.due:
            return None
        out = self._solve(run, current)
        self.failures += out is None
        return out

    def after(self, run, current, accelerated, small):
        self.due = not accelerated and self.failures < self.max_failures  # after a joint solve: an EM step

    def _solve(self, run, it: Iterate):
        """The joint (x, theta) NLP solved from ``it``: ``(new iterate, record)`` when it increases the
        objective (also when stopped by the time limit), else None (nothing recorded)."""
        jr = self.solver.try_solve(it.theta_vec, it.xs)
        new = None if jr is None else run.evaluate(jr.xs, jr.theta_vec)
        if new is None or not new.obj > it.obj:
            return None
        return run.record(new, it, "joint", f"joint-ipopt ({jr.status}, {jr.iterations} iterations)", jr.wall_s)


@dataclass(frozen=True)
class Joint(Acceleration):
    """After the first EM step, IPOPT solves max over (x, theta) of J + log p(theta) as ONE NLP (all
    states, free parameters; arrowhead Hessian, `ceem_casadi.em._joint_nlp`), then a plain EM step
    checks it (``"joint"``).

    Parameters
    ----------
    hessian : str
        ``"auto"`` (Gauss-Newton, then exact once its progress per iteration is small), ``"exact"``
        or ``"gauss-newton"`` (was ``CEEMOptions.joint_hessian``).
    max_failures : int
        Joint solves without increase of the objective after which only EM steps are taken.

    Examples
    --------
    >>> from ceem_casadi.em import Joint, acceleration_of
    >>> acceleration_of("joint"), Joint(hessian="exact").hessian
    (Joint(hessian='auto', max_failures=2), 'exact')
    """

    name: str = field(default="joint", init=False, repr=False)
    hessian: str = "auto"
    max_failures: int = 2

    def __post_init__(self):
        require(self.hessian in (*HESSIANS, "auto"),
                f"Joint.hessian must be one of {(*HESSIANS, 'auto')}, got {self.hessian!r}")
        require(is_integer(self.max_failures) and self.max_failures >= 0,
                f"Joint.max_failures must be an int >= 0, got {self.max_failures!r}")

    def start(self, model, data, stages, *, use_prior, smoother_options, warm):
        solver = JointSolver(model, data, stages, hessian=self.hessian, use_prior=use_prior,
                             x_lower=smoother_options.x_lower, x_upper=smoother_options.x_upper)
        return _JointStepper(solver, self.max_failures)


_BY_NAME = {cls.name: cls for cls in (Plain, Squarem, Newton, Joint)}
assert tuple(_BY_NAME) == ACCELERATIONS


def acceleration_of(value) -> Acceleration:
    """The acceleration object of ``CEEMOptions.acceleration``: an `Acceleration` as given, a name
    (``"none"``, ``"squarem"``, ``"newton"``, ``"joint"``) as that acceleration with its defaults.

    Parameters
    ----------
    value : str or Acceleration

    Returns
    -------
    Acceleration

    Raises
    ------
    OptionsError
        Neither an `Acceleration` nor one of the names.

    Examples
    --------
    >>> from ceem_casadi.em import acceleration_of
    >>> acceleration_of("newton")
    Newton(tries=3)
    """
    if isinstance(value, Acceleration):
        return value
    require(isinstance(value, str) and value in _BY_NAME,
            f"acceleration must be one of {ACCELERATIONS} or an Acceleration (ceem_casadi.em.Newton(), ...), "
            f"got {value!r}")
    return _BY_NAME[value]()
