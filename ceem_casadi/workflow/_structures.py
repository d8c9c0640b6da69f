"""`compare_structures`: candidate structures fitted by output error and ranked on estimation data only
(AIC or a held-out tail of every trajectory)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..io._data import Trajectories
from ..io._validate import check_candidate
from ..runtime._result import Result
from ..runtime._schema import require
from ._search import free_run_errors
from .output_error import OutputErrorOptions
from .output_error._fit import output_error_least_squares

__all__ = ["StructureComparison", "compare_structures"]


@dataclass(repr=False)
class StructureComparison(Result):
    """Outcome of `compare_structures`.

    Attributes
    ----------
    rows : list of dict
        One per candidate, best first: ``name``, ``criterion`` (its value), ``objective`` (the fit's
        output-error objective), ``rms`` (units of y), ``n_estimated`` (k), ``status``, ``fit`` (the
        `LeastSquaresResult`).
    criterion : str
        ``"aic"`` or ``"split"``.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> def make(free_b):
    ...     params = cc.Parameters(cc.Param("a", 0.5), cc.Param("b", 0.0, free=free_b))
    ...     return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u + p.b * u ** 2,
    ...                                             lambda x, u, p: x, nx=1, nu=1, params=params,
    ...                                             measurement_std=0.01)
    >>> u = np.random.default_rng(0).standard_normal((200, 1))
    >>> y = cc.simulate_output(make(True), {"a": 0.7, "b": 0.3}, u, np.zeros(1))
    >>> y = y + 0.01 * np.random.default_rng(1).standard_normal(y.shape)
    >>> cmp = cc.compare_structures({"linear": (make(False), None), "quadratic": (make(True), None)},
    ...                             cc.Trajectories([y], [u]))
    >>> cmp.best
    'quadratic'
    """

    rows: list
    criterion: str

    @property
    def best(self) -> str:
        """Name of the best candidate."""
        return self.rows[0]["name"]

    def __repr__(self) -> str:
        return f"StructureComparison(best={self.best!r}, criterion={self.criterion!r}, candidates={len(self.rows)})"

    def table(self) -> str:
        """One line per candidate, best first."""
        w = max(len(r["name"]) for r in self.rows)
        rows = [f"{r['name']:<{w}}  {r['criterion']:12.6g}  {r['rms']:10.4g}  {r['n_estimated']:>4}  {r['status']}"
                for r in self.rows]
        return "\n".join([f"{'structure':<{w}}  {self.criterion:>12}  {'RMS':>10}  {'k':>4}  status", *rows])

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return dict(criterion=self.criterion, best=self.best, rows=[dict(r, fit=None) for r in self.rows])


def compare_structures(candidates: Mapping[str, tuple], data: Trajectories, *, criterion: str = "aic",
                       holdout: float = 0.3, options: OutputErrorOptions | None = None) -> StructureComparison:
    """Fit every candidate structure by output error and rank them on the estimation data.

    Parameters
    ----------
    candidates : dict
        Name -> ``(model, theta)`` or ``(model, theta, x0)`` (``theta`` None: the model's initial
        values; ``x0`` (B, nx) or (nx,) the starting initial states, e.g. a CE-EM fit's, default
        [`estimate_initial_state`][ceem_casadi.estimate_initial_state]'s).
    data : Trajectories
        Estimation data.
    criterion : str
        ``"aic"``: ``N log(mean squared error) + 2 k`` of the fit on all of ``data`` (N outputs
        observed, k = free parameters + B nx initial states; errors weighted by the first candidate's
        ``1 / sigma_v``, one weighting for all).
        ``"split"``: fit on the first ``1 - holdout`` of every trajectory, then the RMS of the free
        run continued over the held-out tail.
    holdout : float
        Fraction held out by ``"split"`` (0 < holdout < 1).
    options : OutputErrorOptions, optional
        Options of the fits.

    Returns
    -------
    StructureComparison
        ``rows`` best first (each with its fit under ``"fit"``), ``best``, ``table()``.
    Examples
    --------
    Data of a linear system: the linear structure wins by AIC over a cubic one.

    >>> import numpy as np
    >>> import ceem_casadi as cc
    >>> params = lambda *extra: cc.Parameters(cc.Param("a", 0.5), *extra)
    >>> linear = cc.StateSpaceModel.from_discrete(
    ...     lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1, params=params(),
    ...     process_std=0.1, measurement_std=0.1)
    >>> cubic = cc.StateSpaceModel.from_discrete(
    ...     lambda x, u, p: p.a * x + p.b * x ** 3 + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=params(cc.Param("b", 0.0)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(60, 1))
    >>> data, _ = cc.simulate(linear, {"a": 0.8}, [0.0], 60, u=u, process_std=0.1,
    ...                       measurement_std=0.1, seed=1)
    >>> cc.compare_structures({"linear": (linear, None), "cubic": (cubic, None)}, data).best
    'linear'
    """
    require(isinstance(candidates, Mapping) and len(candidates) > 0,
            f"candidates: expected a non-empty dict name -> (model, theta), got {candidates!r}"[:200])
    require(criterion in ("aic", "split"), f"criterion must be 'aic' or 'split', got {criterion!r}")
    require(0.0 < holdout < 1.0, f"holdout must be in (0, 1), got {holdout!r}")
    options = OutputErrorOptions() if options is None else options
    checked = {name: _candidate(name, cand, data) for name, cand in candidates.items()}   # all, before any fit
    noise = next(iter(checked.values()))[0].noise   # one weighting of the errors for all (the first candidate's)
    cut = [max(2, round((1 - holdout) * T)) if criterion == "split" else 0 for T in data.lengths]   # heads | tails
    require(any(np.any(~np.isnan(y[c:])) for y, c in zip(data.y, cut)), f"criterion='split': the held-out tails (the "
            f"last {holdout:g} of every trajectory) observe no output; use criterion='aic' or another holdout")
    rows = [_score_candidate(name, *cand, data, criterion, cut, options, noise) for name, cand in checked.items()]
    rows.sort(key=lambda r: r["criterion"])
    return StructureComparison(rows, criterion)


def _candidate(name: str, cand, data: Trajectories) -> tuple:
    """``(model, theta, x0)`` of the candidate ``name``, its theta validated and ``data`` checked against its model."""
    given = type(cand).__name__ + (f" of {len(cand)}" if isinstance(cand, (tuple, list)) else "")
    require(isinstance(cand, (tuple, list)) and len(cand) in (2, 3),
            f"candidates[{name!r}]: expected (model, theta) or (model, theta, x0), got {given}")
    model, theta, x0 = (*cand, None) if len(cand) == 2 else cand
    return model, check_candidate(name, model, data, theta), x0


def _score_candidate(name: str, model, theta, x0, data: Trajectories, criterion: str, cut: list,
                     options: OutputErrorOptions, noise) -> dict:
    """One row of `compare_structures`: the candidate fitted by output error (on the heads ``[:cut[b]]`` of the
    trajectories with ``"split"``) and scored by its criterion on the estimation data (errors weighted by
    ``noise.inv_measurement_std``)."""
    fit_data = data if criterion == "aic" else data.leading(cut)
    res = output_error_least_squares(model, fit_data, theta, x0=x0, options=options)
    tails = [w[c:] for w, c in zip(free_run_errors(model, res.theta, data, res.x0, noise.inv_measurement_std), cut)]
    we = np.concatenate([w[~np.isnan(w)] for w in tails])   # weighted errors; e: in units of y
    e = np.concatenate([(w * np.asarray(noise.measurement_std, float))[~np.isnan(w)] for w in tails])
    k = int(model.params.free_index.size) + len(data) * model.nx
    rms = float(np.sqrt(np.mean(e ** 2))) if np.all(np.isfinite(e)) else np.inf
    value = e.size * float(np.log(np.mean(we ** 2))) + 2 * k if criterion == "aic" and np.isfinite(rms) else rms
    return dict(name=name, criterion=value, objective=float(res.cost), rms=rms, n_estimated=k,
                status=str(res.status), fit=res)
