"""Validation report of a fitted state-space model: RMSE, NRMSE and fit % of the free run and of k-step-ahead EKF
predictions, pooled and per trajectory. Definitions, the initial-state rule and the wash-out: docs/validation.md."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ...io._measures import error_stats, fit_percent, nrmse, rmse
from ...io._validate import check_data
from ...model._simulation import as_theta_vector as _theta_vector
from ...runtime._result import Result, plain
from ._predictions import horizons, predictions, resolve_initial_states, signal_names

__all__ = ["Metrics", "ValidationReport", "fit_percent", "nrmse", "rmse", "validation_report"]


@dataclass(frozen=True, repr=False)
class Metrics(Result):
    """Error measures of one kind of prediction (definitions: docs/validation.md).

    Attributes
    ----------
    rmse, nrmse, fit_percent : numpy.ndarray
        (ny,) per output (units of y, dimensionless, percent).
    n : numpy.ndarray
        (ny,) number of valid entries per output.
    rmse_overall, nrmse_overall, fit_overall : float
        RMSE over all outputs pooled; mean NRMSE and mean fit over the outputs.

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.workflow import Metrics
    >>> m = Metrics.of(np.array([[1.0], [3.0], [np.nan]]), np.array([[1.5], [2.5], [0.0]]))
    >>> m.rmse, m.fit_percent, m.n
    (array([0.5]), array([50.]), array([2]))
    """

    SUMMARY = ('rmse_overall', 'nrmse_overall', 'fit_overall')

    rmse: np.ndarray
    nrmse: np.ndarray
    fit_percent: np.ndarray
    n: np.ndarray
    rmse_overall: float
    nrmse_overall: float
    fit_overall: float

    @classmethod
    def of(cls, y, yhat) -> Metrics:
        """Metrics of observations ``y`` and predictions ``yhat``, (T, ny) or (B, T, ny)."""
        sse, sst, n, _ = error_stats(np.atleast_2d(y), np.atleast_2d(yhat))
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(n > 0, np.sqrt(sse / np.maximum(n, 1)), np.nan)
            nr = np.where(n > 0, np.sqrt(sse / sst), np.nan)
            overall = float(np.sqrt(sse.sum() / n.sum())) if n.sum() else float("nan")
        return cls(rmse=r, nrmse=nr, fit_percent=100.0 * (1.0 - nr), n=n, rmse_overall=overall,
                   nrmse_overall=float(np.mean(nr)), fit_overall=float(np.mean(100.0 * (1.0 - nr))))

    def to_dict(self, output_names: Sequence[str] | None = None) -> dict:
        """JSON-ready dict (lists of floats; non-finite values as None)."""
        names = list(output_names) if output_names is not None else [f"y{j}" for j in range(len(self.rmse))]
        overall = {"rmse": self.rmse_overall, "nrmse": self.nrmse_overall, "fit_percent": self.fit_overall}
        return {"outputs": names, **{k: _finite(getattr(self, k)) for k in ("rmse", "nrmse", "fit_percent")},
                "n": [int(v) for v in self.n], "overall": _finite(overall)}


def _finite(values):
    """A list (or dict) of floats with non-finite values as None."""
    if isinstance(values, dict):
        return {k: float(v) if np.isfinite(v) else None for k, v in values.items()}
    return [float(v) if np.isfinite(v) else None for v in values]


@dataclass(frozen=True, repr=False)
class ValidationReport(Result):
    """Result of [`validation_report`][ceem_casadi.validation_report].

    Attributes
    ----------
    simulation : Metrics
        Metrics of the free run.
    prediction : dict of int to Metrics
        Metrics of the k-step-ahead predictions.
    output_names, skip
        (ny,) output names and the leading samples left out.
    y_sim, y_pred : list of numpy.ndarray, dict of int to list
        Free-run outputs and k-step predictions (T_b, ny) per trajectory.
    x0 : numpy.ndarray or None
        (B, nx) initial states used (given, ``x1_mean`` or estimated).
    uncertainty : ParameterUncertainty or dict or None
        Carried into `to_dict` as ``"parameters"``.
    trajectories : list of dict
        Per trajectory ``{"simulation": Metrics, "prediction": {k: Metrics}}``.

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.workflow import Metrics, ValidationReport
    >>> m = Metrics.of(np.array([[1.0], [3.0]]), np.array([[1.5], [2.5]]))
    >>> ValidationReport(simulation=m, prediction={1: m}, output_names=("y0",)).to_dict()["prediction"]["1"]["rmse"]
    [0.5]
    """

    SUMMARY = ('output_names', 'skip')

    simulation: Metrics
    prediction: dict
    output_names: tuple
    skip: int = 0
    y_sim: list = field(default_factory=list, repr=False, compare=False)
    y_pred: dict = field(default_factory=dict, repr=False, compare=False)
    x0: np.ndarray | None = field(default=None, repr=False, compare=False)
    uncertainty: object = field(default=None, repr=False, compare=False)
    trajectories: list = field(default_factory=list, repr=False, compare=False)

    def to_dict(self) -> dict:
        """JSON-ready dict: ``simulation``, ``prediction`` (keys ``"1"``, ...), ``skip``, and ``parameters`` when
        ``uncertainty`` is set, ``trajectories`` (the same per trajectory) when there are several."""
        def kinds(sim, pred):
            return {"simulation": sim.to_dict(self.output_names),
                    "prediction": {str(k): m.to_dict(self.output_names) for k, m in pred.items()}}

        out = {**kinds(self.simulation, self.prediction), "skip": self.skip}
        if len(self.trajectories) > 1:
            out["trajectories"] = [kinds(t["simulation"], t["prediction"]) for t in self.trajectories]
        if self.uncertainty is not None:
            out["parameters"] = plain(self.uncertainty if hasattr(self.uncertainty, "to_dict") else dict(self.uncertainty))
        return out

    def table(self, per_trajectory: bool = False) -> str:
        """[`to_dataframe`][ceem_casadi.workflow.ValidationReport.to_dataframe] as text."""
        return self.to_dataframe(per_trajectory).reset_index().to_string(index=False)

    def to_dataframe(self, per_trajectory: bool = False):
        """pandas DataFrame of ``rmse``, ``nrmse``, ``fit_percent``, ``n``, one row per kind (``"simulation"``,
        ``"k=1"``, ...) and output (and ``"overall"``); ``per_trajectory`` adds a ``trajectory`` level (``"all"``)."""
        import pandas as pd

        rows = []
        groups = [("all", self.simulation, self.prediction)]
        if per_trajectory:
            groups += [(b, t["simulation"], t["prediction"]) for b, t in enumerate(self.trajectories)]
        for traj, sim, pred in groups:
            kinds = [("simulation", sim)] + [(f"k={k}", m) for k, m in pred.items()]
            for kind, m in kinds:
                for j, name in enumerate(self.output_names):
                    rows.append((kind, traj, name, m.rmse[j], m.nrmse[j], m.fit_percent[j], int(m.n[j])))
                rows.append((kind, traj, "overall", m.rmse_overall, m.nrmse_overall, m.fit_overall, int(m.n.sum())))
        df = pd.DataFrame(rows, columns=["kind", "trajectory", "output", "rmse", "nrmse", "fit_percent", "n"])
        if not per_trajectory:
            return df.drop(columns="trajectory").set_index(["kind", "output"])
        order = {k: i for i, k in enumerate(dict.fromkeys(df["kind"]))}
        df = df.sort_values("kind", key=lambda c: c.map(order), kind="stable")
        return df.set_index(["kind", "trajectory", "output"])


def _score(ys, preds, skip: int) -> Metrics:
    y = np.concatenate([a[skip:] for a in ys])
    h = np.concatenate([p[skip:] for p in preds])
    h = np.where(np.isfinite(h) | np.isnan(y), h, np.inf)  # diverged predictions: infinite error
    return Metrics.of(y, h)


def validation_report(model, data, theta, *, x0=None, k: int | Sequence[int] = (1,), Sigma0=None, Q=None,
                      R=None, skip: int | None = None, output_names: Sequence[str] | None = None,
                      engine: str = "python", window: int | None = None, uncertainty=None, starts=None,
                      seed: int | None = 0) -> ValidationReport:
    """Free-run and k-step-ahead prediction metrics of ``model`` at ``theta`` on ``data`` (docs/validation.md).

    Parameters
    ----------
    model : StateSpaceModel
    data : Trajectories
        NaN = missing (not scored).
    theta : dict or numpy.ndarray
        Parameters, name -> array (or the flat parameter vector).
    x0 : numpy.ndarray or "estimate", optional
        (B, nx) or (nx,) initial states; default ``x1_mean``, else (or with ``"estimate"``) estimated from the
        first ``window`` samples by [`estimate_initial_state`][ceem_casadi.estimate_initial_state].
    k : int or sequence of int
        Prediction horizon(s) in samples; ``()`` for simulation only.
    Sigma0, Q, R : float or numpy.ndarray, optional
        EKF covariances (scalars, diagonals or matrices); default from the model's noise.
    skip : int, optional
        Leading samples left out of all metrics; default ``window`` when x0 is estimated, else 0.
    output_names : sequence of str, optional
        Names of the ny outputs (default ``y0, y1, ...``).
    engine : {"python", "casadi"}
        EKF engine (see [`EKF`][ceem_casadi.filtering.EKF]).
    window : int, optional
        Samples used to estimate x0 (default ``min(T_min - 1, 10 nx)``).
    uncertainty : ParameterUncertainty or dict, optional
        Carried by the report.
    starts : int or numpy.ndarray, optional
        More starts of the initial-state fit: (S, nx) or (B, S, nx) states, or a count (docs/validation.md).
    seed : int, optional
        Seed of the random starts.

    Returns
    -------
    ValidationReport

    Examples
    --------
    The one-step error of the true model is close to the measurement noise (0.1):

    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(60, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [0.0], 60, u=u, process_std=0.1, measurement_std=0.1, seed=1)
    >>> report = cc.validation_report(model, data, {"a": 0.8}, k=1)
    >>> round(float(report.simulation.rmse[0]), 2), round(float(report.prediction[1].rmse[0]), 2)
    (0.14, 0.12)
    """
    check_data(model, data)
    theta_vec = _theta_vector(model, theta)
    ks = horizons(k)
    names = signal_names(output_names, model.ny, "y", "output_names")
    X0, skip = resolve_initial_states(model, data, theta_vec, x0, window=window, skip=skip, starts=starts, seed=seed)
    y_sim, y_pred = predictions(model, data, theta_vec, X0, ks, Sigma0=Sigma0, Q=Q, R=R, engine=engine)
    per_traj = [{"simulation": _score([data.y[b]], [y_sim[b]], skip),
                 "prediction": {kk: _score([data.y[b]], [y_pred[kk][b]], skip) for kk in ks}}
                for b in range(len(data))]
    return ValidationReport(
        simulation=_score(data.y, y_sim, skip),
        prediction={kk: _score(data.y, y_pred[kk], skip) for kk in ks},
        output_names=names, skip=int(skip), y_sim=y_sim, y_pred=y_pred, x0=X0, uncertainty=uncertainty,
        trajectories=per_traj)
