"""The output-error fit by the Levenberg-Marquardt engine: starting points, initial states, shooting
nodes and multi-start (docs/output_error.md)."""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import OptionsError, ParameterError, ShapeError, SolverError
from ...io._data import Trajectories
from ...io._validate import check_data
from ...runtime._solve import deadline, deadline_after
from .._initial_state import estimate_initial_state
from ._least_squares import output_error_problem
from ._lm import box_bounds, levenberg_marquardt
from ._output_error_options import LeastSquaresResult, OutputErrorOptions, raise_if_failed

__all__ = ["output_error_least_squares"]

COMPILE_SAMPLES = 20000   # samples from which the sensitivity step is compiled to native code


def output_error_least_squares(model, data: Trajectories, theta: Mapping[str, Any], *, shooting: int | None = None,
                               x0=None, starts: Sequence[Mapping[str, Any]] | None = None,
                               options: OutputErrorOptions = OutputErrorOptions()) -> LeastSquaresResult:
    """Output-error fit of the free parameters and initial states by the Levenberg-Marquardt engine
    (docs/output_error.md): the arguments of [`refine_output_error`][ceem_casadi.refine_output_error]
    (``starts``: a list of partial parameter dicts, completed by ``theta``; ``shooting`` checked there); returns a
    `LeastSquaresResult` with ``theta``, ``x0`` (B, nx) and one row per start in ``starts``."""
    if not isinstance(options, OutputErrorOptions) or options.solver != "lm":
        raise OptionsError(f"options must be an OutputErrorOptions with solver='lm', got {options!r}")
    t0 = time.perf_counter()
    check_data(model, data)  # the one data check of every entry point (io/_validate.py)
    candidates = _candidates(model, theta, starts)
    x0 = initial_states(x0, len(data), model.nx)
    expires = deadline_after(options.time_limit, t0)  # never beyond a deadline already in force
    fit = _Fit(model, data, shooting, options, expires)
    rows, results = [], []
    for k, th in enumerate(candidates):
        row = dict(start=k, initial_cost=float("nan"), cost=float("nan"), status="not run", iterations=0, wall_s=0.0)
        rows.append(row)
        if k > 0 and expires is not None and time.perf_counter() >= expires:
            continue
        ts = time.perf_counter()
        try:
            res = fit.run(th, x0)
        except SolverError as exc:   # the initial-state estimate failed
            row.update(status="solver_failed", wall_s=time.perf_counter() - ts, message=str(exc))
            continue
        row.update(initial_cost=float(res.initial_cost), cost=float(res.cost), status=str(res.status),
                   iterations=res.iterations, wall_s=time.perf_counter() - ts)
        results.append((k, res))
    if not results:
        raise SolverError("output_error_least_squares: no start could be run: "
                          + "; ".join(r.get("message", r["status"]) for r in rows))
    k, best = min(results, key=lambda kr: (not np.isfinite(kr[1].cost), kr[1].cost))
    best.starts = rows if len(candidates) > 1 else []
    if len(candidates) > 1:
        best.message += f"; start {k} of {len(candidates)} gave the lowest objective"
    if k != 0:
        best.initial_cost = results[0][1].initial_cost if results[0][0] == 0 else best.initial_cost
    best.wall_s = time.perf_counter() - t0
    raise_if_failed("output_error_least_squares", best, options)
    return best


def _candidates(model, theta, starts) -> list:
    """The validated starting parameter sets: ``theta``, then each of ``starts`` completed by it."""
    base = model.params.validate(theta)
    out = [base]
    for i, s in enumerate(starts or ()):
        if not isinstance(s, Mapping):
            raise ParameterError(f"starts[{i}]: expected a dict of parameter values, got {type(s).__name__}")
        out.append(model.params.validate({**base, **s}))
    return out


def initial_states(x0, B: int, nx: int):
    """``x0`` as (B, nx) (None stays None)."""
    if x0 is None:
        return None
    x0 = np.asarray(x0, float)
    x0 = np.tile(x0, (B, 1)) if x0.ndim == 1 else x0
    if x0.shape != (B, nx) or not np.all(np.isfinite(x0)):
        raise ShapeError(f"x0: expected finite initial states ({B}, {nx}) or ({nx},), got {x0.shape}")
    return x0


class _Fit:
    """One output-error problem (model, data, shooting, options) run from one start after another."""

    def __init__(self, model, data, shooting, options, expires):
        self.model, self.data, self.options, self.expires = model, data, options, expires
        nx = model.nx
        self.lo_x = box_bounds(options.x_lower, nx, -np.inf, "x_lower")
        self.hi_x = box_bounds(options.x_upper, nx, np.inf, "x_upper")
        compiled = sum(data.lengths) >= COMPILE_SAMPLES
        self.prob = output_error_problem(model, data.lengths, shooting, compiled)
        free, n_nodes = self.prob.free, len(self.prob.segs)
        self.lower = np.concatenate([model.params.lower[free], np.tile(self.lo_x, n_nodes)])
        self.upper = np.concatenate([model.params.upper[free], np.tile(self.hi_x, n_nodes)])

    def _start(self, tv, x0):
        """The engine's starting unknowns (free parameters, nodes) with the data bound."""
        prob, model = self.prob, self.model
        if x0 is None:
            with deadline(self.expires):
                x0 = estimate_initial_state(model, self.data, tv, window=self.options.x0_window,
                                            x_lower=self.lo_x, x_upper=self.hi_x)
        prob.set_data(model, tv, self.data, self.options.use_prior)
        nodes = np.clip(prob.initial_nodes(model, tv, self.data, x0), self.lo_x, self.hi_x)
        if prob.n_con:   # gaps exist: two nodes at least
            spread = np.std(nodes, axis=0)
            spread = np.maximum(spread, 1e-6 * max(float(np.max(spread)), 1e-300))
            prob.c_scale = np.tile(np.where(spread > 0, spread, 1.0), len(prob.segs) - len(self.data))
        return np.concatenate([tv[prob.free], nodes.ravel()])

    def run(self, theta, x0) -> LeastSquaresResult:
        """The engine from ``theta`` (and ``x0`` (B, nx) or None); theta and x0 filled in."""
        model, prob = self.model, self.prob
        tv = model.params.to_vector(theta)
        w0 = self._start(tv, x0)
        res = levenberg_marquardt(prob, w0, self.lower, self.upper, self.options, self.expires)
        res.initial_cost = float(res.initial_cost) if prob.n_con == 0 else prob.objective(w0)
        free = prob.free
        out = tv.copy()
        out[free] = res.x[:free.size]
        res.theta = model.params.from_vector(out)
        res.x0 = res.x[free.size:].reshape(len(prob.segs), model.nx)[prob.first_nodes()]
        return res
