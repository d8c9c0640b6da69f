"""Noise-free free run ``x[t+1] = f(x[t], u[t], p)``, ``yhat[t] = g(x[t], u[t], p)`` from ``x0``, one CasADi
Function per model structure and length in the library cache (docs/model_learning_notes.md)."""
from __future__ import annotations

from collections.abc import Mapping

import casadi as ca
import numpy as np

from ..errors import NonFiniteError, ShapeError
from ..runtime._checks import check_argument_order, count
from ..runtime._model_cache import cached

__all__ = ["rollout", "simulate_output"]


def as_theta_vector(model, theta) -> np.ndarray:
    """Flat parameter vector (np,) of a theta dict or of a flat vector, validated by the model's `Parameters`."""
    if not isinstance(theta, Mapping):
        check_argument_order(theta=theta, n_params=model.params.size)  # data given where theta goes: name the order
        vec = np.asarray(theta, float).ravel()
        if vec.size != model.params.size:
            raise ShapeError(f"theta: expected a dict or a vector of {model.params.size} entries, got {vec.size}")
        theta = model.params.from_vector(vec)
    return model.theta_vector(theta)


def rollout(model, T: int) -> ca.Function:
    """The free-run Function of ``model`` over ``T`` samples (built once per (model, T), cached).

    Parameters
    ----------
    model : StateSpaceModel
    T : int
        Number of samples, >= 1.

    Returns
    -------
    casadi.Function
        ``simulate_T{T}(x0 (nx, 1), u (nu, T), p (np, 1)) -> (y (ny, T), x (nx, T))``, ``x[:, 0] = x0``;
        numeric or MX.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> from ceem_casadi.model import rollout
    >>> y, x = rollout(model, 3)(np.array([1.0]), np.zeros((1, 3)), np.array([0.5]))
    >>> np.asarray(x).ravel()                 # x_{t+1} = 0.5 x_t from x_0 = 1
    array([1.  , 0.5 , 0.25])
    """
    T = int(T)
    if T < 1:
        raise ShapeError(f"T: expected at least 1 sample, got {T}")
    return cached(model, "rollout", T, lambda: _build_rollout(model, T))


def _build_rollout(model, T: int) -> ca.Function:
    x0 = ca.MX.sym("x0", model.nx)
    U = ca.MX.sym("u", model.nu, T)
    p = ca.MX.sym("p", model.params.size)
    X = x0 if T == 1 else ca.horzcat(x0, model.f.mapaccum(T - 1)(x0, U[:, :T - 1], p))
    Y = model.g.map(T)(X, U, p)
    return ca.Function(f"simulate_T{T}", [x0, U, p], [Y, X], ["x0", "u", "p"], ["y", "x"])


def noisy_rollout(model, T: int) -> ca.Function:
    """``x[t+1] = f(x[t], u[t], p) + w[t]`` over T samples (cached like [`rollout`][ceem_casadi.model.rollout]):
    ``simulate_noisy_T{T}(x0 (nx, 1), u (nu, T), w (nx, T-1), p) -> x (nx, T)``."""
    return cached(model, "rollout with process noise", int(T), lambda: _build_noisy_rollout(model, int(T)))


def _build_noisy_rollout(model, T: int) -> ca.Function:
    nx, nu = model.nx, model.nu
    x, uw, p = ca.SX.sym("x", nx), ca.SX.sym("uw", nu + nx), ca.SX.sym("p", model.params.size)
    step = ca.Function("f_plus_w", [x, uw, p], [model.f(x, uw[:nu], p) + uw[nu:]])
    x0, U = ca.MX.sym("x0", nx), ca.MX.sym("u", nu, T)
    W, pm = ca.MX.sym("w", nx, T - 1), ca.MX.sym("p", model.params.size)
    X = x0 if T == 1 else ca.horzcat(x0, step.mapaccum(T - 1)(x0, ca.vertcat(U[:, :T - 1], W), pm))
    return ca.Function(f"simulate_noisy_T{T}", [x0, U, W, pm], [X], ["x0", "u", "w", "p"], ["x"])


def run(model, theta_vec: np.ndarray, x0: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Numeric free run of one trajectory: ``(y (T, ny), x (T, nx))`` from ``x0`` (nx,), ``u`` (T, nu)."""
    with np.errstate(all="ignore"):
        Y, X = rollout(model, u.shape[0])(x0, u.T, theta_vec)
    return np.asarray(Y).T.reshape(u.shape[0], model.ny), np.asarray(X).T.reshape(u.shape[0], model.nx)


def _inputs(model, u, horizon, batch: int | None):
    """Normalise ``u`` to ``(list of (T_b, nu), batched, as_array)``."""
    if u is None:
        if model.nu:
            raise ShapeError(f"u: the model has nu={model.nu} inputs; give u (T, {model.nu}) or a batch of them")
        if horizon is None:
            raise ShapeError("horizon: the model has no inputs (nu=0); give horizon=T (number of samples)")
        lengths = [int(horizon)] * (batch or 1) if np.ndim(horizon) == 0 else [int(h) for h in horizon]
        return [np.zeros((T, 0)) for T in lengths], batch is not None or np.ndim(horizon) > 0, np.ndim(horizon) == 0
    if isinstance(u, (list, tuple)):
        us = [np.asarray(a, float).reshape(len(a), -1) if np.ndim(a) == 1 else np.asarray(a, float) for a in u]
        return us, True, False
    u = np.asarray(u, float)
    if u.ndim == 1 and model.nu == 1:
        u = u[:, None]
    if u.ndim == 3:
        return list(u), True, True
    if u.ndim != 2:
        raise ShapeError(f"u: expected (T, {model.nu}), (B, T, {model.nu}) or a list of (T_b, {model.nu}) arrays, "
                         f"got shape {u.shape}")
    return [u], False, True


def simulate_output(model, theta, u=None, x0=None, *, horizon=None, return_states: bool = False):
    """Noise-free free-run output of ``model`` at ``theta`` from ``x0``.

    Parameters
    ----------
    model : StateSpaceModel
    theta : dict or numpy.ndarray
        Parameters, name -> array, or the flat vector (np,).
    u : numpy.ndarray or list of numpy.ndarray, optional
        Inputs (T, nu); (B, T, nu) or a list of B arrays (T_b, nu) for a batch; ``None`` when nu = 0.
    x0 : numpy.ndarray, optional
        Initial state(s) (nx,) or (B, nx); default the model's ``x1_mean`` (else an error: estimate
        x0 with [`estimate_initial_state`][ceem_casadi.estimate_initial_state]).
    horizon : int or list of int, optional
        Number of samples T when ``u`` is None (or B of them for a batch).
    return_states : bool
        Also return the states.

    Returns
    -------
    y : numpy.ndarray or list of numpy.ndarray
        (T, ny), (B, T, ny) for an array batch, a list of (T_b, ny) for a list batch; a diverging run
        gives inf/NaN entries (no error).
    x : numpy.ndarray or list of numpy.ndarray
        Only with ``return_states``: the states, shaped like ``y`` with nx columns.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> cc.simulate_output(model, {"a": 0.5}, np.zeros((4, 1)), [2.0]).ravel()
    array([2.  , 1.  , 0.5 , 0.25])
    """
    theta_vec = as_theta_vector(model, theta)
    if horizon is not None:
        [count(h, "horizon") for h in np.ravel(np.asarray(horizon, dtype=object))]
    if x0 is None:
        if model.noise.x1_mean is None:
            raise ShapeError("x0: give the initial state(s) (nx,) or (B, nx); the model has no x1_mean. "
                             "Estimate them from data with cc.estimate_initial_state(model, theta, y, u)")
        x0 = model.noise.x1_mean
    x0 = np.asarray(x0, float)
    batch = x0.shape[0] if x0.ndim == 2 else None
    us, batched, as_array = _inputs(model, u, horizon, batch)
    X0 = np.atleast_2d(x0)
    if X0.ndim != 2 or X0.shape[1] != model.nx or (x0.ndim == 2) != batched:
        want = f"({len(us)}, {model.nx}) for a batch of {len(us)}" if batched else f"({model.nx},)"
        raise ShapeError(f"x0: expected shape {want}, got {x0.shape}")
    if X0.shape[0] != len(us):
        raise ShapeError(f"x0: expected one initial state per trajectory ({len(us)}, {model.nx}), got {x0.shape}")
    if not np.all(np.isfinite(X0)):
        raise NonFiniteError("x0 contains NaN or inf")
    ys, xs = [], []
    for b, ub in enumerate(us):
        if ub.ndim != 2 or ub.shape[1] != model.nu or ub.shape[0] < 1:
            raise ShapeError(f"u[{b}]: expected shape (T, {model.nu}) with T >= 1, got {ub.shape}")
        if not np.all(np.isfinite(ub)):
            raise NonFiniteError(f"u[{b}] contains NaN or inf; inputs must be finite")
        y, x = run(model, theta_vec, X0[b], ub)
        ys.append(y)
        xs.append(x)
    if not batched:
        return (ys[0], xs[0]) if return_states else ys[0]
    if as_array:
        ys, xs = np.stack(ys), np.stack(xs)
    return (ys, xs) if return_states else ys
