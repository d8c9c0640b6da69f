"""Options and results of the noise-level calibration ([`calibrate_noise`][ceem_casadi.calibrate_noise])."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..em._ceem import CEEMResult
from ..em._options import CEEMOptions
from ..model._params import Theta
from ..runtime._result import Result, plain
from ..runtime._schema import check_fields, check_time_limit, require

__all__ = ["CRITERIA", "DEFAULT_GRID", "NOT_RUN", "NoiseCalibrationOptions", "NoiseCalibrationResult", "NoiseLevelFit"]

CRITERIA = ("innovation", "holdout")
#: default grid: multipliers of the model's ``process_std``, 0.032 ... 32 (7 levels a factor sqrt(10) apart)
DEFAULT_GRID = tuple(float(v) for v in np.logspace(-1.5, 1.5, 7))
NOT_RUN = "not_run"


@dataclass(frozen=True)
class NoiseCalibrationOptions:
    """Options of [`calibrate_noise`][ceem_casadi.calibrate_noise] (defaults in brackets).

    Parameters
    ----------
    ceem : CEEMOptions
        Options of every CE-EM fit [``CEEMOptions(max_iters=50, acceleration="newton")``]; its ``time_limit``
        is capped by what remains of ``time_limit`` when a fit starts.
    n_jobs : int
        Processes running the chains [1].
    chains : int, optional
        Warm-start chains [None: ``n_jobs``] (docs/noise_calibration.md); results depend on ``chains``, never
        on ``n_jobs``.
    time_limit : float, optional
        Overall budget in seconds [None]; levels not started in time have status ``"not_run"``.
    holdout_fraction : float
        Fraction of each trajectory held out as its tail by the ``"holdout"`` criterion [0.25].
    x0_window : int
        Samples at the start of each tail used to estimate its initial state [10].

    Raises
    ------
    OptionsError
        A value of the wrong type or out of range.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> opts = cc.NoiseCalibrationOptions(holdout_fraction=0.3, ceem=cc.CEEMOptions(max_iters=10))
    >>> opts.holdout_fraction, opts.ceem.max_iters, opts.chains
    (0.3, 10, None)
    """

    ceem: CEEMOptions = field(default_factory=lambda: CEEMOptions(max_iters=50, acceleration="newton"))
    n_jobs: int = 1
    chains: int | None = None
    time_limit: float | None = None
    holdout_fraction: float = 0.25
    x0_window: int = 10

    def __post_init__(self):
        check_fields(self)  # the types: a CEEMOptions, ints, finite floats
        require(self.n_jobs >= 1, f"n_jobs must be an int >= 1, got {self.n_jobs!r}")
        require(self.chains is None or self.chains >= 1, f"chains must be None or an int >= 1, got {self.chains!r}")
        check_time_limit(self.time_limit)
        require(0 < self.holdout_fraction < 1, f"holdout_fraction must be in (0, 1), got {self.holdout_fraction!r}")
        require(self.x0_window >= 1, f"x0_window must be an int >= 1, got {self.x0_window!r}")


@dataclass(repr=False)
class NoiseLevelFit(Result):
    """The chosen process-noise level.

    Attributes
    ----------
    level : float
        Multiplier of the model's ``process_std``.
    process_std : numpy.ndarray
        (nx,) process noise standard deviations at that level.
    theta : dict
        Fitted parameters.
    model : StateSpaceModel
        The model with that process noise.
    fit : CEEMResult
        Its fit (with ``"holdout"``: the refit on the whole data).
    criterion : float
        The value that chose it (with ``"holdout"``: that of the fit on the heads).

    Examples
    --------
    ``calibrate_noise(...).best`` (`NoiseCalibrationResult` shows a whole calibration):

    >>> import numpy as np
    >>> from ceem_casadi.workflow import NoiseLevelFit
    >>> best = NoiseLevelFit(0.5, np.array([0.05]), {"a": 0.8}, model=None, fit=None, criterion=-12.5)
    >>> best.level, best.process_std
    (0.5, array([0.05]))
    """

    SUMMARY = ('level', 'criterion', 'theta')

    level: float
    process_std: np.ndarray
    theta: Theta
    model: object
    fit: CEEMResult
    criterion: float


@dataclass(repr=False)
class NoiseCalibrationResult(Result):
    """Outcome of [`calibrate_noise`][ceem_casadi.calibrate_noise].

    Attributes
    ----------
    levels : pandas.DataFrame
        One row per level (ascending): ``level``, ``process_std`` (tuple, nx), ``J``, ``criterion``, ``status``
        (or ``"not_run"``), ``iterations``, ``seconds``, ``fit`` ([`CEEMResult`][ceem_casadi.CEEMResult] or None).
    criterion : str
        ``"innovation"`` (higher is better) or ``"holdout"`` (lower is better).
    best : NoiseLevelFit
    seconds : float
        Wall time of the whole calibration.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [1.0], 40, u=np.random.default_rng(0).normal(size=(40, 1)),
    ...                       process_std=0.1, seed=1)
    >>> options = cc.NoiseCalibrationOptions(ceem=cc.CEEMOptions(max_iters=5, smoother=cc.SmootherOptions(
    ...     compile=False), learner=cc.LearnerOptions(compile=False)))
    >>> res = cc.calibrate_noise(model, data, {"a": 0.5}, grid=[0.5, 1.0], options=options)
    >>> res.criterion, len(res.levels)
    ('innovation', 2)
    """

    SUMMARY = ('criterion', 'best', 'seconds')

    levels: object
    criterion: str
    best: NoiseLevelFit
    seconds: float = 0.0

    def table(self) -> str:
        """One line per level: level, J, criterion, status, iterations, seconds; the chosen one marked."""
        df = self.levels.drop(columns=[c for c in ("fit", "process_std") if c in self.levels])
        chosen = ["*" if lev == self.best.level else "" for lev in df["level"]]
        return df.assign(chosen=chosen).to_string(index=False)

    def to_dict(self) -> dict:
        """The levels' rows (without the fitted results), the criterion, the chosen level, the wall time."""
        rows = self.levels.drop(columns=[c for c in ("fit",) if c in self.levels]).to_dict(orient="records")
        return {"levels": plain(rows), "criterion": self.criterion, "best_level": float(self.best.level),
                "best_theta": plain(self.best.theta), "seconds": self.seconds}

    def plot(self, ax=None):
        """Criterion (left axis) and J (right axis) against the level (log scale), the chosen level marked; on
        ``ax`` (a matplotlib Axes, default a new figure), which is returned."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 4))
        df = self.levels[self.levels["status"] != NOT_RUN]
        label = {"innovation": "EKF innovation log-likelihood", "holdout": "holdout free-run RMS"}[self.criterion]
        ax.plot(df["level"], df["criterion"], "o-", color="C0", label=label)
        ax.plot([self.best.level], [self.best.criterion], "*", ms=16, color="C3", label=f"chosen ({self.best.level:.3g})")
        ax.set_xscale("log")
        ax.set_xlabel("process-noise level (x model process_std)")
        ax.set_ylabel(label, color="C0")
        ax2 = ax.twinx()
        ax2.plot(df["level"], df["J"], "s--", color="C1", label="J (CE-EM objective)")
        ax2.set_ylabel("J", color="C1")
        (h1, l1), (h2, l2) = ax.get_legend_handles_labels(), ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, loc="best", fontsize=8)
        return ax
