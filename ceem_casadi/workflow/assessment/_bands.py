"""Confidence bands of the free run and of k-step predictions from the parameter covariance (MATLAB ``simsd``):
first-order propagation through the exact sensitivities, or seeded sampling (docs/validation.md, bands)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtri

from ...errors import ShapeError
from ...filtering import EKF
from ...filtering._result import ekf_settings
from ...io._validate import check_data
from ...model._simulation import as_theta_vector, rollout, run
from ...objective._identifiability import entry_names
from ...runtime._checks import count
from ...runtime._model_cache import cached
from ...runtime._result import Result, plain
from ._predictions import check_level, horizons, k_step_predictions, resolve_initial_states, signal_names

__all__ = ["Band", "SimulationBands", "simulation_bands"]


@dataclass(frozen=True, repr=False)
class Band(Result):
    """One prediction with its band, per trajectory.

    Attributes
    ----------
    kind : str
        ``"simulation"`` or ``"k=<k>"``.
    y_hat, lower, upper : list of numpy.ndarray
        (T_b, ny) nominal prediction and band limits per trajectory.
    std : list of numpy.ndarray or None
        (T_b, ny) standard deviations (``method="linear"``), else None.

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.workflow import Band
    >>> band = Band("simulation", [np.zeros((4, 1))], [-np.ones((4, 1))], [np.ones((4, 1))])
    >>> band.coverage([np.array([[0.5], [2.0], [-0.5], [np.nan]])]), band.half_width()
    (array([0.66666667]), array([1.]))
    """

    SUMMARY = ("kind",)

    kind: str
    y_hat: list
    lower: list
    upper: list
    std: list | None = None

    def coverage(self, y, skip: int = 0) -> np.ndarray:
        """(ny,) fraction of the finite entries of ``y`` (list of (T_b, ny)) inside the band, over ``t >= skip``."""
        inside = np.concatenate([(np.asarray(a)[skip:] >= lo[skip:]) & (np.asarray(a)[skip:] <= hi[skip:])
                                 for a, lo, hi in zip(y, self.lower, self.upper)])
        ok = np.concatenate([np.isfinite(np.asarray(a)[skip:]) for a in y])
        return (inside & ok).sum(axis=0) / np.maximum(ok.sum(axis=0), 1)

    def half_width(self, skip: int = 0) -> np.ndarray:
        """(ny,) mean half-width of the band over the samples ``t >= skip`` (units of y)."""
        return np.nanmean(np.concatenate([(hi[skip:] - lo[skip:]) / 2 for lo, hi in zip(self.lower, self.upper)]),
                          axis=0)


@dataclass(frozen=True, repr=False)
class SimulationBands(Result):
    """Result of [`simulation_bands`][ceem_casadi.simulation_bands].

    Attributes
    ----------
    simulation : Band
        The free run and its band.
    prediction : dict of int to Band
        The k-step predictions and their bands (empty unless ``k`` was given).
    y : list of numpy.ndarray
        (T_b, ny) measured outputs.
    method, level, measurement_noise, samples, skip, output_names
        The settings of [`simulation_bands`][ceem_casadi.simulation_bands] (``samples`` 0 unless sampling).
    x0 : numpy.ndarray
        (B, nx) initial states used.
    warnings : list of str
        Parameters held fixed (no interval).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> data = cc.Trajectories([np.zeros((30, 1))], [np.ones((30, 1))])
    >>> bands = cc.simulation_bands(model, data, {"a": 0.8}, {"index": [0], "covariance": [[1e-4]]}, x0=[0.0])
    >>> bands.method, bands.level, bands.measurement_noise, sorted(bands.prediction)
    ('linear', 0.95, False, [])
    """

    SUMMARY = ("method", "level", "measurement_noise", "skip")

    simulation: Band
    prediction: dict
    y: list = field(repr=False)
    method: str
    level: float
    measurement_noise: bool
    skip: int
    output_names: tuple
    x0: np.ndarray = field(default=None, repr=False)
    samples: int = 0
    warnings: list = field(default_factory=list)

    def to_dataframe(self):
        """pandas DataFrame, one row per (kind, output): the band's mean half-width, the measured fraction inside."""
        import pandas as pd

        rows = []
        for band in [self.simulation, *self.prediction.values()]:
            hw, cov = band.half_width(self.skip), band.coverage(self.y, self.skip)
            rows += [(band.kind, n, hw[j], cov[j]) for j, n in enumerate(self.output_names)]
        df = pd.DataFrame(rows, columns=["kind", "output", "half_width", "measured_inside"])
        return df.set_index(["kind", "output"])

    def table(self) -> str:
        """[`to_dataframe`][ceem_casadi.workflow.SimulationBands.to_dataframe] as text."""
        return self.to_dataframe().to_string(float_format=lambda v: f"{v:.4g}")

    def to_dict(self) -> dict:
        """JSON-ready dict: settings, and per kind the prediction and band of every trajectory."""
        out = {k: plain(getattr(self, k)) for k in ("method", "level", "measurement_noise", "skip", "samples",
                                                      "warnings")}
        out["output_names"] = list(self.output_names)
        out["bands"] = {b.kind: {"y_hat": plain(b.y_hat), "lower": plain(b.lower), "upper": plain(b.upper)}
                        for b in [self.simulation, *self.prediction.values()]}
        return out

    def plot(self, path=None, *, trajectory: int = 0, k: int | None = None, dt: float | None = None):
        """Measured output, prediction and band of one trajectory, saved to ``path`` (returned), else the Figure."""
        from ...plots import plot_band

        band = self.simulation if k is None else self.prediction[k]
        return plot_band(self.y[trajectory], band.y_hat[trajectory], band.lower[trajectory], band.upper[trajectory],
                         path, dt=dt, output_names=self.output_names,
                         label=f"{band.kind} ({100 * self.level:g} % band, {self.method})", skip=self.skip)


def _covariance(model, uncertainty):
    """(free index (nf,), L (nf, nf) with ``L L^T = Sigma``, warnings) of a ParameterUncertainty or its dict."""
    get = uncertainty.get if isinstance(uncertainty, Mapping) else lambda k: getattr(uncertainty, k, None)
    cov, index = get("covariance"), get("index")
    if index is None and get("names") is not None:       # a model file's dict: entries by name
        every = entry_names(model.params)
        missing = [n for n in get("names") if n not in every]
        if missing:
            raise ShapeError(f"uncertainty: parameter entries {missing} are not in the model")
        index = [every.index(n) for n in get("names")]
    if cov is None or index is None:
        raise ShapeError(f"uncertainty: expected a ParameterUncertainty (or its dict) with 'covariance' and 'index' "
                         f"or 'names', got {type(uncertainty).__name__}")
    cov, index = np.asarray(cov, float), np.asarray(index, int).ravel()
    if cov.shape != (index.size, index.size) or (index.size and (index.min() < 0 or index.max() >= model.params.size)):
        raise ShapeError(f"uncertainty: covariance {cov.shape} and index ({index.size},) do not fit the model's "
                         f"{model.params.size} parameter entries")
    se = np.sqrt(np.abs(np.diag(cov)))
    se_given = get("std_error")
    fixed = ~np.isfinite(se) if se_given is None else ~np.isfinite(np.asarray(se_given, float))
    names = list(get("names") or [str(i) for i in index])
    warnings = [f"parameter(s) {[n for n, f in zip(names, fixed) if f]} have no interval (at a bound or not "
                "identifiable): held fixed in the band"] if fixed.any() else []
    cov = np.where(np.isfinite(cov), cov, 0.0)
    cov[fixed] = 0.0
    cov[:, fixed] = 0.0
    w, V = np.linalg.eigh(0.5 * (cov + cov.T))
    return index, V * np.sqrt(np.maximum(w, 0.0)), warnings


def _free_run_jacobian(model, theta_vec, x0, u) -> np.ndarray:
    """(T, ny, np) exact sensitivities of the free run to theta (forward mode of the cached rollout)."""
    T = u.shape[0]
    jac = cached(model, "rollout jacobian", T,
                 lambda: rollout(model, T).factory("rollout_jac", ["x0", "u", "p"], ["jac:y:p"]))
    return np.asarray(jac(x0, u.T, theta_vec)).reshape(T, model.ny, -1)


def _band(kind, y_hat, spread, z, level, sampled):
    """A Band from the nominal predictions and (linear) std lists or (sampling) draw arrays (S, T, ny)."""
    if not sampled:
        return Band(kind, y_hat, [h - z * s for h, s in zip(y_hat, spread)], [h + z * s for h, s in zip(y_hat, spread)],
                    spread)
    q = [(1 - level) / 2, (1 + level) / 2]
    # a diverged draw (NaN) counts as +inf; quantiles without interpolation (no inf - inf)
    lo, hi = zip(*[tuple(np.quantile(np.where(np.isnan(d), np.inf, d), q, axis=0, method="inverted_cdf"))
                   for d in spread])
    return Band(kind, y_hat, list(lo), list(hi))


def simulation_bands(model, data, theta, uncertainty, *, level: float = 0.95, method: str = "linear", k=None,
                     samples: int = 500, seed: int | None = 0, measurement_noise: bool = False, x0=None,
                     window: int | None = None, skip: int | None = None, starts=None, Sigma0=None, Q=None,
                     R=None, output_names=None) -> SimulationBands:
    """Bands of the free run (and of k-step predictions) from the parameter covariance (docs/validation.md).

    Parameters
    ----------
    model : StateSpaceModel
    data : Trajectories
        Inputs and measured outputs (NaN = missing).
    theta : dict or numpy.ndarray
        The estimate (name -> array, or the flat vector).
    uncertainty : ParameterUncertainty or dict
        Covariance of the free entries: a `ParameterUncertainty`, the dict a model file stores, or
        ``{"index": (nf,), "covariance": (nf, nf)}``.
    level : float
        Coverage probability.
    method : {"linear", "sampling"}
        First-order propagation through the exact sensitivities, or seeded draws of theta.
    k : int or sequence of int, optional
        Horizons of k-step-prediction bands.
    samples, seed : int
        Draws for ``method="sampling"`` and their seed.
    measurement_noise : bool
        Include the model's measurement noise (a band for new measurements).
    x0, window, skip, starts, Sigma0, Q, R, output_names
        As in [`validation_report`][ceem_casadi.validation_report] (the initial states held fixed).

    Returns
    -------
    SimulationBands

    Examples
    --------
    The free run of x[t+1] = a x[t] + u[t] with a = 0.8 +- 0.01 (one standard error):

    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> data = cc.Trajectories([np.zeros((30, 1))], [np.ones((30, 1))])
    >>> unc = {"index": [0], "covariance": [[1e-4]]}
    >>> lin = cc.simulation_bands(model, data, {"a": 0.8}, unc, x0=[0.0])
    >>> mc = cc.simulation_bands(model, data, {"a": 0.8}, unc, x0=[0.0], method="sampling", samples=4000)
    >>> [round(float(b.upper[0][-1, 0] - b.lower[0][-1, 0]), 2) for b in (lin.simulation, mc.simulation)]
    [0.97, 0.97]
    """
    check_data(model, data)
    theta_vec = as_theta_vector(model, theta)
    if method not in ("linear", "sampling"):
        raise ShapeError(f"method: expected 'linear' or 'sampling', got {method!r}")
    level = check_level(level)
    ks = () if k is None else horizons(k)
    count(samples, "samples")
    index, L, warnings = _covariance(model, uncertainty)
    X0, skip = resolve_initial_states(model, data, theta_vec, x0, window=window, skip=skip, starts=starts)
    if ks and max(ks) >= min(data.lengths):
        raise ShapeError(f"k: expected horizons below {min(data.lengths)} (shortest trajectory), got {max(ks)}")
    names = signal_names(output_names, model.ny, "y", "output_names")
    z = float(ndtri(0.5 + level / 2))
    sv = model.noise.measurement_std if measurement_noise else np.zeros(model.ny)
    ekf = EKF(model) if ks else None
    ctx = _Context(model, data, X0, ekf, ekf_settings(model, None, Sigma0, Q, R)[1:], index, L, sv)
    y_sim = [run(model, theta_vec, X0[b], ctx.u(b))[0] for b in range(len(data))]
    y_k = _k_step_all(ctx, theta_vec, ks)
    sim, pred = _linear(ctx, theta_vec, ks) if method == "linear" else _sampled(ctx, theta_vec, ks, samples, seed)
    sampled = method == "sampling"
    return SimulationBands(
        simulation=_band("simulation", y_sim, sim, z, level, sampled),
        prediction={kk: _band(f"k={kk}", y_k[kk], pred[kk], z, level, sampled) for kk in ks},
        y=list(data.y), method=method, level=level, measurement_noise=bool(measurement_noise), skip=skip,
        output_names=names, x0=X0, samples=int(samples) if sampled else 0, warnings=warnings)


@dataclass(frozen=True)
class _Context:
    """What every prediction of one `simulation_bands` call shares."""

    model: object
    data: object
    X0: np.ndarray
    ekf: object
    covs: tuple
    index: np.ndarray
    L: np.ndarray
    sv: np.ndarray

    def u(self, b: int) -> np.ndarray:
        return self.data.inputs(b)


def _k_step_all(ctx: _Context, theta_vec, ks) -> dict:
    """``{k: [(T_b, ny) k-step predictions]}`` at ``theta_vec``."""
    return k_step_predictions(ctx.ekf, theta_vec, ctx.data, ctx.X0, ks, ctx.covs, engine="casadi")


def _linear(ctx: _Context, theta_vec, ks):
    """Standard deviations (lists of (T_b, ny)) of the free run and of the k-step predictions, first order."""
    def std(J):
        return np.sqrt(np.sum((J[:, :, ctx.index] @ ctx.L) ** 2, axis=2) + ctx.sv ** 2)

    sim = [std(_free_run_jacobian(ctx.model, theta_vec, ctx.X0[b], ctx.u(b))) for b in range(len(ctx.data))]
    pred = {kk: [np.sqrt(v + ctx.sv ** 2) for v in _k_step_variance(ctx, theta_vec, kk)] for kk in ks}
    return sim, pred


def _k_step_variance(ctx: _Context, theta_vec, kk: int, h: float = 1e-3) -> list:
    """(T_b, ny) first-order variance of the k-step predictions per trajectory: central differences of the whole
    predictor (EKF and k steps) along each column of ``L`` (``Sigma = L L^T``), step ``h`` standard deviations."""
    var = [np.zeros((T, ctx.model.ny)) for T in ctx.data.lengths]
    for col in ctx.L.T:
        if not np.any(col):
            continue
        ends = []
        for sign in (1.0, -1.0):
            th = theta_vec.copy()
            th[ctx.index] += sign * h * col
            ends.append(_k_step_all(ctx, th, (kk,))[kk])
        for b in range(len(ctx.data)):
            var[b] += ((ends[0][b] - ends[1][b]) / (2 * h)) ** 2
    return var


def _sampled(ctx: _Context, theta_vec, ks, samples: int, seed):
    """Draws (lists of (S, T_b, ny)) of the free run and of the k-step predictions, theta ~ N(theta_hat, Sigma)."""
    model, B = ctx.model, len(ctx.data)
    rng = np.random.default_rng(seed)
    draws = np.tile(theta_vec, (samples, 1))
    draws[:, ctx.index] += rng.standard_normal((samples, ctx.L.shape[1])) @ ctx.L.T
    draws = np.clip(draws, model.params.lower, model.params.upper)
    sim = [np.stack([run(model, d, ctx.X0[b], ctx.u(b))[0] for d in draws]) for b in range(B)]
    per_draw = [_k_step_all(ctx, d, ks) for d in draws] if ks else []
    pred = {kk: [np.stack([p[kk][b] for p in per_draw]) for b in range(B)] for kk in ks}

    def noisy(a):
        return a + ctx.sv * rng.standard_normal(a.shape)

    return [noisy(a) for a in sim], {kk: [noisy(a) for a in v] for kk, v in pred.items()}
