"""The noise-calibration stage of `identify`, kept only when it lowers CE-EM's output-error objective without
pinning a free parameter at a bound (estimation data only; docs/own_data.md, the noise-calibration row)."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import SolverError
from ._noise_calibration import calibrate_noise
from ._noise_calibration_options import NoiseCalibrationOptions

#: default grid of the stage: multipliers of the model's process_std
DEFAULT_STAGE_GRID = (0.1, 10.0)


def at_bounds(model, theta, rtol: float = 1e-6) -> set[str]:
    """Names of the parameters with a free entry at (within ``rtol`` of the box width, or of 1 for
    one-sided bounds) its lower or upper bound."""
    v = model.params.to_vector(theta)
    lo, hi = model.params.lower, model.params.upper
    width = np.where(np.isfinite(hi - lo), hi - lo, 1.0)
    tol = rtol * np.maximum(width, 1.0)
    hit = (np.isfinite(lo) & (v <= lo + tol)) | (np.isfinite(hi) & (v >= hi - tol))
    hit &= model.params.free_mask
    return {name for name in model.params.names if np.any(hit[model.params.slice(name)])}


def calibration_stage(model, data, theta, ceem_options, grid, criterion: str, budget: float | None):
    """Run [`calibrate_noise`][ceem_casadi.calibrate_noise] from ``theta`` (the CE-EM estimate).

    Returns ``(name, theta, x0 (B, nx), status, iterations, message)`` of the chosen level's fit,
    or raises [`SolverError`][ceem_casadi.SolverError] when no level could be fitted.
    """
    grid = DEFAULT_STAGE_GRID if grid is None else grid
    opts = NoiseCalibrationOptions(ceem=dataclasses.replace(ceem_options, time_limit=None), time_limit=budget)
    cal = calibrate_noise(model, data, theta, grid=grid, criterion=criterion, options=opts)
    fit = cal.best.fit
    levels = cal.levels
    iterations = int(np.nansum(levels["iterations"].to_numpy(float)))
    x0 = np.array([x[0] for x in fit.x])
    message = (f"{criterion} criterion chose level {cal.best.level:g} (process_std "
               f"{' '.join(f'{v:.4g}' for v in cal.best.process_std)}) of {', '.join(f'{v:g}' for v in levels['level'])}")
    return f"noise calibration (level {cal.best.level:g})", fit.theta, x0, fit.status, iterations, message


def verdict(model, stage, reference) -> str:
    """Why the calibrated ``stage`` is rejected against the CE-EM ``reference`` stage ("" when it is
    accepted): a higher estimation objective, or a parameter pinned at a bound."""
    if reference is None or not np.isfinite(reference.objective):
        return "" if np.isfinite(stage.objective) else "its free run is not finite on the estimation data"
    if not stage.objective < reference.objective:
        return (f"rejected: estimation objective {stage.objective:.6g} not below CE-EM's {reference.objective:.6g} "
                "at the model's noise levels")
    pinned = at_bounds(model, stage.theta) - at_bounds(model, reference.theta)
    if pinned:
        return f"rejected: {', '.join(sorted(pinned))} pinned at a bound by the calibration"
    return ""


def failed(exc: SolverError) -> str:
    return f"rejected: no noise level could be fitted ({exc})"
