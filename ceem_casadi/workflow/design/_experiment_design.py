"""Optimal experiment design: the Fisher information of the free parameters in a noise-free output-error record
(`fisher_information`) and the input maximising ``log det I`` or minimising ``trace I^-1`` under amplitude and
rate bounds (`design_input`, IPOPT from several starts); docs/control.md ("Optimal experiment design")."""
from __future__ import annotations

import math
import time

import casadi as ca
import numpy as np

from ...errors import ParameterError, ShapeError
from ...io._data import Trajectories
from ...model._simulation import as_theta_vector, simulate_output
from ...objective._identifiability import entry_names
from ...runtime._best import BestIterate, checked_status
from ...runtime._checks import count
from ...runtime._model_cache import cached, noise_key
from ...runtime._schema import require
from ...runtime._solve import ipopt_options, solve
from ...runtime._status import Status
from ._design_options import DesignOptions, InputDesign

__all__ = ["DesignOptions", "InputDesign", "design_input", "fisher_information"]

CRITERIA = ("D", "A")
MAX_STARTS = 1000  # random starts of one design (each an IPOPT solve): more is a typo, refused


def _x0(model, x0) -> np.ndarray:
    if x0 is None:
        x0 = model.noise.x1_mean if model.noise.x1_mean is not None else np.zeros(model.nx)
    x0 = np.asarray(x0, float).ravel()
    if x0.shape != (model.nx,) or not np.all(np.isfinite(x0)):
        raise ShapeError(f"x0: expected a finite initial state of {model.nx} entries (nx), got shape {x0.shape}")
    return x0


def _scale(theta_vec, free) -> np.ndarray:
    return np.where(theta_vec[free] != 0.0, np.abs(theta_vec[free]), 1.0)  # 1 at 0: a 1e-8 floor hid its information


def _information_function(model, T: int) -> ca.Function:
    """``info(x0 (nx,), u (nu, T), p (np,), scale (n,)) -> I_s (n, n)``: the Fisher information of T samples for
    the relative free parameters ``theta_free / scale`` (cached; the measurement weights baked in: noise in the key)."""
    return cached(model, "design information", (T, noise_key(model)), lambda: _build_information(model, T))


def _build_information(model, T: int) -> ca.Function:
    free = model.params.free_index
    n, nx = free.size, model.nx
    pf = ca.SX.sym("pf", n)          # relative free parameters, theta_free = pf * scale
    pfull = ca.SX.sym("p", model.params.size)
    sc = ca.SX.sym("scale", n)
    p = ca.SX(pfull)
    for i, k in enumerate(free):
        p[int(k)] = pf[i] * sc[i]
    x = ca.SX.sym("x", nx)
    X = ca.SX.sym("X", nx, n)
    u = ca.SX.sym("u", model.nu)
    Iacc = ca.SX.sym("I", n, n)
    xn = model.f(x, u, p)
    y = model.g(x, u, p)
    Xn = ca.jacobian(xn, x) @ X + ca.jacobian(xn, pf)
    S = ca.jacobian(y, x) @ X + ca.jacobian(y, pf)
    Sw = S * ca.DM(model.noise.inv_measurement_std)  # rows scaled by 1 / measurement_std
    step = ca.Function("sens_step", [ca.vertcat(x, ca.vec(X), ca.vec(Iacc)), u, pf, pfull, sc],
                       [ca.vertcat(xn, ca.vec(Xn), ca.vec(Iacc + Sw.T @ Sw))])
    acc = step.mapaccum("sens_rollout", T, [0], [0])
    z0 = ca.MX.sym("x0", nx)
    U = ca.MX.sym("u", model.nu, T)
    P = ca.MX.sym("p", model.params.size)
    SC = ca.MX.sym("scale", n)
    rel = P[[int(k) for k in free]] / SC
    zT = acc(ca.vertcat(z0, ca.MX.zeros(nx * n + n * n)), U, ca.repmat(rel, 1, T), ca.repmat(P, 1, T),
             ca.repmat(SC, 1, T))
    info = ca.reshape(zT[-(n * n):, -1], n, n)
    return ca.Function("information", [z0, U, P, SC], [0.5 * (info + info.T)], ["x0", "u", "p", "scale"], ["I"])


def _criterion_function(n: int, criterion: str, regularisation: float) -> ca.Function:
    """``crit(I (n, n)) -> value`` minimised by the NLP: ``-log det`` (D) or ``trace inv`` (A), by a
    symbolic Cholesky factor of ``I + regularisation * trace(I) / n * eye(n)``."""
    M = ca.SX.sym("I", n, n)
    A = M + regularisation * ca.trace(M) / n * ca.SX.eye(n)
    L = [[ca.SX(0) for _ in range(n)] for _ in range(n)]
    for j in range(n):
        s = A[j, j] - sum((L[j][k] ** 2 for k in range(j)), ca.SX(0))
        L[j][j] = ca.sqrt(s)
        for i in range(j + 1, n):
            L[i][j] = (A[i, j] - sum((L[i][k] * L[j][k] for k in range(j)), ca.SX(0))) / L[j][j]
    if criterion == "D":
        value = -2 * sum((ca.log(L[i][i]) for i in range(n)), ca.SX(0))
    else:  # trace(A^-1) = ||L^-1||_F^2, L^-1 by forward substitution column by column
        value = ca.SX(0)
        for c in range(n):
            z = [ca.SX(0)] * n
            for i in range(c, n):
                rhs = (1.0 if i == c else 0.0) - sum((L[i][k] * z[k] for k in range(c, i)), ca.SX(0))
                z[i] = rhs / L[i][i]
                value = value + z[i] ** 2
    return ca.Function("criterion", [M], [value])


def _rate_violation(w: np.ndarray, rate, nu: int) -> float:
    """Largest excess of ``|u_{k+1} - u_k|`` over the rate bounds (0 without) of the values ``w`` (vec (nu, nb))."""
    if rate is None or w.size <= nu:
        return 0.0
    steps = np.abs(np.diff(w.reshape(-1, nu), axis=0))
    return float(np.max(steps - np.asarray(rate, float), initial=0.0))


def _u_matrix(model, u, T: int) -> np.ndarray:
    u = np.asarray(u, float)
    if u.ndim == 1 and model.nu == 1:
        u = u[:, None]
    if u.shape != (T, model.nu) or not np.all(np.isfinite(u)):
        raise ShapeError(f"u: expected finite inputs of shape ({T}, {model.nu}) (T, nu), got {u.shape}")
    return u


def fisher_information(model, theta, u, *, x0=None, process_noise: bool = False) -> np.ndarray:
    """Fisher information (n, n) of the free parameters in the noise-free record of input ``u``.

    Parameters
    ----------
    model : StateSpaceModel
        The model (its ``measurement_std`` sets R).
    theta : dict
        Parameter values (all names).
    u : numpy.ndarray
        (T, nu) inputs.
    x0 : numpy.ndarray, optional
        (nx,) known initial state (default ``x1_mean``, else zeros).
    process_noise : bool
        ``False``: the output-error information ``sum_t S_t^T R^{-1} S_t``; ``True``: CE-EM's with the model's
        process noise (the reduced Hessian of [`parameter_uncertainty`][ceem_casadi.parameter_uncertainty]).

    Returns
    -------
    numpy.ndarray
        (n, n) symmetric, units 1 / theta^2, in the order of ``model.params.free_index``.

    Examples
    --------
    >>> import casadi as ca, numpy as np, ceem_casadi as cc
    >>> from ceem_casadi.workflow import fisher_information
    >>> m = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.5 * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
    ...                                      params=cc.Parameters(cc.Param("b", 1.0)), measurement_std=0.1)
    >>> float(fisher_information(m, {"b": 1.0}, np.ones((3, 1)))[0, 0])  # (0 + 1 + 1.5^2) / 0.1^2
    325.0...
    """
    theta_vec = as_theta_vector(model, theta)
    x0 = _x0(model, x0)
    u = _u_matrix(model, u, np.shape(u)[0])
    free = model.params.free_index
    if process_noise:
        from ..assessment._uncertainty import reduced_hessian
        from ..assessment._uncertainty_options import UncertaintyOptions

        y, x = simulate_output(model, theta_vec, u, x0, return_states=True)
        data = Trajectories([y], [u], dt=model.dt)
        return reduced_hessian(model, data, theta_vec, [np.asarray(x)], UncertaintyOptions(use_prior=False))
    scale = _scale(theta_vec, free)
    info = np.asarray(_information_function(model, u.shape[0])(x0, u.T, theta_vec, scale), float)
    return info / np.outer(scale, scale)


def _check_information(model, free, infos: list) -> None:
    """Raise `ParameterError` naming the free parameters whose information is zero at every start (``infos``:
    (n, n) each): no input can determine them, and the criterion would only measure the regularisation."""
    diags = np.abs(np.array([np.diag(i) for i in infos], float))
    if not np.isfinite(diags).any():
        return  # not finite at any start: reported by design_input with its own message
    finite = np.isfinite(diags)
    diag = np.where(finite, diags, 0.0).max(axis=0)  # per parameter, over the starts where it is finite
    zero = np.flatnonzero((diag <= 1e-12 * max(float(diag.max()), 1e-300)) & finite.any(axis=0))
    if zero.size:
        names = [entry_names(model.params, free)[i] for i in zero]
        raise ParameterError(f"design_input: the free parameter(s) {', '.join(names)} have zero information: the "
                             f"outputs do not depend on them at this theta and x0 for any start input, so no input "
                             f"can determine them; fix them (Param(..., free=False)) or remove them from the model")


def _bounds(model, value, what: str) -> tuple[np.ndarray, np.ndarray]:
    if any(isinstance(v, (str, bytes)) for v in np.asarray(value, dtype=object).ravel()):
        raise ShapeError(f"{what}: expected numbers (lower, upper), got {value!r}")  # "3" is not converted
    arr = np.asarray(value, float)
    if arr.shape == (2,):
        arr = np.tile(arr, (model.nu, 1))
    if arr.shape != (model.nu, 2) or np.any(~np.isfinite(arr)) or np.any(arr[:, 0] > arr[:, 1]):
        raise ShapeError(f"{what}: expected finite (lower, upper) with lower <= upper, as (2,) or ({model.nu}, 2) "
                         f"(nu, 2), got {value!r}")
    return arr[:, 0], arr[:, 1]


def design_input(model, theta, horizon: int, *, u_bounds, rate_bounds=None, criterion: str = "D", x0=None,
                 starts=4, seed: int = 0, options: DesignOptions = DesignOptions()) -> InputDesign:
    """The input sequence that maximises the information about the free parameters (docs/control.md).

    Parameters
    ----------
    model, theta, x0
        As in `fisher_information` (the model with inputs; theta e.g. a fit or a prior guess).
    horizon : int
        Samples T of the experiment.
    u_bounds : array_like
        ``(lower, upper)`` for every input, or (nu, 2), in input units.
    rate_bounds : float or array_like, optional
        Largest ``|u_{k+1} - u_k|`` between consecutive input values (scalar or (nu,)), or None.
    criterion : str
        ``"D"`` (maximise ``log det I``) or ``"A"`` (minimise ``trace I^{-1}``).
    starts : int or numpy.ndarray
        Number of random starts (uniform in the bounds), or given start sequences (S, T, nu).
    seed : int
        Seed of the random starts.
    options : DesignOptions

    Returns
    -------
    InputDesign
        The best start's input, with one table row per start (a failed start reported with its status).

    Raises
    ------
    ShapeError, OptionsError
        Bad bounds, horizon, starts or criterion (the message names the argument).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from ceem_casadi.workflow import design_input
    >>> m = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5), cc.Param("b", 1.0)), measurement_std=0.1)
    >>> d = design_input(m, {"a": 0.5, "b": 1.0}, 10, u_bounds=(-1, 1), starts=2)
    >>> d.u.shape, bool(np.all(np.abs(d.u) <= 1 + 1e-8))
    ((10, 1), True)
    """
    T, free = _checked_design(model, horizon, criterion, options)
    nu, hold, n = model.nu, options.hold, free.size
    theta_vec = as_theta_vector(model, theta)
    x0 = _x0(model, x0)
    lo, hi = _bounds(model, u_bounds, "u_bounds")
    nb = -(-T // hold)  # input values (blocks)
    rate = _rate(rate_bounds, nu)
    blocks0 = _start_blocks(starts, np.random.default_rng(seed), lo, hi, nb, T, nu, hold)
    scale = _scale(theta_vec, free)
    info_fun = _information_function(model, T)
    _check_information(model, free, [np.asarray(info_fun(x0, np.repeat(b0, hold, axis=0)[:T].T, theta_vec, scale))
                                     for b0 in blocks0])
    # the hold map (nb, T): one nonzero per sample, sparse (a dense one was T^2 / hold memory: 4 GB at T = 8,000)
    E = ca.DM(ca.Sparsity.triplet(nb, T, (np.arange(T) // hold).tolist(), list(range(T))), 1.0)
    w = ca.MX.sym("w", nu * nb)  # block values, input-major: w = vec(B) with B (nu, nb)
    B = ca.reshape(w, nu, nb)
    obj = _criterion_function(n, criterion, options.regularisation)(
        info_fun(ca.DM(x0), ca.mtimes(B, E), ca.DM(theta_vec), ca.DM(scale)))
    nlp, bounds = {"x": w, "f": obj}, {"lbx": np.tile(lo, nb), "ubx": np.tile(hi, nb)}
    if rate is not None and nb > 1:
        nlp["g"] = ca.vec(B[:, 1:] - B[:, :-1])
        bounds.update(lbg=np.tile(-rate, nb - 1), ubg=np.tile(rate, nb - 1))
    solver = ca.nlpsol("design", "ipopt", nlp, ipopt_options(
        options.max_iters, options.tol, **{"ipopt.hessian_approximation": "limited-memory"}))
    run = _Starts(solver, ca.Function("crit_at", [w], [obj]), bounds, rate, nu, criterion)
    for k, b0 in enumerate(blocks0):
        run.solve(k, b0.ravel())  # (nb, nu) row-major == vec of (nu, nb)
    if run.overall.is_start:
        raise ShapeError("design_input: the criterion is not finite at any start; check theta, x0 and the bounds")
    u = np.repeat(run.overall.x.reshape(nb, nu), hold, axis=0)[:T]
    info = np.asarray(info_fun(x0, u.T, theta_vec, scale), float) / np.outer(scale, scale)
    return InputDesign(u, criterion, run.chosen["value"], info, entry_names(model.params, free), run.chosen["status"],
                       run.table, x0)


def _checked_design(model, horizon, criterion: str, options) -> tuple[int, np.ndarray]:
    """The horizon T and the free indices, after checking the arguments of `design_input`."""
    if not isinstance(options, DesignOptions):
        raise TypeError(f"options must be a DesignOptions, got {type(options).__name__}")
    require(criterion in CRITERIA,
            f"criterion: expected 'D' (log det) or 'A' (trace of the inverse), got {criterion!r}")
    if model.nu < 1:
        raise ShapeError("design_input: the model has no input (nu = 0); there is nothing to design")
    if model.params.free_index.size == 0:
        raise ShapeError("design_input: the model has no free parameter")
    return count(horizon, "horizon (samples)", 2), model.params.free_index


def _rate(rate_bounds, nu: int):
    """(nu,) rate bounds, or None without any."""
    if rate_bounds is None:
        return None
    numeric = np.asarray(rate_bounds).dtype.kind in "iuf"  # text such as "3" is refused, not converted
    fits = numeric and np.size(rate_bounds) in (1, nu)
    rate = np.broadcast_to(np.asarray(rate_bounds, float), (nu,)) if fits else None
    if rate is None or np.any(~(rate > 0)) or not np.all(np.isfinite(rate)):
        raise ShapeError(f"rate_bounds: expected a finite positive scalar or {nu} finite positive values "
                         f"(None: no rate bound), got {rate_bounds!r}")
    return rate


def _start_blocks(starts, rng, lo, hi, nb: int, T: int, nu: int, hold: int) -> list:
    """Block values (nb, nu) of every start: uniform draws in the bounds, or the given (S, T, nu) held and clipped."""
    if np.ndim(starts) == 0:
        n_starts = count(starts, "starts", minimum=1, maximum=MAX_STARTS)  # the shared scalar check
        return [lo + (hi - lo) * rng.random((nb, nu)) for _ in range(n_starts)]
    arr = np.asarray(starts, float)
    if arr.ndim != 3 or arr.shape[1:] != (T, nu):
        raise ShapeError(f"starts: expected a count or start sequences (S, {T}, {nu}), got shape {arr.shape}")
    return [np.clip(a[::hold], lo, hi) for a in arr]


class _Starts:
    """The IPOPT solves of `design_input` from every start, under the guard (runtime/_best.py): a
    start's result is never worse than the start (when the start meets the rate bounds), and the
    best over the starts is kept (``overall``, ``chosen``), with one ``table`` row per start."""

    def __init__(self, solver, crit_at, bounds: dict, rate, nu: int, criterion: str):
        self.solver, self.crit_at, self.bounds, self.rate, self.nu = solver, crit_at, bounds, rate, nu
        self.sign = -1.0 if criterion == "D" else 1.0  # the NLP minimises -log det for D
        self.rate_tol = 0.0 if rate is None else 1e-6 * max(1.0, float(np.max(rate)))
        self.overall, self.chosen, self.table = BestIterate(np.zeros(bounds["lbx"].size), math.inf,
                                                            label="no start"), {}, []

    def solve(self, k: int, w0: np.ndarray) -> None:
        t0 = time.perf_counter()
        initial = float(self.crit_at(w0))
        start_ok = _rate_violation(w0, self.rate, self.nu) <= self.rate_tol
        tracker = BestIterate(w0, initial if start_ok else math.inf, feasibility_tol=self.rate_tol, rtol=0.0,
                              label=f"start {k}")
        lbx, ubx = self.bounds["lbx"], self.bounds["ubx"]
        try:
            sol = solve(self.solver, x0=w0, **self.bounds)
            st = self.solver.stats()
            status = Status.from_ipopt(st["return_status"])
            wk = np.clip(np.asarray(sol["x"], float).ravel(), lbx, ubx)
            final, iters = float(self.crit_at(wk)), int(st["iter_count"])
        except RuntimeError:  # IPOPT error (e.g. non-finite values): reported, start skipped
            status, wk, final, iters = Status.SOLVER_FAILED, w0, math.nan, 0
        wk, final, _ = tracker.choose(wk, final, _rate_violation(wk, self.rate, self.nu), label="IPOPT's final iterate")
        usable = math.isfinite(final)  # else: IPOPT failed from a start that violates the rate bounds
        status, _ = checked_status(status, final)
        if not usable:
            status, final = Status.SOLVER_FAILED, initial
        value = self.sign * final
        self.table.append({"start": k, "initial": self.sign * initial, "final": value, "status": str(status),
                           "iterations": iters, "seconds": time.perf_counter() - t0})
        if usable and self.overall.offer(wk, final, label=f"start {k}"):
            self.chosen = {"status": status, "value": value}
