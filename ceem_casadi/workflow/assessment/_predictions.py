"""Free runs and k-step EKF predictions from given or estimated initial states, shared by the validation report,
the residual analysis and the simulation bands."""
from __future__ import annotations

import numpy as np

from ...errors import NonFiniteError, ShapeError
from ...filtering import EKF
from ...filtering._result import ekf_settings
from ...model._simulation import run
from ...runtime._checks import count
from .._initial_state import default_window, estimate_initial_state


def _initial_states(model, x0, n_traj: int) -> np.ndarray:
    """(B, nx) of ``x0`` (None: the model's ``x1_mean``; (nx,): shared)."""
    if x0 is None:
        return np.tile(model.noise.x1_mean, (n_traj, 1))
    x0 = np.asarray(x0, float)
    if x0.ndim == 1 and x0.shape == (model.nx,):
        x0 = np.tile(x0, (n_traj, 1))
    if x0.shape != (n_traj, model.nx):
        raise ShapeError(f"x0: expected shape ({n_traj}, {model.nx}) (one initial state per trajectory), "
                         f"got {x0.shape}")
    if not np.all(np.isfinite(x0)):
        raise NonFiniteError("x0 contains NaN or inf")
    return x0


def signal_names(given, n: int, prefix: str, what: str) -> tuple:
    """``given`` (n names) as a tuple, by default ``prefix0, prefix1, ...``."""
    names = tuple(given) if given is not None else tuple(f"{prefix}{j}" for j in range(n))
    if len(names) != n:
        raise ShapeError(f"{what}: expected {n} names, got {len(names)}")
    return names


def horizons(k) -> tuple:
    """The sorted distinct positive horizons of ``k`` (an int or a sequence of ints)."""
    try:
        return tuple(sorted({count(kk, "k") for kk in np.atleast_1d(k).tolist()}))
    except ShapeError:
        raise ShapeError(f"k: expected positive integer horizon(s), got {k!r}") from None


def check_level(level) -> float:
    """``level`` as a probability in (0, 1)."""
    if not 0.0 < float(level) < 1.0:
        raise ShapeError(f"level: expected a probability in (0, 1), got {level!r}")
    return float(level)


def k_step_prediction(model, theta_vec, x_filt, x0, u, k: int) -> np.ndarray:
    """``g(x_{t|t-k})`` (T, ny): filtered means propagated k steps (prior x0 propagated for t < k)."""
    T = u.shape[0]
    fmap = model.f.map(T)
    Z = x_filt.T.copy()                                # column j: x_{j|j}
    idx = np.arange(T)
    for s in range(k):
        Z = np.asarray(fmap(Z, u[np.minimum(idx + s, T - 1)].T, theta_vec))   # column j: x_{j+s+1|j}
    yhat = np.empty((T, model.ny))
    if k < T:
        yhat[k:] = np.asarray(model.g.map(T - k)(Z[:, :T - k], u[k:].T, theta_vec)).T
    yhat[:min(k, T)] = run(model, theta_vec, x0, u[:min(k, T)])[0]
    return yhat


def _candidate_starts(first: np.ndarray, starts, seed) -> np.ndarray:
    """(B, S, nx) starts beside the default estimate ``first`` (B, nx): ``starts`` (S, nx) or
    (B, S, nx) as given; an int n: the mirror image ``-first`` and n - 2 seeded draws
    ``N(0, max(|first|, 1)^2)`` (a sign-blind output cannot tell x0 from -x0)."""
    B, nx = first.shape
    if np.ndim(starts) == 0:
        n = count(starts, "starts")
        rng = np.random.default_rng(seed)
        scale = np.maximum(np.abs(first), 1.0)
        cands = [-first] + [scale * rng.standard_normal((B, nx)) for _ in range(max(n - 2, 0))]
        return np.stack(cands[:n - 1], axis=1) if n > 1 else np.zeros((B, 0, nx))
    arr = np.asarray(starts, float)
    if arr.ndim == 2 and arr.shape[1] == nx:
        arr = np.broadcast_to(arr, (B, *arr.shape))
    if arr.ndim != 3 or arr.shape[0] != B or arr.shape[2] != nx or not np.all(np.isfinite(arr)):
        raise ShapeError(f"starts: expected an integer, finite (S, {nx}) or ({B}, S, {nx}) initial states, "
                         f"got shape {np.shape(starts)}")
    return arr


def best_initial_states(model, data, theta_vec, window: int, starts=None, seed=0) -> np.ndarray:
    """(B, nx) initial states by [`estimate_initial_state`][ceem_casadi.estimate_initial_state] on the first
    ``window`` samples, solved from its default start and from each of ``starts`` (see
    `_candidate_starts`); per trajectory the solution of lowest window cost is kept."""
    if starts is None:
        return estimate_initial_state(model, data, theta_vec, window=window)
    best = estimate_initial_state(model, data, theta_vec, window=window, full_output=True)
    x0 = np.array([r.x0 for r in best])
    cost = np.array([r.cost if np.isfinite(r.cost) else np.inf for r in best])
    cands = _candidate_starts(x0, starts, seed)
    for s in range(cands.shape[1]):
        for b, r in enumerate(estimate_initial_state(model, data, theta_vec, window=window, x_init=cands[:, s],
                                                     full_output=True)):
            if np.isfinite(r.cost) and r.cost < cost[b] and np.all(np.isfinite(r.x0)):
                x0[b], cost[b] = r.x0, r.cost
    if not np.all(np.isfinite(x0)):
        raise NonFiniteError("the initial-state estimate is not finite from any start; give x0 or other starts")
    return x0


def resolve_initial_states(model, data, theta_vec, x0=None, *, window=None, skip=None, starts=None, seed=0):
    """``(X0 (B, nx), skip)``: the initial states and the leading samples to leave out, by the rule of
    [`validation_report`][ceem_casadi.validation_report] (given, ``x1_mean``, or estimated from the first
    ``window`` samples; then ``skip`` defaults to ``window``)."""
    if skip is not None:
        count(skip, "skip", 0)  # before any work; its upper bound below
    if window is not None:
        count(window, "window")
    estimate = (isinstance(x0, str) and x0 == "estimate") or (x0 is None and model.noise.x1_mean is None)
    if isinstance(x0, str) and not estimate:
        raise ShapeError(f"x0: expected an array or 'estimate', got {x0!r}")
    if estimate:
        window = default_window(model, min(data.lengths) - 1, data.y) if window is None else window
        x0 = best_initial_states(model, data, theta_vec, window, starts, seed)
        skip = window if skip is None else skip
    skip = count(0 if skip is None else skip, "skip", 0, min(data.lengths) - 1)  # below the shortest length
    return _initial_states(model, x0, len(data)), skip


def k_step_predictions(ekf, theta_vec, data, X0, ks, covs, engine: str = "python") -> dict:
    """``{k: [(T_b, ny)]}`` k-step predictions at ``theta_vec`` from ``X0`` (B, nx), one pass of ``ekf`` per
    trajectory (``covs`` = (Sigma0, Q, R))."""
    Sigma0, Q, R = covs
    out: dict[int, list] = {kk: [] for kk in ks}
    for b in range(len(data) if ks else 0):
        u = data.inputs(b)
        filt = ekf.run(theta_vec, data.y[b], u, x0=X0[b], Sigma0=Sigma0, Q=Q, R=R, engine=engine).x_filt
        for kk in ks:
            out[kk].append(k_step_prediction(ekf.model, theta_vec, filt, X0[b], u, kk))
    return out


def predictions(model, data, theta_vec, X0, ks=(1,), *, Sigma0=None, Q=None, R=None, engine="python"):
    """``(y_sim, y_pred)``: free runs (list of (T_b, ny)) and k-step predictions ({k: list}) from ``X0``."""
    y_sim = [run(model, theta_vec, X0[b], data.inputs(b))[0] for b in range(len(data))]
    ekf = EKF(model) if ks else None
    return y_sim, k_step_predictions(ekf, theta_vec, data, X0, ks, ekf_settings(model, None, Sigma0, Q, R)[1:], engine)
