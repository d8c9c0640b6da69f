"""Outcome of a fit: one ``str`` enum of statuses shared by every solver, each with its advice."""
from __future__ import annotations

from enum import Enum

__all__ = ["Status"]


class Status(str, Enum):
    """How a fit or solve ended: ``CONVERGED`` (tolerance met), ``MAX_ITERS``, ``TIME_LIMIT``
    (``time_limit`` spent), ``STALLED`` (no progress at round-off before the tolerance),
    ``SOLVER_FAILED`` (error or non-finite values), ``STOPPED`` (a callback asked to stop) or
    ``DIVERGED`` (the free run explodes). A ``str`` enum; ``advice`` says what to try. Every result
    keeps the last good iterate whatever its status.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> cc.Status("converged") is cc.Status.CONVERGED
    True
    >>> [s.value for s in cc.Status]          # doctest: +NORMALIZE_WHITESPACE
    ['converged', 'max_iters', 'time_limit', 'stalled', 'solver_failed', 'stopped', 'diverged']
    """

    CONVERGED = "converged"
    MAX_ITERS = "max_iters"
    TIME_LIMIT = "time_limit"
    STALLED = "stalled"
    SOLVER_FAILED = "solver_failed"
    STOPPED = "stopped"
    DIVERGED = "diverged"

    def __str__(self) -> str:  # f"{status}" and format() give "converged", not "Status.CONVERGED"
        return self.value

    @property
    def advice(self) -> str:
        """What happened and what to try, in one or two sentences."""
        return _ADVICE[self]

    @property
    def usable(self) -> bool:
        """True when the returned iterate is a regular result of the method (converged, or the
        iteration / time budget ran out on an iterate that only ever improved)."""
        return self in (Status.CONVERGED, Status.MAX_ITERS, Status.TIME_LIMIT)

    @classmethod
    def from_ipopt(cls, return_status: str, time_up: bool = False) -> Status:
        """Status of an IPOPT ``return_status`` string; ``time_up`` marks a stop requested by the
        library's deadline (IPOPT reports it as ``User_Requested_Stop``)."""
        if return_status == "User_Requested_Stop" and time_up:
            return cls.TIME_LIMIT
        return _IPOPT.get(return_status, cls.SOLVER_FAILED)


_IPOPT = {"Solve_Succeeded": Status.CONVERGED, "Solved_To_Acceptable_Level": Status.CONVERGED,
          "Maximum_Iterations_Exceeded": Status.MAX_ITERS, "Maximum_WallTime_Exceeded": Status.TIME_LIMIT,
          "Maximum_CpuTime_Exceeded": Status.TIME_LIMIT, "User_Requested_Stop": Status.STOPPED,
          "Search_Direction_Becomes_Too_Small": Status.STALLED, "Feasible_Point_Found": Status.STALLED}
_ADVICE = {
    Status.CONVERGED: "The stopping tolerance was met.",
    Status.MAX_ITERS: "The iteration limit was reached before the tolerance: raise max_iters, "
                      "or continue from the returned iterate.",
    Status.TIME_LIMIT: "The time budget was spent; the result is the last good iterate. Raise time_limit, "
                       "or continue from the returned iterate.",
    Status.STALLED: "Steps became too small to make progress before the tolerance was met (round-off or a "
                    "badly scaled problem): check the scaling of parameters and states, or loosen tol.",
    Status.SOLVER_FAILED: "A solver failed (error status or non-finite values); the result is the last good "
                          "iterate. Check the model for NaN/overflow at the iterate (model.check), tighten "
                          "parameter bounds, or start closer to a solution.",
    Status.STOPPED: "A callback asked to stop; the result is the last good iterate.",
    Status.DIVERGED: "The model's free run explodes from this start (its objective is far above that of "
                     "predicting zero output), so no convergence test means anything: use multiple shooting "
                     "(shooting=k: segments over which it grows ~10-fold at most), another start (starts=...), or "
                     "parameter bounds that keep the model stable."}
