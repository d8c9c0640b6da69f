"""Initial state of a trajectory from its first ``window`` samples: a small weighted least-squares NLP of the free
run solved by IPOPT, built once per (model structure, window) and thread; docs/validation.md (initial states)."""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import casadi as ca
import numpy as np

from ..errors import DataError, NonFiniteError, OptionsError, ShapeError, SolverError
from ..io._data import Trajectories, single_trajectory
from ..io._validate import check_data, check_outputs
from ..model._simulation import as_theta_vector, rollout
from ..runtime._best import BestIterate, checked_status
from ..runtime._checks import count
from ..runtime._model_cache import cached
from ..runtime._result import Result
from ..runtime._schema import check_time_limit
from ..runtime._solve import deadline, expired, ipopt_options, ipopt_solver, solve
from ..runtime._status import Status

__all__ = ["InitialStateResult", "estimate_initial_state", "default_window"]


def default_window(model, T: int, ys=()) -> int:
    """The default ``window``: ``min(T, 10 nx)`` samples (at least 2 when T allows), counted from the latest first
    sample that observes an output in ``ys`` ((T_b, ny) arrays, NaN = missing): leading dropouts lengthen it."""
    lead = max((int(np.argmax(np.any(~np.isnan(y), axis=1))) for y in ys), default=0)
    return int(min(T, max(10 * model.nx, 2) + lead))


@dataclass(repr=False)
class InitialStateResult(Result):
    """One trajectory's initial-state estimate.

    Attributes
    ----------
    x0 : numpy.ndarray
        (nx,) the estimate.
    cost : float
        The minimised objective.
    status : Status
    message : str
    iterations : int
        IPOPT iterations.
    wall_s : float
        Wall-clock seconds.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [1.0], 40, u=np.random.default_rng(0).normal(size=(40, 1)), seed=1)
    >>> (res,) = cc.estimate_initial_state(model, data, {"a": 0.8}, full_output=True)
    >>> str(res.status), bool(abs(res.x0[0] - 1.0) < 0.3)
    ('converged', True)
    """

    SUMMARY = ('status', 'iterations', 'cost', 'x0')

    x0: np.ndarray
    cost: float
    status: Status
    message: str
    iterations: int
    wall_s: float


class InitialStateSolver:
    """The IPOPT problem above for one model and window (use `solver_for`: cached)."""

    def __init__(self, model, window: int):
        self.model, self.window = model, int(window)
        nx, nu, ny, k = model.nx, model.nu, model.ny, self.window
        x0 = ca.MX.sym("x0", nx)
        syms = [ca.MX.sym("p", model.params.size), ca.MX.sym("u", nu, k), ca.MX.sym("y", ny, k),
                ca.MX.sym("m", ny, k), ca.MX.sym("iv", ny), ca.MX.sym("mu1", nx), ca.MX.sym("w1", nx)]
        self._sizes = [s.numel() for s in syms]
        P = ca.MX.sym("P", sum(self._sizes))
        parts = ca.vertsplit(P, np.concatenate([[0], np.cumsum(self._sizes)]).tolist())
        p, U, Y, M, iv, mu1, w1 = [ca.reshape(a, s.shape[0], s.shape[1]) for a, s in zip(parts, syms)]
        Yhat, _ = rollout(model, k)(x0, U, p)
        r = ca.vertcat(ca.vec(M * ca.repmat(iv, 1, k) * (Y - Yhat)), w1 * (x0 - mu1))
        cost = 0.5 * ca.sumsqr(r)
        jac = ca.jacobian(r, x0)  # Gauss-Newton: the exact Hessian gave the same x0 (docs/validation.md)
        H = jac.T @ jac
        lam_f, lam_g = ca.MX.sym("lam_f"), ca.MX.sym("lam_g", 0)
        hess_lag = ca.Function("hess_lag", [x0, P, lam_f, lam_g], [lam_f * ca.triu(H)],
                               ["x", "p", "lam_f", "lam_g"], ["triu_hess_gamma_x_x"])
        self.solver = ipopt_solver(f"x0_window{k}", {"x": x0, "p": P, "f": cost},
                                  ipopt_options(100, 1e-12, hess_lag=hess_lag, show_eval_warnings=False,
                                                track=(model.nx, 0)))
        self.cost = ca.Function("x0_cost", [x0, P], [cost])

    def parameter(self, model, theta_vec, y, u, use_prior: bool = True) -> np.ndarray:
        """The NLP parameter vector of theta (np,), y (>= k, ny) and u (>= k, nu); the weights and
        the prior come from ``model`` (the built structure is shared with its ``with_noise`` copies)."""
        k = self.window
        y, u = y[:k], u[:k]
        mask = np.isfinite(y)
        noise = model.noise
        prior = use_prior and noise.x1_mean is not None
        mu1 = noise.x1_mean if prior else np.zeros(model.nx)
        w1 = noise.inv_x1_std if prior else np.zeros(model.nx)
        return np.concatenate([theta_vec, u.ravel(), np.where(mask, y, 0.0).ravel(), mask.ravel().astype(float),
                               noise.inv_measurement_std, mu1, w1])

    def solve(self, model, theta_vec, y, u, starts: np.ndarray, lower, upper,
              use_prior: bool = True) -> InitialStateResult:
        """Solve from the best of ``starts`` (S, nx) (lowest finite cost; clipped into the bounds)."""
        P = self.parameter(model, theta_vec, y, u, use_prior)
        starts = np.clip(starts, lower, upper)
        with np.errstate(all="ignore"):
            costs = np.array([float(self.cost(s, P)) for s in starts])
        if not np.any(np.isfinite(costs)):
            return InitialStateResult(np.full(self.model.nx, np.nan), np.nan, Status.SOLVER_FAILED,
                                      f"the free run is not finite from any of the {len(starts)} start(s); "
                                      "give starts= inside the model's domain", 0, 0.0)
        i_best = int(np.nanargmin(np.where(np.isfinite(costs), costs, np.nan)))
        tracker = BestIterate(starts[i_best], costs[i_best], label="the best starting point", lower=lower,
                              upper=upper)
        t0 = time.perf_counter()
        sol = solve(self.solver, x0=starts[i_best], p=P, lbx=lower, ubx=upper, best=tracker)
        wall = time.perf_counter() - t0
        st = self.solver.stats()
        status = Status.from_ipopt(st["return_status"], time_up=expired())
        # never worse than the start or than the best IPOPT iterate (a stop on time or a failure)
        x0, cost, which = tracker.choose(np.asarray(sol["x"], float).ravel(), float(sol["f"]),
                                         label="IPOPT's final iterate")
        if not np.all(np.isfinite(x0)):
            status = Status.SOLVER_FAILED
        status, refused = checked_status(status, cost)  # never "converged" on a non-finite objective
        return InitialStateResult(x0, cost, status, f"IPOPT: {st['return_status']}; {which}"
                                  + (f"; {refused}" if refused else ""), int(st["iter_count"]), wall)


def solver_for(model, window: int) -> InitialStateSolver:
    """The cached `InitialStateSolver` of ``model`` for ``window`` samples."""
    # per thread: an IPOPT solver's memory, statistics and tracking callback are its own
    return cached(model, "initial-state solver", int(window), lambda: InitialStateSolver(model, window),
                  per_thread=True)


def _bounds(model, value, fill, name):
    """(nx,) bounds on x0 from a scalar or nx numbers (``fill`` when None)."""
    v = np.asarray(fill if value is None else value, float).reshape(-1)
    if v.size not in (1, model.nx) or np.isnan(v).any():
        raise ShapeError(f"{name}: expected a scalar or {model.nx} numbers (nx; -inf/inf for no bound), got {value!r}")
    return np.broadcast_to(v, (model.nx,)).copy()


def _trajectories(model, y, u):
    """``(list of y (T, ny), list of u (T, nu), single)`` from one trajectory or a batch."""
    if isinstance(y, Trajectories):
        check_data(model, y)
        return list(y.y), [y.inputs(b) for b in range(len(y))], False
    single = not isinstance(y, (list, tuple)) and np.ndim(y) <= 2
    ys = [y] if single else list(y)
    us = [None] * len(ys) if u is None else ([u] if single else list(u))
    if len(us) != len(ys):
        raise ShapeError(f"u: expected {len(ys)} input trajectories like y, got {len(us)}")

    def columns(a, n):  # a 1-D signal of a single output or input is one column
        a = np.asarray(a, float)
        return a[:, None] if a.ndim == 1 and n == 1 else a

    pairs = [single_trajectory(model, columns(yb, model.ny), None if ub is None else columns(ub, model.nu), f"[{b}]")
             for b, (yb, ub) in enumerate(zip(ys, us))]
    out_y, out_u = [p[0] for p in pairs], [p[1] for p in pairs]
    check_outputs(out_y)
    return out_y, out_u, single


def _default_starts(model, theta_vec, ys, us, k: int) -> np.ndarray:
    """(B, S, nx) candidate starts: the EKF/RTS state at t = 0 over the window (when the filter
    stays finite) and the model's x1_mean (else zeros)."""
    from ..filtering import EKF
    from ..smoothing._initial_states import eks_states

    base = model.noise.x1_mean if model.noise.x1_mean is not None else np.zeros(model.nx)
    # built once per model structure and thread (its buffers and mapaccums per length are its own)
    ekf = cached(model, "initial-state EKF", None, lambda: EKF(model), per_thread=True)
    window = Trajectories([yb[:max(k, 2)] for yb in ys], None if model.nu == 0 else [ub[:max(k, 2)] for ub in us])
    try:
        with np.errstate(all="ignore"):
            first = np.array([x[0] for x in eks_states(model, theta_vec, window, ekf=ekf)])
    except (NonFiniteError, ShapeError, np.linalg.LinAlgError):
        first = np.tile(base, (len(ys), 1))
    return np.stack([first, np.tile(base, (len(ys), 1))], axis=1)


def _checked_window(model, ys: list, window) -> int:
    """The number of leading samples fitted: ``window`` checked against the shortest trajectory (default
    `default_window`); every trajectory must observe something in it."""
    if not ys or min(yb.shape[0] for yb in ys) == 0:
        raise ShapeError(f"y: expected one (T, ny = {model.ny}) array or several, each with at least one sample, got "
                         f"{len(ys)} trajectories of lengths {[yb.shape[0] for yb in ys]}")
    shortest = min(yb.shape[0] for yb in ys)
    k = count(default_window(model, shortest, ys) if window is None else window, "window", 1, shortest)
    empty = [b for b, yb in enumerate(ys) if np.all(np.isnan(yb[:k]))]
    if empty:
        raise DataError(f"trajectory {empty[0]}: every output in the first {k} samples (the window) is "
                        "missing (NaN); the initial state cannot be estimated there: give a longer window= "
                        "(x0_window=) or x_init=")
    return k


def _candidates(model, theta_vec, ys: list, us: list, k: int, x_init, starts) -> np.ndarray:
    """(B, S, nx) starting candidates per trajectory: ``x_init`` (or `_default_starts`) and then ``starts``."""
    extra = np.zeros((0, model.nx)) if starts is None else np.atleast_2d(np.asarray(starts, float))
    if extra.shape[1:] != (model.nx,):
        raise ShapeError(f"starts: expected shape (S, {model.nx}), got {extra.shape}")
    if x_init is None:
        init = _default_starts(model, theta_vec, ys, us, k)
    else:
        init = np.asarray(x_init, float)
        init = np.tile(init, (len(ys), 1)) if init.ndim == 1 else init
        if init.shape != (len(ys), model.nx) or not np.all(np.isfinite(init)):
            raise ShapeError(f"x_init: expected finite values of shape ({model.nx},) or ({len(ys)}, {model.nx}), "
                             f"got {np.shape(x_init)}")
        init = init[:, None, :]
    return np.concatenate([init, np.broadcast_to(extra, (len(ys), *extra.shape))], axis=1)


def _removed_hessian(hessian) -> None:
    """Refuse ``hessian="exact"`` with its reason; warn on the no-op ``"gauss-newton"``."""
    if hessian is None:
        return
    if hessian != "gauss-newton":
        raise OptionsError("estimate_initial_state: hessian='exact' was removed (the same estimates within 9.3e-11, "
                           f"slower in 18 of 20 records: docs/validation.md), got hessian={hessian!r}")
    warnings.warn("estimate_initial_state(hessian=...) is deprecated: the Hessian is always Gauss-Newton",
                  DeprecationWarning, stacklevel=3)


def estimate_initial_state(model, data, theta, *, u=None, window: int | None = None, x_init=None, starts=None,
                           x_lower=None, x_upper=None, use_prior: bool = True, time_limit: float | None = None,
                           full_output: bool = False, hessian: str | None = None):
    """Initial state(s) that make the free run fit the first ``window`` samples (docs/validation.md).

    Parameters
    ----------
    model : StateSpaceModel
    data : Trajectories or numpy.ndarray or list of numpy.ndarray
        A `Trajectories`, or the outputs alone: (T, ny), (B, T, ny) or a list of (T_b, ny). NaN = missing.
    theta : dict or numpy.ndarray
        Parameters (name -> array, or the flat vector (np,)).
    u : numpy.ndarray or list of numpy.ndarray, optional
        Inputs (T, nu), or a batch like ``data``, when ``data`` holds the outputs alone.
    window : int, optional
        Leading samples fitted (default ``min(T, 10 nx)``, counted from the first sample that observes an
        output: a record whose first samples are missing gets a longer window).
    x_init : numpy.ndarray, optional
        Starting point (nx,) or (B, nx); default: the EKF + RTS first state and ``x1_mean`` (else zeros).
    starts : numpy.ndarray, optional
        Extra candidate starts (S, nx); the solve starts from the candidate of lowest cost.
    x_lower, x_upper : float or numpy.ndarray, optional
        Bounds on x0 (scalar or (nx,)).
    use_prior : bool
        Include the model's x1 prior when it has one.
    time_limit : float, optional
        Seconds for all trajectories together.
    full_output : bool
        Return [`InitialStateResult`][ceem_casadi.workflow.InitialStateResult] (or a list) instead of arrays.
    hessian : str, optional
        Deprecated: the Hessian is always Gauss-Newton; ``"gauss-newton"`` warns, ``"exact"`` (removed) raises.

    Returns
    -------
    x0 : (nx,) for one trajectory, (B, nx) for a batch.

    Raises
    ------
    SolverError
        When a trajectory's estimate is not finite or IPOPT fails (unless ``full_output``).

    Examples
    --------
    True x[1] = 2, no noise:

    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [2.0], 20, u=np.zeros((20, 1)))
    >>> x0 = cc.estimate_initial_state(model, data, {"a": 0.8})
    >>> np.round(x0, 3)
    array([[2.]])
    """
    _removed_hessian(hessian)
    theta_vec = as_theta_vector(model, theta)
    ys, us, single = _trajectories(model, data, u)
    k = _checked_window(model, ys, window)
    lower = _bounds(model, x_lower, -np.inf, "x_lower")
    upper = _bounds(model, x_upper, np.inf, "x_upper")
    if np.any(lower > upper):
        raise ShapeError(f"x_lower must not exceed x_upper, got {lower} and {upper}")
    candidates = _candidates(model, theta_vec, ys, us, k, x_init, starts)
    check_time_limit(time_limit)  # None or a finite number of seconds > 0 (OptionsError)
    solver = solver_for(model, k)
    expires = None if time_limit is None else time.perf_counter() + float(time_limit)
    with deadline(expires):
        results = [solver.solve(model, theta_vec, yb, ub, cands, lower, upper, use_prior)
                   for yb, ub, cands in zip(ys, us, candidates)]
    if full_output:
        return results[0] if single else results
    bad = [b for b, r in enumerate(results) if r.status == Status.SOLVER_FAILED]
    if bad:
        raise SolverError(f"initial state of trajectory {bad[0]} failed: {results[bad[0]].message}; "
                          "give x_init/starts closer to the data, bounds x_lower/x_upper, or a shorter window")
    x0 = np.array([r.x0 for r in results])
    return x0[0] if single else x0
