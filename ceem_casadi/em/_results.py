"""What a CE-EM fit returns: `CEEMResult` and one `IterationRecord` per iteration."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..model._params import Theta
from ..runtime._result import Result, format_table, theta_rows
from ..runtime._status import Status


@dataclass(repr=False)
class IterationRecord(Result):
    """One EM iteration: objective values, timings (s), solver statuses, the new theta.

    Attributes
    ----------
    iteration : int
        1-based iteration number (of this run; a resumed fit's checkpoint shifts it).
    J : float
        Joint log-density J(x, theta) after the step (all Gaussian constants included).
    objective : float
        The maximised objective: J plus log p(theta) when the learner uses the priors.
    increase : float
        ``objective`` minus the previous accepted objective; negative for a rejected step.
    smooth_s, learn_s : float
        Wall-clock seconds of the smoothing and learning steps.
    smooth_status : list of str
        IPOPT return status of each trajectory's smoothing solve.
    learn_status : str
        Return status of the learning solve (or a description of the joint step).
    theta : Theta
        Parameters after the step.
    accepted : bool
        Whether the step was kept (a step that lowers the objective is not).
    kind : str
        ``"em"`` (smoothing + learning), ``"newton"`` (joint Gauss-Newton step), ``"joint"``
        (joint IPOPT solve, `ceem_casadi.em._joint_nlp`) or ``"extrapolated"`` (SQUAREM step).
    x : list of numpy.ndarray or None
        The iteration's states (T_b, nx) per trajectory, only while the callback runs (so a
        checkpoint can store them); ``None`` in ``CEEMResult.history`` to keep memory flat.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> rec = cc.em.IterationRecord(1, J=-3.0, objective=-3.0, increase=0.5, smooth_s=0.01, learn_s=0.02,
    ...                             smooth_status=["Solve_Succeeded"], learn_status="Solve_Succeeded", theta={"a": 0.8})
    >>> rec.iteration, rec.kind, rec.accepted
    (1, 'em', True)
    """

    SUMMARY = ('iteration', 'kind', 'J', 'increase', 'accepted')

    iteration: int
    J: float
    objective: float
    increase: float
    smooth_s: float
    learn_s: float
    smooth_status: list[str]
    learn_status: str
    theta: Theta
    accepted: bool = True
    kind: str = "em"
    x: list | None = field(default=None, repr=False, compare=False)


@dataclass(repr=False)
class CEEMResult(Result):
    """Outcome of [`ceem`][ceem_casadi.ceem].

    Attributes
    ----------
    status : Status
        A ``str`` enum: ``"converged"``, ``"max_iters"``, ``"time_limit"``, ``"stopped"``
        (callback), ``"stalled"`` (a plain EM step lowered the objective: rejected) or
        ``"solver_failed"``; ``status.advice`` says what to try.
    message : str
        What happened, with the figures.
    theta : dict
        Final parameters, name -> array (the last accepted iterate).
    x : list of numpy.ndarray or None
        Smoothed states (T_b, nx) per trajectory; None (and ``J`` NaN) only when the time limit
        passed before the initial states of a long record were computed (``status`` "time_limit").
    J : float
        Joint log-density at (x, theta).
    history : list of IterationRecord
        One record per iteration.
    build_s : float
        One-off solver construction time (s) inside [`ceem`][ceem_casadi.ceem] (the initial EKF/RTS state
        estimate excluded).
    init_J : float
        J at the initial states and ``theta0``.
    warnings : list of str
        Warnings raised after the fit (e.g. weakly identifiable parameters).
    wall_s : float
        Seconds of the whole fit (solver construction, warm start and initial states included).
    warm_start : CEEMResult or None
        The fit of the leading samples of every trajectory that started this one
        (`CEEMOptions.warm_start`; its states are those of the leading part), or None.

    Examples
    --------
    What [`ceem`][ceem_casadi.ceem] returns (its example runs a fit), built here directly:

    >>> import ceem_casadi as cc
    >>> res = cc.CEEMResult(cc.Status.CONVERGED, "objective increase below tol", {"a": 0.8}, x=[], J=-3.0)
    >>> res.success, res.iterations, res.table().splitlines()[0]
    (True, 0, 'CEEMResult: converged after 0 iterations')
    """

    SUMMARY = ('status', 'iterations', 'J', 'theta')

    status: Status
    message: str
    theta: Theta
    x: list
    J: float
    history: list[IterationRecord] = field(default_factory=list)
    build_s: float = 0.0
    init_J: float = float("nan")
    warnings: list[str] = field(default_factory=list)
    wall_s: float = float("nan")
    warm_start: CEEMResult | None = field(default=None, repr=False)

    def table(self) -> str:
        """Status, iterations and the parameters as text (one row per parameter entry)."""
        head = f"{type(self).__name__}: {Status(self.status).value} after {self.iterations} iterations"
        return head + "\n" + format_table(["parameter", "value"], theta_rows(self.theta))

    @property
    def success(self) -> bool:
        """Whether ``status`` gives a regular estimate (converged, max_iters or time_limit)."""
        return Status(self.status).usable

    @property
    def iterations(self) -> int:
        """Number of iterations recorded in ``history``."""
        return len(self.history)
