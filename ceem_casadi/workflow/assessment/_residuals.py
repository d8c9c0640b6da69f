"""Residual analysis of a fitted model (MATLAB ``resid``): whiteness of the one-step (EKF innovation) and free-run
residuals and their independence of the inputs, with the bounds of Ljung (eq. 16.59) and the Ljung-Box test.
Formulas and measured false-alarm rates: docs/validation.md (residual analysis)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.special import chdtrc, ndtri

from ...errors import ShapeError
from ...io._validate import check_data
from ...model._simulation import as_theta_vector
from ...runtime._checks import count
from ...runtime._result import Result, plain
from ._predictions import check_level, predictions, resolve_initial_states, signal_names

__all__ = ["ResidualAnalysis", "ResidualCorrelations", "residual_analysis"]

KINDS = ("one_step", "free_run")


def _lagged(a: list, c: list, lags: np.ndarray) -> np.ndarray:
    """``sum_b sum_t a_b[t] c_b[t - tau]`` for each tau in ``lags`` (a_b (T_b, n), c_b (T_b, m)) -> (len, n, m)."""
    out = np.zeros((len(lags), a[0].shape[1], c[0].shape[1]))
    for i, tau in enumerate(lags):
        for ab, cb in zip(a, c):
            T = ab.shape[0]
            if abs(tau) >= T:
                continue
            out[i] += ab[tau:].T @ cb[:T - tau] if tau >= 0 else ab[:T + tau].T @ cb[-tau:]
    return out


def _centred(parts: list) -> tuple[list, np.ndarray, np.ndarray]:
    """(zero-filled centred arrays, pooled mean (n,), valid counts (n,)) of a list of (T_b, n) with NaN missing."""
    stacked = np.concatenate(parts)
    ok = np.isfinite(stacked)
    n = ok.sum(axis=0)
    with np.errstate(invalid="ignore"):
        mean = np.where(n > 0, np.where(ok, stacked, 0.0).sum(axis=0) / np.maximum(n, 1), np.nan)
    return [np.where(np.isfinite(p), p - mean, 0.0) for p in parts], mean, n


@dataclass(frozen=True, repr=False)
class ResidualCorrelations(Result):
    """Correlations of one kind of residual (formulas: docs/validation.md).

    Attributes
    ----------
    kind : str
        ``"one_step"`` or ``"free_run"``.
    residuals : list of numpy.ndarray
        (T_b - skip, ny) per trajectory, NaN where masked.
    n, mean, rms : numpy.ndarray
        (ny,) valid residuals per output, their mean and root mean square (units of y).
    autocorr, auto_bound : numpy.ndarray
        (ny, lags + 1) normalised autocorrelation at lags 0 .. lags and the (ny,) whiteness bound ``z / sqrt(N)``.
    crosscorr, cross_bound : numpy.ndarray
        (ny, nu, 2 lags + 1) normalised cross-correlation with each input at lags -lags .. lags and the (ny, nu)
        independence bound ``z sqrt(P / N)`` (NaN for a constant input).
    ljung_box, p_value : numpy.ndarray
        (ny,) Ljung-Box statistic and its p-value.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(200, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.9}, [0.0], 200, u=u, measurement_std=0.1, seed=1)
    >>> res = cc.residual_analysis(model, data, {"a": 0.9}, x0=[0.0], kind="free_run", lags=10)
    >>> corr = res.kinds["free_run"]
    >>> corr.autocorr.shape, corr.crosscorr.shape, float(corr.autocorr[0, 0])
    ((1, 11), (1, 1, 21), 1.0)
    """

    SUMMARY = ("kind", "n", "p_value")

    kind: str
    residuals: list = field(repr=False)
    n: np.ndarray
    mean: np.ndarray
    rms: np.ndarray
    autocorr: np.ndarray
    auto_bound: np.ndarray
    crosscorr: np.ndarray
    cross_bound: np.ndarray
    ljung_box: np.ndarray
    p_value: np.ndarray

    def to_dict(self) -> dict:
        """Every field but the residuals as plain JSON-able data."""
        return {k: plain(v) for k, v in vars(self).items() if k != "residuals"}


def correlations(kind: str, res: list, u: list, lags: int, level: float, dof: int) -> ResidualCorrelations:
    """The `ResidualCorrelations` of residuals ``res`` (list of (T_b, ny), NaN masked) and inputs ``u`` (list of (T_b, nu))."""
    e, mean, n = _centred(res)
    ut, _, _ = _centred(u)
    z = float(ndtri(0.5 + level / 2))
    pos = np.arange(lags + 1)
    both = np.arange(-lags, lags + 1)
    ny = e[0].shape[1]
    c_ee = np.stack([_lagged([x[:, [j]] for x in e], [x[:, [j]] for x in e], pos)[:, 0, 0] for j in range(ny)])
    with np.errstate(invalid="ignore", divide="ignore"):
        auto = c_ee / c_ee[:, :1]
        nu = ut[0].shape[1]
        c_uu = np.stack([_lagged([x[:, [i]] for x in ut], [x[:, [i]] for x in ut], pos)[:, 0, 0] for i in range(nu)]) \
            if nu else np.zeros((0, lags + 1))
        auto_u = c_uu / c_uu[:, :1]
        cross = np.moveaxis(_lagged(e, ut, both), 0, -1) / np.sqrt(np.outer(c_ee[:, 0], c_uu[:, 0]))[:, :, None]
        P = 1.0 + 2.0 * np.einsum("jk,ik->ji", auto[:, 1:], auto_u[:, 1:])
        cross_bound = z * np.sqrt(np.maximum(P, 0.0) / n[:, None])
        cross_bound = np.where(c_uu[None, :, 0] > 0, cross_bound, np.nan)
        auto_bound = z / np.sqrt(n)
        N = n.astype(float)
        Q = N * (N + 2.0) * np.sum(auto[:, 1:] ** 2 / (N[:, None] - pos[None, 1:]), axis=1)
    p = chdtrc(max(lags - dof, 1), Q)
    rms = np.sqrt(np.array([np.sum(np.concatenate([x[:, j] for x in e]) ** 2) for j in range(ny)]) / np.maximum(n, 1)
                  + mean ** 2)
    return ResidualCorrelations(kind, res, n, mean, rms, auto, auto_bound, cross, cross_bound, Q, p)


@dataclass(frozen=True, repr=False)
class ResidualAnalysis(Result):
    """Result of [`residual_analysis`][ceem_casadi.residual_analysis].

    Attributes
    ----------
    kinds : dict of str to ResidualCorrelations
        ``"one_step"`` and/or ``"free_run"``.
    lags, level, dof, skip
        The settings of [`residual_analysis`][ceem_casadi.residual_analysis] (whiteness rejected when
        ``p < 1 - level``).
    output_names, input_names : tuple of str
        (ny,) and (nu,) names.
    x0 : numpy.ndarray
        (B, nx) initial states used.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(200, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.9}, [0.0], 200, u=u, measurement_std=0.1, seed=1)
    >>> res = cc.residual_analysis(model, data, {"a": 0.9}, x0=[0.0], lags=10)
    >>> sorted(res.kinds), res.lags, res.output_names
    (['free_run', 'one_step'], 10, ('y0',))
    """

    SUMMARY = ("lags", "level", "skip", "white")

    kinds: dict
    lags: int
    level: float
    dof: int
    skip: int
    output_names: tuple
    input_names: tuple
    x0: np.ndarray = field(default=None, repr=False)

    @property
    def white(self) -> dict:
        """``{kind: (ny,) bool}``: Ljung-Box p-value at least ``1 - level``."""
        return {k: c.p_value >= 1.0 - self.level for k, c in self.kinds.items()}

    def __getitem__(self, kind: str) -> ResidualCorrelations:
        return self.kinds[kind]

    def to_dataframe(self):
        """pandas DataFrame, one row per (kind, output): the counts, moments, largest correlations (the cross
        ones as a ratio to their bound) and the two tests (columns: docs/validation.md)."""
        import pandas as pd

        rows = []
        for kind, c in self.kinds.items():
            with np.errstate(invalid="ignore"):
                ratio = np.nanmax(np.abs(c.crosscorr) / c.cross_bound[:, :, None], axis=(1, 2)) \
                    if c.crosscorr.size and np.isfinite(c.cross_bound).any() else np.full(len(c.n), np.nan)
            for j, name in enumerate(self.output_names):
                rows.append((kind, name, int(c.n[j]), c.mean[j], c.rms[j], float(np.max(np.abs(c.autocorr[j, 1:]))),
                             c.auto_bound[j], c.ljung_box[j], self.lags - self.dof, c.p_value[j],
                             bool(c.p_value[j] >= 1 - self.level), ratio[j], bool(not ratio[j] > 1)))
        cols = ["kind", "output", "n", "mean", "rms", "max_autocorr", "auto_bound", "ljung_box", "dof", "p_value",
                "white", "max_crosscorr_ratio", "independent"]
        return pd.DataFrame(rows, columns=cols).set_index(["kind", "output"])

    def table(self) -> str:
        """[`to_dataframe`][ceem_casadi.workflow.ResidualAnalysis.to_dataframe] as text."""
        return self.to_dataframe().to_string(float_format=lambda v: f"{v:.4g}")

    def to_dict(self) -> dict:
        """JSON-ready dict: the settings and, per kind, the correlations, bounds and test."""
        return {"lags": self.lags, "level": self.level, "dof": self.dof, "skip": self.skip,
                "output_names": list(self.output_names), "input_names": list(self.input_names),
                "kinds": {k: c.to_dict() for k, c in self.kinds.items()}}

    def plot(self, path=None, kind: str | None = None, dt: float | None = None):
        """The two-panel figure of MATLAB ``resid`` (autocorrelation, cross-correlation with each input, bounds),
        saved to ``path`` (.png/.svg, returned), else the matplotlib Figure."""
        from ...plots import plot_residuals

        return plot_residuals(self, path, kind=kind or next(iter(self.kinds)), dt=dt)


def residual_analysis(model, data, theta, *, lags: int = 25, level: float = 0.99,
                      kind: str | Sequence[str] = KINDS, x0=None, window: int | None = None,
                      skip: int | None = None, starts=None, dof: int = 0, Sigma0=None, Q=None, R=None,
                      output_names: Sequence[str] | None = None, input_names: Sequence[str] | None = None,
                      engine: str = "python") -> ResidualAnalysis:
    """Whiteness and input-independence of the one-step-ahead and free-run residuals (docs/validation.md).

    Parameters
    ----------
    model : StateSpaceModel
    data : Trajectories
        NaN = missing (masked).
    theta : dict or numpy.ndarray
        Parameters, name -> array (or the flat vector).
    lags : int
        Largest lag (samples).
    level : float
        Confidence level of the bounds and of the Ljung-Box test.
    kind : str or sequence of str
        ``"one_step"`` (EKF innovations) and/or ``"free_run"``.
    x0, window, skip, starts
        Initial states, as in [`validation_report`][ceem_casadi.validation_report].
    dof : int
        Degrees of freedom subtracted from ``lags`` in the Ljung-Box test.
    Sigma0, Q, R, engine
        The EKF of the one-step residuals, as in [`validation_report`][ceem_casadi.validation_report].
    output_names, input_names : sequence of str, optional
        Names (default ``y0 ...``, ``u0 ...``).

    Returns
    -------
    ResidualAnalysis

    Examples
    --------
    The true model's one-step residuals are white; a model with the wrong pole is not:

    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.3, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(400, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.9}, [0.0], 400, u=u, process_std=0.3, measurement_std=0.1, seed=1)
    >>> good = cc.residual_analysis(model, data, {"a": 0.9}, x0=[0.0], kind="one_step")
    >>> bad = cc.residual_analysis(model, data, {"a": 0.3}, x0=[0.0], kind="one_step")
    >>> bool(good.white["one_step"][0]), bool(bad.white["one_step"][0])
    (True, False)
    """
    check_data(model, data)
    theta_vec = as_theta_vector(model, theta)
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    if not kinds or any(k not in KINDS for k in kinds):
        raise ShapeError(f"kind: expected 'one_step' and/or 'free_run', got {kind!r}")
    count(lags, "lags")
    count(dof, "dof", 0)
    level = check_level(level)
    X0, skip = resolve_initial_states(model, data, theta_vec, x0, window=window, skip=skip, starts=starts)
    if lags >= min(data.lengths) - skip:
        raise ShapeError(f"lags: expected fewer than {min(data.lengths) - skip} (samples of the shortest trajectory "
                         f"after skip), got {lags}")
    ynames = signal_names(output_names, model.ny, "y", "output_names")
    unames = signal_names(input_names, model.nu, "u", "input_names")
    y_sim, y_pred = predictions(model, data, theta_vec, X0, (1,) if "one_step" in kinds else (),
                                Sigma0=Sigma0, Q=Q, R=R, engine=engine)
    us = [data.inputs(b)[skip:] for b in range(len(data))]
    out = {}
    for k in kinds:
        preds = y_pred[1] if k == "one_step" else y_sim
        with np.errstate(invalid="ignore"):
            res = [np.where(np.isfinite(p[skip:]), data.y[b][skip:] - p[skip:], np.nan) for b, p in enumerate(preds)]
        out[k] = correlations(k, res, us, int(lags), level, int(dof))
    return ResidualAnalysis(out, int(lags), level, int(dof), skip, ynames, unames, X0)
