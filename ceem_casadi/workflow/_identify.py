"""The recommended pipeline `identify`: its stages and the structure search within one time budget, the best on the
estimation data (docs/own_data.md, "The short route"; docs/choosing.md)."""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..em._options import CEEMOptions
from ..io._data import Trajectories
from ..io._validate import check_candidate, check_data
from ..runtime._checks import count
from ..runtime._result import Result
from ..runtime._schema import check_time_limit, require
from ._identify_stages import StageFit, Stages, free_run_fit, options_of
from ._search import SearchState, structure_search
from ._search_options import search_options
from ._starts import resolve_starts
from .output_error import OutputErrorOptions

__all__ = ["IdentifyResult", "StageFit", "identify"]


@dataclass(repr=False)
class IdentifyResult(Result):
    """Outcome of `identify`.

    Attributes
    ----------
    best : StageFit
        The stage with the lowest output-error objective on the estimation data.
    stages : list of StageFit
        Every stage, in run order.
    wall_s : float
        Seconds for the whole call.
    model : StateSpaceModel
        The model of ``best`` (the user's, unless the structure search chose a grown one).
    search : SearchResult or None
        The structure search (``search=``): ``search.table()`` has every candidate.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.2)), measurement_std=0.1)
    >>> u = np.sin(0.3 * np.arange(60))[:, None]
    >>> data = cc.Trajectories([cc.simulate_output(model, {"a": 0.7}, u, np.zeros(1))], [u])
    >>> res = cc.identify(model, data, {"a": 0.2}, ceem=False)
    >>> res.best.stage, round(float(res.theta["a"]), 6)
    ('output error from theta0', 0.7)
    """

    best: StageFit
    stages: list
    wall_s: float
    model: object = field(default=None, repr=False)
    search: object = field(default=None, repr=False)

    @property
    def theta(self) -> dict:
        """Parameters of the best stage, name -> array."""
        return self.best.theta

    @property
    def x0(self) -> np.ndarray:
        """(B, nx) initial states of the best stage."""
        return self.best.x0

    def __repr__(self) -> str:
        return (f"IdentifyResult(best={self.best.stage!r}, objective={self.best.objective:.6g}, "
                f"stages={len(self.stages)}, wall_s={self.wall_s:.3g})")

    def table(self) -> str:
        """One line per stage: objective, RMS per output, status, iterations, seconds, and why a
        stage was rejected or skipped (or which start won); ``*`` = chosen; then the search's table (``search=``)."""
        w = max(len(s.stage) for s in self.stages)
        out = [f"  {'stage':<{w}}  {'objective':>12}  {'estimation RMS':>16}  {'status':<13}  {'iter':>5}  {'wall s':>7}"]
        for s in self.stages:
            mark = "*" if s is self.best else " "
            rms = " ".join(f"{v:.4g}" for v in np.atleast_1d(s.rms))
            won = s.message.split("; ")[0] if s.message.startswith("start ") else ""   # a multi-start's winner
            out.append((f"{mark} {s.stage:<{w}}  {s.objective:12.6g}  {rms:>16}  {s.status:<13}  {s.iterations:>5}  "
                        f"{s.wall_s:7.2f}  {s.rejected or won}").rstrip())
        if self.search is not None:
            out += ["structure search (estimation data only; heads fitted, tails held back):", self.search.table()]
        return "\n".join(out)

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return dict(best=self.best.stage, wall_s=self.wall_s, stages=[s.to_dict() for s in self.stages],
                    search=None if self.search is None else self.search.to_dict())


def identify(model, data: Trajectories, theta0: Mapping[str, Any], *, time_limit: float | None = None,
             starts: int | Sequence[Mapping[str, Any]] | None = None, seed: int = 0, ceem: bool | str = "auto",
             ceem_options=None, shooting: int | None = None, options=None, calibrate: bool | str = "auto",
             noise_grid: Sequence[float] | None = None, noise_criterion: str = "innovation",
             search=None) -> IdentifyResult:
    """Run the recommended sequence (docs/own_data.md, "The short route"); the best stage on the estimation data.

    Parameters
    ----------
    model : StateSpaceModel
        The model (``measurement_std`` weights the outputs of the output-error stages).
    data : Trajectories
        Estimation data only (keep test data out: every choice is made on these).
    theta0 : dict
        Starting parameters, name -> array.
    time_limit : float, optional
        Seconds for everything. With ``search``, the stages get half and the search the rest (a safety
        cap: the search's fits are budgeted in iterations, so it chooses the same on any machine unless
        the cap hits, which its table and message then say);
        CE-EM gets half of the stages' budget left after output error from ``theta0`` (a third with
        the calibration, which gets half of what then remains).
    starts : int or sequence of dict, optional
        More starting parameter sets for the output-error stage from ``theta0``; an int n: n
        seeded log-uniform starts ([`log_uniform_starts`][ceem_casadi.workflow.log_uniform_starts]).
    seed : int
        Seed of ``starts=n``.
    ceem : bool or "auto"
        Run the CE-EM stage (and output error from its estimate): True always, False never,
        ``"auto"`` only when the start does not simulate or output error from ``theta0`` did not converge.
    ceem_options : CEEMOptions or dict, optional
        Options of the CE-EM stage (a dict: [`CEEMOptions.from_mapping`][ceem_casadi.CEEMOptions.from_mapping];
        its ``time_limit`` comes from ``time_limit``: one set here is refused).
    shooting : int, optional
        Multiple shooting segment length of the output-error stages (``None``: single shooting).
    options : OutputErrorOptions or dict, optional
        Options of the output-error stages (their ``time_limit`` comes from ``time_limit``; one set here is refused).
    calibrate : bool or "auto"
        After CE-EM, a noise-calibration stage ([`calibrate_noise`][ceem_casadi.calibrate_noise] over
        ``noise_grid``), kept only when it lowers the CE-EM stage's estimation objective without
        pinning a parameter at a bound; ``"auto"``: only when CE-EM simulates better than output error.
    noise_grid : sequence of float, optional
        Multipliers of the model's ``process_std`` tried by the calibration (default ``(0.1, 10)``).
    noise_criterion : str
        Its criterion, ``"innovation"`` or ``"holdout"`` (both on the estimation data).
    search : bool, SearchOptions or list, optional
        The structure search from the best stage: True (default moves), a
        [`SearchOptions`][ceem_casadi.workflow.SearchOptions], or a list of moves
        ([`Augmentation`][ceem_casadi.workflow.Augmentation] or kind names) and/or ``(name, model,
        theta)`` structures of your own. ``result.model`` is then the chosen model.

    Returns
    -------
    IdentifyResult
        ``best``, ``stages``, ``model``, ``search``, ``table()``, ``to_dict()``.

    Raises
    ------
    SolverError
        When no stage gives a finite free run on the estimation data.
    OptionsError, ShapeError, DataError, ParameterError
        Options, shapes, data or parameters that do not fit the model (one line: what is expected, what was given).

    Examples
    --------
    A scalar system fitted from a = 0.5 (truth 0.8); the stage table is on estimation data only:

    >>> import numpy as np
    >>> import ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(
    ...     lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(60, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [0.0], 60, u=u, process_std=0.1,
    ...                       measurement_std=0.1, seed=1)
    >>> res = cc.identify(model, data, {"a": 0.5}, time_limit=60)
    >>> round(float(res.theta["a"]), 1), res.best.status
    (0.8, 'converged')
    """
    check_data(model, data)  # the one data check of every entry point (io/_validate.py)
    check_time_limit(time_limit)
    for name, v in (("ceem", ceem), ("calibrate", calibrate)):
        require(isinstance(v, bool) or v == "auto", f"{name} must be True, False or 'auto', got {v!r}")
    shooting = None if shooting is None else count(shooting, "shooting (None: single shooting, or a segment length)")
    require(noise_criterion in ("innovation", "holdout"),
            f"noise_criterion must be 'innovation' or 'holdout', got {noise_criterion!r}")
    search_opts = search_options(search)
    copt = options_of(ceem_options, CEEMOptions, "ceem_options")
    options = options_of(options, OutputErrorOptions, "options")
    if search_opts is not None:   # a head or a candidate the search cannot fit fails now, not after the stages
        SearchState(data, search_opts, options, None)
        for name, m, th in search_opts.candidates:
            check_candidate(name, m, data, th)
    require(options.time_limit is None and copt.time_limit is None, "options, ceem_options: their time_limit is set "
            f"from identify's time_limit= (the budget of the whole call, here {time_limit}); give that one instead")
    theta0 = model.params.validate(theta0)
    starts = resolve_starts(model, theta0, starts, seed=seed)
    t_all = time.perf_counter()
    end = None if time_limit is None else t_all + float(time_limit)
    expires = None if end is None else (t_all + 0.5 * float(time_limit) if search_opts is not None else end)
    run = Stages(model, data, shooting, options)
    start = run.start(theta0)
    oe0 = run.output_error("output error from theta0", theta0, starts, None if expires is None else
                           max(expires - time.perf_counter(), 1e-3) / (1.0 if ceem is False else 2.0))
    ce = run.ceem_stage(ceem, theta0, copt, start, oe0, expires, calibrate)
    if ce is not None:
        run.calibration(calibrate, ce, oe0, copt, noise_grid, noise_criterion, expires)
    best = run.best()
    result = IdentifyResult(best, run.stages, 0.0, model)
    if search_opts is not None:
        t0 = time.perf_counter()
        found = structure_search(model, data, best.theta, best.x0, options=search_opts, fit_options=options,
                                 expires=end, user_objective=best.objective)
        result.search = found
        if found.model is not model:
            obj, rms = free_run_fit(found.model, found.theta, data, found.x0, weights=model)   # the user's weights
            stage = run.row(f"structure search: {found.structure}", found.theta, found.x0, obj, rms, found.status,
                            found.iterations, time.perf_counter() - t0, found.message)
            result.best, result.model = stage, found.model
    result.wall_s = time.perf_counter() - t_all
    return result
