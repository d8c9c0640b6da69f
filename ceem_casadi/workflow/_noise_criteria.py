"""Selection criteria of [`calibrate_noise`][ceem_casadi.calibrate_noise], scored on the estimation data only:
the EKF innovation log-likelihood (higher is better) and the free-run RMS on held-out tails (lower is better);
their formulas are in docs/noise_calibration.md."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..filtering import EKF
from ..io._data import Trajectories
from ..model._simulation import simulate_output
from ._initial_state import estimate_initial_state


def innovation_loglik(ekf: EKF, model, theta_vec, data: Trajectories, x_first: list[np.ndarray],
                      *, engine: str = "casadi") -> float:
    """EKF innovation log-likelihood ``sum_b sum_t log N(y_t; yhat_t|t-1, S_t)`` of ``data`` under ``model`` (its own
    noise: ``Q = diag(process_std^2)``, ``R``) at ``theta_vec`` (np,), from ``x_{1|0} = x_first[b]`` (nx,) with
    ``P_{1|0} = Q``; NaN outputs skipped; ``-inf`` when the filter fails. ``ekf`` is reused across noise levels."""
    Q = np.diag(model.noise.process_std ** 2)
    R = np.diag(model.noise.measurement_std ** 2)
    total = 0.0
    for b, y in enumerate(data.y):
        try:
            with np.errstate(all="ignore"):
                res = ekf.run(theta_vec, y, data.inputs(b), x0=np.asarray(x_first[b], float), Sigma0=Q, Q=Q, R=R,
                              engine=engine)
        except (np.linalg.LinAlgError, RuntimeError):
            return -np.inf
        if not np.isfinite(res.loglik):
            return -np.inf
        total += res.loglik
    return float(total)


def split_tails(data: Trajectories, fraction: float, window: int) -> tuple[Trajectories, Trajectories]:
    """``(heads, tails)``: the last ``round(fraction * T_b)`` samples of every trajectory are its tail; each tail
    longer than ``window`` (its initial state's samples, then the scored ones), each head at least 2 samples."""
    cuts = []
    for b, T in enumerate(data.lengths):
        n_tail = round(fraction * T)
        if n_tail <= window or T - n_tail < 2:
            raise ShapeError(f"holdout: trajectory {b} has {T} samples; its tail of {n_tail} "
                             f"(holdout_fraction={fraction}) must be longer than x0_window={window} and "
                             f"leave a head of at least 2 samples; change holdout_fraction or x0_window")
        cuts.append(T - n_tail)

    def part(arrays, head: bool):
        return None if arrays is None else [a[:c] if head else a[c:] for a, c in zip(arrays, cuts)]

    return (Trajectories(part(data.y, True), part(data.u, True), data.dt),
            Trajectories(part(data.y, False), part(data.u, False), data.dt))

def holdout_rms(model, theta, tails: Trajectories, window: int) -> float:
    """Free-run RMS (units of y) on held-out ``tails``, each simulated from an initial state estimated on its first
    ``window`` samples and scored on the rest (every observed entry pooled); ``inf`` when a run or estimate fails."""
    sq, n = 0.0, 0
    for b, y in enumerate(tails.y):
        u = tails.inputs(b)
        try:
            x0 = estimate_initial_state(model, y, theta, u=u, window=window)
            with np.errstate(all="ignore"):
                yhat = np.asarray(simulate_output(model, theta, u, x0), float)
        except (np.linalg.LinAlgError, RuntimeError, ValueError):
            return np.inf
        err = (y - yhat)[window:]
        ok = np.isfinite(y[window:])
        if not np.all(np.isfinite(err[ok])):
            return np.inf
        sq += float(np.sum(err[ok] ** 2))
        n += int(ok.sum())
    return float(np.sqrt(sq / n)) if n else np.nan
