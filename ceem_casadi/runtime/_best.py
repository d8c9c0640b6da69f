"""Best-iterate tracking (`BestIterate`) and `checked_status`: the guard shared by every step that can
stop on a budget or a failure (docs/runtime.md, "The guard")."""
from __future__ import annotations

import math

import numpy as np

from ._status import Status

__all__ = ["EXPLODING", "BestIterate", "checked_status"]

EXPLODING = 1e3  # an objective above EXPLODING times that of a stable restart is no fit


def checked_status(status: Status, f: float, *, reference: float | None = None,
                   factor: float = EXPLODING) -> tuple[Status, str]:
    """``(status, reason)``: ``status``, except a CONVERGED one on an objective ``f`` that is no fit: non-finite
    (``SOLVER_FAILED``) or above ``factor * reference``, a stable restart's objective (``STALLED``)."""
    status = Status(status)
    f = float(f)
    if status != Status.CONVERGED:
        return status, ""
    if not math.isfinite(f):
        return Status.SOLVER_FAILED, (f"the objective is not finite ({f}) although the solver reported "
                                      "convergence; start closer to the data or bound the parameters")
    if reference is not None and math.isfinite(reference) and f > factor * max(float(reference), 1e-300):
        return Status.STALLED, (f"the objective {f:.3g} is {f / max(reference, 1e-300):.2g} times that of a stable "
                                f"restart ({reference:.3g}): the model's free run explodes from this start; use "
                                "multiple shooting (shooting=k) or another start")
    return status, ""


class BestIterate:
    """The lowest-objective iterate with violation <= ``feasibility_tol`` seen from the start ``(x, f)``; kept
    iterates are clipped into ``lower``/``upper``; `choose` returns a final iterate within ``rtol * |f_best|``."""

    def __init__(self, x, f: float, *, feasibility_tol: float = math.inf, label: str = "the starting point",
                 lower=None, upper=None, rtol: float = 1e-9):
        self.x = np.array(x, float, copy=True)
        self.f = float(f)
        self.violation = 0.0
        self.label = label
        self.start_label = label
        self.feasibility_tol = float(feasibility_tol)
        self.offered = 0
        self.rtol = float(rtol)
        self.lower = None if lower is None else np.asarray(lower, float)
        self.upper = None if upper is None else np.asarray(upper, float)

    def better(self, f: float, violation: float = 0.0) -> bool:
        """Whether an iterate of objective ``f`` and violation ``violation`` beats the best."""
        f = float(f)
        return (math.isfinite(f) and math.isfinite(violation) and violation <= self.feasibility_tol
                and (not math.isfinite(self.f) or f < self.f))

    def offer(self, x, f: float, violation: float = 0.0, *, label: str = "an iterate") -> bool:
        """Keep ``x`` if it beats the best (finite, feasible, lower objective); return whether it did."""
        self.offered += 1
        if not self.better(f, violation):
            return False
        x = np.asarray(x, float)
        if not np.all(np.isfinite(x)):
            return False
        if self.lower is not None or self.upper is not None:
            x = np.clip(x, self.lower if self.lower is not None else -np.inf,
                        self.upper if self.upper is not None else np.inf)
        self.x, self.f, self.violation = x.copy(), float(f), float(violation)
        self.label = label
        return True

    @property
    def is_start(self) -> bool:
        """Whether no offered iterate beat the start."""
        return self.label == self.start_label

    def choose(self, x, f: float, violation: float = 0.0, *, label: str = "the final iterate"):
        """``(x, f, message)``: the final iterate ``x`` if it is at least as good as the best seen, else
        the best; ``message`` says which (e.g. ``"returning the final iterate"``)."""
        f = float(f)
        x = np.asarray(x, float)
        final_ok = (math.isfinite(f) and math.isfinite(violation) and violation <= self.feasibility_tol
                    and np.all(np.isfinite(x)) and (not math.isfinite(self.f) or f <= self.f + self.rtol * abs(self.f)))
        if final_ok:
            return x.copy(), f, f"returning {label}"
        digits = 4 if not math.isfinite(f) or abs(f - self.f) > 1e-3 * abs(f) else 12
        why = f"cost {self.f:.{digits}g} < {f:.{digits}g} of {label}" if math.isfinite(f) else f"{label} is not finite"
        if math.isfinite(f) and violation > self.feasibility_tol:
            why = f"{label} violates the constraints by {violation:.2g}"
        if self.is_start:
            return self.x.copy(), self.f, f"returning {self.label} (no iterate improved on it; {why})"
        return self.x.copy(), self.f, f"returning the best iterate seen ({self.label}, {why})"
