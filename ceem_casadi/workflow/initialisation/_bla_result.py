"""Result of [`bla_initialise`][ceem_casadi.workflow.bla_initialise]: the splits it tried and the
initialised model (the initialiser itself: `ceem_casadi.workflow.initialisation._bla`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...baselines._n4sid import N4SIDResult
from ...model._model import StateSpaceModel
from ...runtime._result import format_table
from ._frf_fit import FRFFit

__all__ = ["BLAInit", "SplitFit"]


@dataclass
class SplitFit:
    """One split tried: poles and zeros (complex arrays) of G1 and G2 (G2 empty for one-block models),
    simulation RMS of the least-squares fit (units of y), the fitted coefficients, and the BLA it
    splits (``bla``: ``"n4sid"``, ``"frf"`` or ``"user"``)."""

    g1_poles: np.ndarray
    g1_zeros: np.ndarray
    g2_poles: np.ndarray
    g2_zeros: np.ndarray
    rms: float
    coef: np.ndarray = field(repr=False)
    scale: float = 1.0
    center: float = 0.0
    bla: str = "n4sid"


@dataclass
class BLAInit:
    """Outcome of `bla_initialise`: ``model`` (the factory's, with ``scale`` set), ``theta`` (dict), ``table``
    (list of `SplitFit`, best first), ``bla`` (the BLA of the best split: the N4SID result or a state-space
    object), ``frf`` (the [`FRFFit`][ceem_casadi.workflow.FRFFit] of a ``period=`` call, else None) and ``x0``
    (B, nx) zeros, the rest the least squares simulate from: refine from there,
    ``cc.refine_output_error(init.model, data, init.theta, x0=init.x0)`` (docs/block_oriented.md)."""

    model: StateSpaceModel
    theta: dict
    table: list
    bla: N4SIDResult
    x0: np.ndarray
    bla_rms: float = float("nan")
    conditioning: dict = field(default_factory=dict)
    frf: FRFFit | None = None
    refinement: object = None  # the output-error polish's OutputErrorResult (``refine=True``), else None

    @property
    def best(self) -> SplitFit:
        return self.table[0]

    def format_table(self, rows: int = 10) -> str:
        """The best ``rows`` splits as text: RMS, then G1's and G2's poles (modulus, angle in rad)."""
        def fmt(p):
            return " ".join(f"{abs(z):.3f}@{np.angle(z):+.2f}" for z in p if np.angle(z) >= 0) or "-"
        return format_table(["rms", "G1 poles (|p|@angle, one per pair)", "G2 poles"],
                            [[s.rms, fmt(s.g1_poles), fmt(s.g2_poles)] for s in self.table[:rows]])
