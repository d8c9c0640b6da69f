"""The stages of [`identify`][ceem_casadi.identify], when each runs and why (docs/choosing.md); a skipped or
failed stage stays in the table with its reason and advice."""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

import numpy as np

from ..errors import DataError, ModelError, NonFiniteError, SolverError
from ..io._data import Trajectories
from ..runtime._result import Result
from ..runtime._schema import require
from ..runtime._status import Status
from ._search import free_run_errors, objective_of
from .output_error import refine_output_error

__all__ = ["StageFit", "Stages", "free_run_fit", "options_of"]

#: why a skipped stage did not run
SKIP_CEEM = ("skipped: output error from theta0 converged from a start that simulates (CE-EM runs with ceem=True, "
             "or by itself when the start does not simulate or output error does not converge)")
SKIP_CALIBRATION = ("skipped: the CE-EM estimate simulates no better than output error from theta0 "
                    "(calibrate=True runs it)")
#: a start "simulates" when its free-run RMS is at most this multiple of each output's RMS
SIMULATES = 10.0
#: what fails a stage (a row: a start outside the model's domain, a solver); a wrong shape or option raises at once
FAILS = (SolverError, NonFiniteError, DataError, ModelError)
ADVICE = ("try starts=n (seeded log-uniform multi-starts), a theta0 closer to the data (e.g. from n4sid or "
          "bla_initialise), or tighter parameter bounds")


@dataclass(repr=False)
class StageFit(Result):
    """One stage of `identify` on the estimation data.

    Attributes
    ----------
    stage : str
        Its name.
    theta : dict
        Parameters, name -> array.
    x0 : numpy.ndarray
        (B, nx) initial states.
    objective : float
        ``0.5 sum ((y - yhat) / sigma_v)^2`` of the free runs from ``x0`` (dimensionless).
    rms : numpy.ndarray
        (ny,) simulation RMS per output on the estimation data (units of y).
    status : str
        The stage's solver status.
    iterations : int
        Its iterations.
    wall_s : float
        Its seconds.
    message : str
        What happened.
    rejected : str
        Why the stage cannot be chosen ("" when it can).

    Examples
    --------
    >>> import numpy as np
    >>> import ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1,
    ...                                          measurement_std=0.1)
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [1.0], 40, u=np.random.default_rng(0).normal(size=(40, 1)),
    ...                       process_std=0.1, seed=1)
    >>> res = cc.identify(model, data, {"a": 0.5}, ceem=False, calibrate=False)
    >>> [(stage.stage, round(float(stage.theta["a"]), 1)) for stage in res.stages]
    [('theta0', 0.5), ('output error from theta0', 0.8)]
    """

    SUMMARY = ("stage", "status", "iterations", "objective")

    stage: str
    theta: dict = field(repr=False)
    x0: np.ndarray = field(repr=False)
    objective: float
    rms: np.ndarray
    status: str
    iterations: int
    wall_s: float
    message: str = field(default="", repr=False)
    rejected: str = ""


def free_run_fit(model, theta, data: Trajectories, x0, weights=None) -> tuple[float, np.ndarray]:
    """Output-error objective (errors weighted by the ``1 / sigma_v`` of ``weights``, a model, default ``model``)
    and per-output RMS (units of y) of the free runs from ``x0`` (B, nx)."""
    noise = (model if weights is None else weights).noise
    obj = objective_of(err := free_run_errors(model, theta, data, x0, noise.inv_measurement_std))
    if not np.isfinite(obj):
        return np.inf, np.full(model.ny, np.inf)
    sig = np.asarray(noise.measurement_std, float)
    e = np.vstack(err) * sig
    ok = ~np.isnan(e)
    return obj, np.sqrt(np.sum(np.where(ok, e, 0.0) ** 2, axis=0) / np.maximum(ok.sum(axis=0), 1))


def options_of(value, cls, what: str):
    """``value`` as ``cls`` (CEEMOptions or OutputErrorOptions): None (the defaults), an instance, or a mapping of
    its fields (``cls.from_mapping`` when it has one, else unknown fields refused by name)."""
    if value is None or isinstance(value, cls):
        return cls() if value is None else value
    require(isinstance(value, Mapping), f"{what}: expected {cls.__name__} or a dict of its fields, got "
            f"{type(value).__name__}")
    if hasattr(cls, "from_mapping"):
        return cls.from_mapping(value)
    known = {f.name for f in fields(cls)} | set(cls.deprecated_aliases)
    unknown = sorted(set(value) - known)
    require(not unknown, f"{what}: unknown {cls.__name__} field(s) {unknown}; known: {sorted(known)}")
    return cls(**value)


def _first_line(exc) -> str:
    """The error's first line without advice meant for another entry point (``exc.cause`` when set)."""
    text = str(getattr(exc, "cause", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Stages:
    """The stage table of one `identify` call."""

    def __init__(self, model, data, shooting, options):
        self.model, self.data, self.shooting, self.options = model, data, shooting, options
        self.stages, self.errors = [], []

    def row(self, *args):
        """Append ``StageFit(*args)`` to the table and return it."""
        self.stages.append(StageFit(*args))
        return self.stages[-1]

    def add(self, stage, theta, x0, status, iterations, t0, message="", rejected="", advice=""):
        obj, rms = free_run_fit(self.model, theta, self.data, x0)
        if str(status) == "diverged" and not rejected:  # never chosen, whatever its objective; the advice measured
            rejected = f"diverged: the free run explodes. {advice or Status.DIVERGED.advice}"
        return self.row(stage, theta, np.asarray(x0, float), obj, rms, str(status), int(iterations),
                        time.perf_counter() - t0, message, rejected)

    def not_run(self, stage, theta, status, seconds, message, rejected):
        m = self.model
        return self.row(stage, theta, np.zeros((len(self.data), m.nx)), np.inf, np.full(m.ny, np.inf), status, 0,
                        seconds, message, rejected)

    def failed(self, stage, theta, t0, exc, rejected=""):
        self.errors.append(exc)
        return self.not_run(stage, theta, "solver_failed", time.perf_counter() - t0, f"{_first_line(exc)}; {ADVICE}",
                            rejected)

    def skipped(self, stage, theta, reason):
        return self.not_run(stage, theta, "skipped", 0.0, "", reason)

    def start(self, theta0):
        from ._initial_state import estimate_initial_state

        t0 = time.perf_counter()
        try:
            x = np.asarray(estimate_initial_state(self.model, self.data, theta0), float)
            return self.add("theta0", theta0, x.reshape(len(self.data), self.model.nx), "n/a", 0, t0)
        except FAILS as exc:
            return self.failed("theta0", theta0, t0, exc)

    def output_error(self, name, theta, starts, budget):
        t0 = time.perf_counter()
        try:
            res = refine_output_error(self.model, self.data, theta, shooting=self.shooting, starts=starts,
                                      options=replace(self.options, time_limit=budget))
        except FAILS as exc:
            return self.failed(name, theta, t0, exc)
        message = res.message
        if res.starts:
            k = min((r for r in res.starts if np.isfinite(r["cost"])), key=lambda r: r["cost"], default=None)
            message = f"start {k['start'] if k else '?'} of {len(res.starts)} won (0 = theta0); {message}"
        return self.add(name, res.theta, res.x0, res.status, res.iterations, t0, message, advice=res.advice)

    def simulates(self, stage) -> bool:
        """Whether a stage's free run stays within SIMULATES x the spread of every measured output."""
        y = np.vstack([self.data.y[b] for b in range(len(self.data))])
        spread = np.nanstd(y, axis=0) + np.abs(np.nanmean(y, axis=0))
        return bool(np.all(np.isfinite(stage.rms)) and np.all(stage.rms <= SIMULATES * np.maximum(spread, 1e-300)))

    def ceem_stage(self, ceem, theta0, copt, start, oe0, expires, calibrate):
        """Run CE-EM (or record why not) and output error from its estimate; returns the CE-EM stage."""
        from ..em._ceem import ceem as run_ceem

        if ceem is False:
            return None
        simulates = self.simulates(start)
        if ceem == "auto" and simulates and oe0.status == "converged":
            self.skipped("CE-EM", theta0, SKIP_CEEM)
            return None
        why = ("ceem=True" if ceem is True else "the start does not simulate" if not simulates else
               f"output error from theta0 ended {oe0.status}")
        t0 = time.perf_counter()
        share = 3.0 if calibrate is True else 2.0
        budget = None if expires is None else max(expires - time.perf_counter(), 1e-3) / share
        try:
            ce = run_ceem(self.model, self.data, theta0, options=replace(copt, time_limit=budget))
        except FAILS as exc:  # e.g. a start whose simulation explodes
            self.failed("CE-EM", theta0, t0, exc, rejected=f"ran ({why}) and failed")
            return None
        stage = self.add("CE-EM", ce.theta, np.array([x[0] for x in ce.x]), ce.status, len(ce.history), t0,
                         f"ran: {why}; {ce.message}")
        stage.ce = ce
        if ce.status is not Status.SOLVER_FAILED:
            rem = None if expires is None else max(expires - time.perf_counter(), 1e-3)
            self.output_error("output error from CE-EM", ce.theta, None, None if rem is None else rem / (share - 1.0))
        return stage

    def calibration(self, calibrate, ce_stage, oe0, copt, grid, criterion, expires):
        from ._identify_noise import calibration_stage, failed, verdict

        ce = ce_stage.ce
        if calibrate is False or ce.status is Status.SOLVER_FAILED:
            return
        if calibrate == "auto" and not ce_stage.objective < oe0.objective:
            self.skipped("noise calibration", ce.theta, SKIP_CALIBRATION)
            return
        t0 = time.perf_counter()
        budget = None if expires is None else 0.5 * max(expires - time.perf_counter(), 1e-3)
        try:
            name, th, x0, status, its, msg = calibration_stage(self.model, self.data, ce.theta, copt, grid,
                                                               criterion, budget)
        except SolverError as exc:
            self.failed("noise calibration", ce.theta, t0, exc, failed(exc))
            return
        cal = self.add(name, th, x0, status, its, t0, msg)
        cal.rejected = verdict(self.model, cal, ce_stage)
        if not cal.rejected:
            self.output_error("output error from noise calibration", cal.theta, None,
                              None if expires is None else max(expires - time.perf_counter(), 1e-3))

    def best(self):
        finite = [s for s in self.stages if np.isfinite(s.objective) and not s.rejected]
        if not finite:
            # a stage's refusal of the data or the start (a ValueError: non-finite, out of the domain) is the cause
            cause = next((e for e in self.errors if isinstance(e, ValueError)), None)
            msg = ("identify: no stage gives a finite free run on the estimation data: "
                   + "; ".join(f"{s.stage}: {s.message or s.rejected}" for s in self.stages))
            raise (type(cause) if cause is not None else SolverError)(msg)
        return min(finite, key=lambda s: s.objective)
