"""Process-noise calibration: CE-EM fits over a grid of process-noise levels, one chosen by a criterion on the
estimation data (`ceem_casadi.workflow._noise_criteria`); docs/noise_calibration.md."""
from __future__ import annotations

import copy
import dataclasses
import logging
import time
from dataclasses import dataclass

import numpy as np

from ..em._ceem import CEEMResult, ceem
from ..em._options import CEEMOptions
from ..errors import NonFiniteError, ShapeError, SolverError
from ..filtering import EKF
from ..io._data import Trajectories
from ..io._validate import check_data
from ..learning._learner import Learner
from ..model._params import Theta
from ..runtime._pool import WorkerPool
from ..runtime._schema import require
from ..runtime._status import Status
from ..smoothing._smoother import Smoother
from ._noise_calibration_options import (
    CRITERIA,
    DEFAULT_GRID,
    NOT_RUN,
    NoiseCalibrationOptions,
    NoiseCalibrationResult,
    NoiseLevelFit,
)
from ._noise_criteria import holdout_rms, innovation_loglik, split_tails

log = logging.getLogger(__name__)


@dataclass
class _Task:
    model: object
    fit_data: Trajectories
    tails: Trajectories | None
    theta0: Theta
    base_std: np.ndarray
    criterion: str
    options: NoiseCalibrationOptions
    deadline: float | None


class _Solvers:
    """Solvers built once per process and shared by every level (the noise enters only as NLP
    parameters read from ``.model``, so a shallow copy bound to the level's model is exact)."""

    def __init__(self, task: _Task):
        o = task.options.ceem
        self.smoother = Smoother(task.model, o.smoother)
        self.learner = Learner(task.model, task.fit_data.lengths, o.learner, self.smoother.stages)
        self.ekf = EKF(task.model)

    @staticmethod
    def bound(solver, model):
        new = copy.copy(solver)
        new.model = model
        return new


@dataclass
class _Row:
    level: float
    J: float = np.nan
    criterion: float = np.nan
    status: str = NOT_RUN
    iterations: int = 0
    seconds: float = 0.0
    fit: CEEMResult | None = None


def _ceem_options(task: _Task) -> CEEMOptions | None:
    """The fit's options with what remains of the budget; None when nothing remains."""
    if task.deadline is None:
        return task.options.ceem
    remaining = task.deadline - time.monotonic()
    if remaining <= 0:
        return None
    limit = task.options.ceem.time_limit
    return dataclasses.replace(task.options.ceem, time_limit=remaining if limit is None else min(limit, remaining))


def _score(task: _Task, solvers: _Solvers, model, fit: CEEMResult) -> float:
    theta_vec = model.params.to_vector(fit.theta)
    if task.criterion == "innovation":
        return innovation_loglik(solvers.ekf, model, theta_vec, task.fit_data, [x[0] for x in fit.x])
    # the free run and the initial-state fit do not involve the process noise: score with the base
    # model, whose cached rollout and x0 solvers are then built once per process, not per level
    return holdout_rms(task.model, fit.theta, task.tails, task.options.x0_window)


def _fit_level(task: _Task, solvers: _Solvers, level: float, theta: Theta, xs: list | None) -> _Row:
    """One level's fit from ``(theta, xs)`` (states None: EKF/RTS) and its score; not run when the budget is spent."""
    opts = _ceem_options(task)
    if opts is None:
        return _Row(level)
    model = task.model.with_noise(process_std=level * task.base_std)
    t0 = time.perf_counter()
    try:
        fit = ceem(model, task.fit_data, theta, options=opts, x_init=xs,
                   smoother=solvers.bound(solvers.smoother, model), learner=solvers.bound(solvers.learner, model))
    except NonFiniteError as exc:  # name the grid level, not ceem's arguments
        cause = getattr(exc, "cause", None) or str(exc)
        err = NonFiniteError(f"grid level {level:g} (process_std {' '.join(f'{v:.4g}' for v in level * task.base_std)}"
                             f"): {cause}; start from theta0 closer to the truth or use other grid levels")
        err.cause = f"grid level {level:g}: {cause}"
        raise err from None
    value = _score(task, solvers, model, fit) if np.isfinite(fit.J) else np.nan
    log.info("noise level %.4g: %s after %d iterations, J=%.6g, %s=%.6g", level, fit.status, fit.iterations,
             fit.J, task.criterion, value)
    return _Row(level, float(fit.J), float(value), fit.status, fit.iterations, time.perf_counter() - t0, fit)


def _run_chain(task: _Task, solvers: _Solvers, levels, theta: Theta, xs: list | None) -> list[_Row]:
    """Fit ``levels`` in order, the first from ``(theta, xs)``, each later one from the last finite fit."""
    rows = []
    for level in levels:
        rows.append(_fit_level(task, solvers, level, theta, xs))
        if np.isfinite(rows[-1].J):
            theta, xs = rows[-1].fit.theta, rows[-1].fit.x
    return rows


_WORKER: dict = {}


def _worker_init(task: _Task):
    _WORKER["task"], _WORKER["solvers"] = task, None


def _worker_chain(args):
    if _WORKER["solvers"] is None:
        _WORKER["solvers"] = _Solvers(_WORKER["task"])
    return _run_chain(_WORKER["task"], _WORKER["solvers"], *args)


def _fit_levels(task: _Task, levels: np.ndarray) -> list[_Row]:
    """Rows (ascending level) of every level: the largest first from ``theta0``, then the others in ``chains``
    contiguous blocks, each started from the largest level's fit (docs/noise_calibration.md)."""
    solvers = _Solvers(task)
    anchor = _run_chain(task, solvers, levels[:1], task.theta0, None)
    start = (anchor[0].fit.theta, anchor[0].fit.x) if np.isfinite(anchor[0].J) else (task.theta0, None)
    rest = levels[1:]
    n_chains = min(task.options.chains or task.options.n_jobs, max(rest.size, 1))
    blocks = [(list(b), *start) for b in np.array_split(rest, n_chains) if b.size]
    n_jobs = min(task.options.n_jobs, len(blocks))
    if n_jobs > 1:
        # workers end with this process (SIGKILL, SIGTERM) and are killed at once on Ctrl-C
        with WorkerPool(n_jobs, initializer=_worker_init, initargs=(task,)) as pool:
            chains = pool.map(_worker_chain, blocks)
    else:
        chains = [_run_chain(task, solvers, *b) for b in blocks]
    return sorted((r for c in [anchor, *chains] for r in c), key=lambda r: r.level)


def _chosen(rows: list[_Row], criterion: str) -> _Row:
    """The scored row with the best criterion (highest innovation, lowest holdout); SolverError when none."""
    scored = [r for r in rows if r.fit is not None and np.isfinite(r.criterion)]
    if scored:
        sign = 1.0 if criterion == "innovation" else -1.0
        return max(scored, key=lambda r: sign * r.criterion)
    statuses = ", ".join(f"{r.level:g}: {r.status!s}" for r in rows)
    # levels not started or stopped by a time limit (the calibration's, the fits' or an enclosing one): not diverged
    timed_out = [r for r in rows if str(r.status) in (NOT_RUN, str(Status.TIME_LIMIT))]
    advice = (f"{len(timed_out)} of {len(rows)} levels were stopped by the time limit before they could be "
              f"scored: raise time_limit" if timed_out else
              "every fit diverged or gave a non-finite objective: check the model, theta0 and the grid")
    raise SolverError(f"calibrate_noise: no level could be fitted and scored (status by level: {statuses}); {advice}")


def _best(task: _Task, chosen: _Row, data: Trajectories) -> NoiseLevelFit:
    """The chosen level; with ``"holdout"`` refitted on the whole ``data`` from its head fit (budget allowing)."""
    model = task.model.with_noise(process_std=chosen.level * task.base_std)
    fit = chosen.fit
    opts = _ceem_options(task) if task.criterion == "holdout" else None
    if opts is not None:
        fit = ceem(model, data, chosen.fit.theta, options=opts)
    return NoiseLevelFit(chosen.level, chosen.level * task.base_std, fit.theta, model, fit, chosen.criterion)


def _table(rows: list[_Row], base_std: np.ndarray):
    """The result's ``levels`` DataFrame, one row per level."""
    import pandas as pd

    table = pd.DataFrame([vars(r) for r in rows], columns=[f.name for f in dataclasses.fields(_Row)])
    table.insert(1, "process_std", [tuple(r.level * base_std) for r in rows])
    return table


def _validate_grid(grid) -> np.ndarray:
    if grid is not None and any(isinstance(v, (str, bytes, bool, np.bool_)) for v in np.ravel(np.array(grid, object))):
        raise ValueError(f"grid: expected positive numbers (multipliers of process_std), got {grid!r}")
    g = np.asarray(DEFAULT_GRID if grid is None else grid, dtype=float).ravel()
    if g.size == 0:
        raise ShapeError("grid: expected at least one process-noise level, got an empty grid; "
                         "pass e.g. grid=np.logspace(-1.5, 1.5, 7) or None for that default")
    if not np.all(np.isfinite(g)) or np.any(g <= 0):
        raise NonFiniteError(f"grid: expected finite positive multipliers of the model's process_std, got {g}")
    require(np.unique(g).size == g.size, f"grid: levels must be distinct, got {g}")
    return np.sort(g)[::-1]


def _checked_levels(model, data, grid, criterion: str, options) -> np.ndarray:
    """The grid (descending) after the boundary checks of `calibrate_noise`'s arguments."""
    require(criterion in CRITERIA, f"criterion must be one of {CRITERIA}, got {criterion!r}")
    if not isinstance(options, NoiseCalibrationOptions):
        raise TypeError(f"options must be a NoiseCalibrationOptions, got {type(options).__name__}")
    levels = _validate_grid(grid)
    with np.errstate(over="ignore"):
        var = (levels.max() * np.asarray(model.noise.process_std, float)) ** 2
    if not np.all(np.isfinite(var)) or not np.all(var < 1e300):
        raise NonFiniteError(f"grid: level {levels.max():g} times the model's process_std "
                             f"{np.asarray(model.noise.process_std).tolist()} overflows its variance; expected "
                             f"multipliers with finite squares (e.g. 0.03 .. 30)")
    if not isinstance(data, Trajectories):
        raise TypeError(f"data must be a cc.Trajectories (e.g. cc.Trajectories(y, u)), got {type(data).__name__}")
    check_data(model, data)
    return levels


def calibrate_noise(model, data: Trajectories, theta0: Theta, *, grid=None, criterion: str = "innovation",
                    options: NoiseCalibrationOptions = NoiseCalibrationOptions()) -> NoiseCalibrationResult:
    """Fit CE-EM at several process-noise levels and choose one by a criterion on the estimation data.

    Parameters
    ----------
    model : StateSpaceModel
        Its ``process_std`` (nx,) is what the levels multiply; its ``measurement_std`` is kept.
    data : Trajectories
        The estimation data.
    theta0 : dict
        Initial parameters, the start of every chain.
    grid : sequence of float, optional
        Positive multipliers of ``model.noise.process_std`` (default `DEFAULT_GRID`, 0.032 ... 32).
    criterion : {"innovation", "holdout"}
        ``"innovation"``: the EKF prediction-error log-likelihood, highest wins; ``"holdout"``: the free-run
        RMS on held-out tails, lowest wins (docs/noise_calibration.md).
    options : NoiseCalibrationOptions

    Returns
    -------
    NoiseCalibrationResult

    Raises
    ------
    TypeError
        ``data`` or ``options`` of the wrong type.
    ValueError
        Unknown ``criterion``, repeated levels; `ShapeError` for an empty grid or too short tails,
        `NonFiniteError` for non-positive levels, `SolverError` when no level could be fitted.

    Examples
    --------
    The innovation likelihood picks the true level (1 x the model's process_std):

    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(60, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [0.0], 60, u=u, process_std=0.1,
    ...                       measurement_std=0.1, seed=1)
    >>> opts = cc.NoiseCalibrationOptions(ceem=cc.CEEMOptions(
    ...     smoother=cc.SmootherOptions(compile=False), learner=cc.LearnerOptions(compile=False)))
    >>> cal = cc.calibrate_noise(model, data, {"a": 0.5}, grid=[0.1, 1.0], options=opts)
    >>> float(cal.best.level), round(float(cal.best.theta["a"]), 2)
    (1.0, 0.8)
    """
    t_start = time.perf_counter()
    levels = _checked_levels(model, data, grid, criterion, options)
    theta0 = model.params.validate(theta0)
    fit_data, tails = data, None
    if criterion == "holdout":
        fit_data, tails = split_tails(data, options.holdout_fraction, options.x0_window)
    deadline = None if options.time_limit is None else time.monotonic() + options.time_limit
    task = _Task(model, fit_data, tails, theta0, model.noise.process_std.copy(), criterion, options, deadline)
    rows = _fit_levels(task, levels)
    best = _best(task, _chosen(rows, criterion), data)
    return NoiseCalibrationResult(_table(rows, task.base_std), criterion, best, time.perf_counter() - t_start)
