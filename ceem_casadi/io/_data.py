"""Trajectory data (time-major arrays ``y[b]`` (T_b, ny), NaN = not observed, and finite ``u[b]`` (T_b, nu)) and
simulation of a model."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import DataError, NonFiniteError, ShapeError
from ..model._params import Theta
from ..model._simulation import noisy_rollout, run
from ..runtime._schema import sample_time

MAX_MAGNITUDE = 1e150   # |y| above this overflows when squared (1e308): refused with a clear message


def _as_list(a, name: str) -> list[np.ndarray]:
    if isinstance(a, np.ndarray):
        a = a[None] if a.ndim == 2 else a
        if a.ndim != 3:
            raise ShapeError(f"{name}: expected an array (B, T, n) or a list of (T, n) arrays, got shape {a.shape}")
        return [np.array(ai, dtype=float) for ai in a]
    out = []
    for i, ai in enumerate(a):
        ai = np.array(ai, dtype=float)
        ai = ai[:, None] if ai.ndim == 1 else ai
        if ai.ndim != 2:
            raise ShapeError(f"{name}[{i}]: expected a (T, n) array, got shape {ai.shape}")
        out.append(ai)
    return out


@dataclass(frozen=True, init=False)
class Trajectories:
    """B trajectories of observations ``y`` and optional inputs ``u``.

    Parameters
    ----------
    y : numpy.ndarray or list of numpy.ndarray
        (B, T, ny) array or a list of B arrays (T_b, ny); NaN marks a missing observation.
    u : numpy.ndarray or list of numpy.ndarray, optional
        (B, T, nu) array or a list of (T_b, nu) arrays (finite).
    dt : float, optional
        Sample time in seconds (informative).

    Raises
    ------
    ShapeError, NonFiniteError
        Inconsistent shapes, non-finite inputs or an all-missing trajectory.

    Examples
    --------
    Two trajectories of different lengths; NaN marks a missing observation:

    >>> import numpy as np, ceem_casadi as cc
    >>> y = [np.array([[0.0], [np.nan], [1.0]]), np.zeros((5, 1))]
    >>> u = [np.ones((3, 1)), np.ones((5, 1))]
    >>> data = cc.Trajectories(y, u, dt=0.1)
    >>> len(data.y), data.lengths, data.ny, data.nu
    (2, (3, 5), 1, 1)
    """

    y: tuple
    u: tuple | None
    dt: float | None

    def __init__(self, y, u=None, dt: float | None = None):
        ys = _as_list(y, "y")
        if not ys:
            raise ShapeError("y: expected at least one trajectory, got none")
        ny = ys[0].shape[1]
        for i, yi in enumerate(ys):
            if yi.shape[1] != ny:
                raise ShapeError(f"y[{i}]: expected {ny} output columns like y[0], got {yi.shape[1]}")
            if yi.shape[0] < 2:
                raise ShapeError(f"y[{i}]: expected at least 2 time steps (rows of a (T, ny) array), got {yi.shape}")
            if np.any(np.isinf(yi)):
                raise NonFiniteError(f"y[{i}] contains inf; use NaN for missing observations")
            big = np.nanmax(np.abs(yi), initial=0.0)
            if big > MAX_MAGNITUDE:
                raise NonFiniteError(f"y[{i}]: data magnitude {big:.3g} is beyond {MAX_MAGNITUDE:.0e}, where squares "
                                     f"overflow double precision; rescale the outputs (e.g. to unit variance)")
        us = None if u is None else _as_list(u, "u")
        if us is not None:
            if len(us) != len(ys):
                raise ShapeError(f"u: expected {len(ys)} trajectories like y, got {len(us)}")
            for i, (ui, yi) in enumerate(zip(us, ys)):
                check_inputs(ui, yi.shape[0], us[0].shape[1], f"[{i}]")
        object.__setattr__(self, "y", tuple(ys))
        object.__setattr__(self, "u", None if us is None else tuple(us))
        object.__setattr__(self, "dt", sample_time(dt))

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, idx) -> Trajectories:
        idx = [idx] if isinstance(idx, (int, np.integer)) else list(range(len(self)))[idx] \
            if isinstance(idx, slice) else list(idx)
        return Trajectories([self.y[i] for i in idx], None if self.u is None else [self.u[i] for i in idx], self.dt)

    @property
    def ny(self) -> int:
        """Number of outputs."""
        return self.y[0].shape[1]

    @property
    def nu(self) -> int:
        """Number of inputs (0 without inputs)."""
        return 0 if self.u is None else self.u[0].shape[1]

    @property
    def lengths(self) -> tuple[int, ...]:
        """Samples T_b of each trajectory."""
        return tuple(yi.shape[0] for yi in self.y)

    def inputs(self, b: int) -> np.ndarray:
        """Inputs of trajectory ``b`` as (T_b, nu), zero columns when the data has none."""
        return np.zeros((self.y[b].shape[0], 0)) if self.u is None else self.u[b]

    def check_model(self, model) -> None:
        """`ShapeError` unless ny, nu and dt (when both set) match ``model``; `DataError` from `check_outputs`."""
        if self.ny != model.ny:
            raise ShapeError(f"data has ny={self.ny} output columns, the model observes ny={model.ny}")
        if self.nu != model.nu:
            raise ShapeError(f"data has nu={self.nu} input columns, the model expects nu={model.nu}")
        if None not in (self.dt, model.dt) and abs(self.dt - model.dt) > 1e-6 * model.dt:   # as io's time columns
            raise ShapeError(f"data has dt={self.dt:.9g} s, the model steps dt={model.dt:.9g} s: resample the data "
                             f"or build the model with dt={self.dt:.9g}")
        check_outputs(self.y)  # nothing to fit, smooth or score: a result would be the prior, silently

    def leading(self, n) -> Trajectories:
        """The first ``n`` samples of every trajectory (an int, or one per trajectory; itself when none is longer)."""
        n = [n] * len(self) if np.ndim(n) == 0 else list(n)
        if all(T <= c for T, c in zip(self.lengths, n)):
            return self
        return Trajectories([y[:c] for y, c in zip(self.y, n)], None if self.u is None else
                            [u[:c] for u, c in zip(self.u, n)], self.dt)

    def with_missing(self, fraction: float, seed: int | np.random.Generator) -> Trajectories:
        """Copy with a random ``fraction`` of the y entries replaced by NaN (seeded)."""
        rng = np.random.default_rng(seed)
        return Trajectories([np.where(rng.random(yi.shape) < fraction, np.nan, yi) for yi in self.y], self.u, self.dt)


def check_outputs(ys, names=None, error: type[Exception] = DataError) -> None:
    """Raise ``error`` (a `DataError` class) when a trajectory of ``ys`` ((T_b, ny) each, NaN = missing) has no
    observed output, or an output column is NaN everywhere (named by ``names``, default ``y[:, j]``)."""
    for b, y in enumerate(ys):
        if y.size and np.all(np.isnan(y)):  # an empty trajectory is the length checks' to refuse
            raise error(f"trajectory {b}: every output is missing (NaN); nothing to fit there: drop the "
                        "trajectory or give its observed outputs")
    ys = [y for y in ys if y.size]
    ny = ys[0].shape[1] if ys else 0
    empty = [j for j in range(ny) if all(np.all(np.isnan(y[:, j])) for y in ys)]
    if empty:
        cols = [names[j] for j in empty] if names else [f"y[:, {j}]" for j in empty]
        raise error(f"all outputs missing: output(s) {cols} are NaN in every row of every trajectory; check "
                    f"the data or choose the observed outputs (--outputs)")


def single_trajectory(model, y, u=None, where: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(y, u)`` of one trajectory for ``model``: ``y`` (T, ny) float with NaN = missing
    (no infinities), ``u`` (T, nu) finite (zeros (T, nu) when None); ``where`` (e.g. ``"[2]"``) names it."""
    y = np.asarray(y, float)
    if y.ndim != 2 or y.shape[1] != model.ny:
        raise ShapeError(f"y{where}: expected shape (T, {model.ny}), got {y.shape}")
    if np.isinf(y).any():
        raise NonFiniteError(f"y{where}: expected finite values or NaN (missing), got infinities")
    u = np.zeros((y.shape[0], model.nu)) if u is None else np.asarray(u, float)
    check_inputs(u, y.shape[0], model.nu, where)
    return y, u


def check_inputs(u: np.ndarray, T: int, nu: int, where: str = "") -> None:
    """`ShapeError` unless the inputs ``u`` of a trajectory are (T, nu), `NonFiniteError` unless they are finite."""
    if u.shape != (T, nu):
        raise ShapeError(f"u{where}: expected shape {(T, nu)}, got {u.shape}")
    if not np.all(np.isfinite(u)):
        raise NonFiniteError(f"u{where} contains NaN or inf; inputs must be finite")


def simulate(model, theta: Theta, x0, horizon: int | Sequence[int], *, u=None,
             process_std: float | np.ndarray = 0.0, measurement_std: float | np.ndarray = 0.0,
             seed: int | np.random.Generator = 0) -> tuple[Trajectories, list[np.ndarray]]:
    """Simulate ``model`` from initial states ``x0`` for ``horizon`` steps, with seeded Gaussian process noise
    (added after each step) and measurement noise.

    Parameters
    ----------
    model : StateSpaceModel
    theta : dict
        Parameter values, name -> array.
    x0 : numpy.ndarray
        (B, nx) initial states (or (nx,) for one trajectory).
    horizon : int or sequence of int
        Samples per trajectory (one for all, or B values).
    u : numpy.ndarray or list of numpy.ndarray, optional
        Inputs (B, T, nu) or a list of (T_b, nu); required when nu > 0.
    process_std, measurement_std : float or numpy.ndarray
        Noise standard deviations, scalar or (nx,) / (ny,), in the units of x and y.
    seed : int or numpy.random.Generator
        Seed of the noise draws.

    Returns
    -------
    data : Trajectories
        The noisy observations (and the inputs, ``dt = model.dt``).
    x : list of numpy.ndarray
        The B true state trajectories (T_b, nx).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> data, states = cc.simulate(model, {"a": 0.8}, [1.0], 3, u=np.ones((3, 1)))
    >>> states[0].ravel()                     # noise-free: 1, 0.8 + 1, 0.8 * 1.8 + 1
    array([1.  , 1.8 , 2.44])
    >>> noisy, _ = cc.simulate(model, {"a": 0.8}, [1.0], 3, u=np.ones((3, 1)), measurement_std=0.1, seed=0)
    >>> noisy.y[0].shape
    (3, 1)
    """
    from ..runtime._checks import count, noise_level, seed_value

    rng = np.random.default_rng(seed_value(seed))
    x0 = np.atleast_2d(np.asarray(x0, dtype=float))
    if x0.ndim != 2 or x0.shape[1] != model.nx:
        raise ShapeError(f"x0: expected shape (B, {model.nx}), got {x0.shape}")
    if not np.all(np.isfinite(x0)):
        raise NonFiniteError("x0: expected finite initial states, got NaN or inf")
    B = x0.shape[0]
    T = [count(horizon, "horizon")] * B if np.ndim(horizon) == 0 else [count(h, "horizon") for h in horizon]
    if u is None and model.nu:
        raise ShapeError(f"u: the model has nu={model.nu} inputs; give u, a (T, {model.nu}) array per trajectory")
    us = [np.zeros((t, model.nu)) for t in T] if u is None else _as_list(u, "u")
    sw = noise_level(process_std, "process_std", model.nx)   # (nx,) and (ny,) standard deviations
    sv = noise_level(measurement_std, "measurement_std", model.ny)
    if len(T) != B or len(us) != B:
        raise ShapeError(f"expected {B} horizons and input trajectories (one per x0 row)")
    theta_vec = model.theta_vector(theta)
    xs, ys = [], []
    for b in range(B):
        check_inputs(us[b], T[b], model.nu, f"[{b}]")
        # process noise enters between steps: a cached mapaccum of f + w (ceem_casadi.model._simulation)
        w = rng.standard_normal((T[b] - 1, model.nx)) * sw
        if np.any(sw > 0):
            x = np.asarray(noisy_rollout(model, T[b])(x0[b], us[b].T, w.T, theta_vec)).T.reshape(T[b], model.nx)
            y = np.asarray(model.g.map(T[b])(x.T, us[b].T, theta_vec)).T
        else:
            y, x = run(model, theta_vec, x0[b], us[b])
        y = y + rng.standard_normal(y.shape) * sv
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            raise NonFiniteError(f"simulation of trajectory {b} diverged (non-finite states)")
        xs.append(x)
        ys.append(y)
    return Trajectories(ys, None if model.nu == 0 else us, model.dt), xs
