"""Structure search on estimation data only: nested augmentations of the user's model, judged on the heads and
held-back tails of the estimation trajectories (docs/own_data.md, "How the search decides")."""
from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from ..errors import CeemError
from ..io._data import Trajectories
from ..model._simulation import run
from ..runtime import _policy as policy
from ._augment import augment, context_of
from ._search_options import SearchOptions, SearchResult
from .output_error import OutputErrorOptions, refine_output_error

__all__ = ["free_run_errors", "objective_of", "structure_search"]

logger = logging.getLogger(__name__)

#: how often a move may appear on one path (the polynomial moves compose into higher degrees)
REPEATS = {"output_poly": 2, "input_poly": 2, "poly_degree": 3, "nl_width": 2, "order": 2}

#: the costly moves: tried last at every depth, in slices, within an equal share of the time per depth left
COSTLY = ("mlp_output", "mlp_state")

#: a costly candidate's fit runs in this many slices of its budget (docs/own_data.md)
SLICES = 4

#: share of the search's time kept for the final refit on all the estimation data
FINAL_SHARE = 0.25


def free_run_errors(model, theta, data: Trajectories, x0) -> list:
    """Weighted free-run errors ``(y - yhat) / sigma_v`` per trajectory ((T_b, ny), NaN where
    unobserved or where the run is not finite) from ``x0`` (B, nx)."""
    tv = model.params.to_vector(theta)
    iv = np.asarray(model.noise.inv_measurement_std, float)
    out = []
    for b in range(len(data)):
        y, _ = run(model, tv, np.asarray(x0[b], float), data.inputs(b))
        with np.errstate(all="ignore"):
            e = (data.y[b] - y.reshape(data.y[b].shape)) * iv
        out.append(np.where(np.isfinite(data.y[b]), np.where(np.isfinite(e), e, np.inf), np.nan))
    return out


def objective_of(errors: list) -> float:
    """``0.5 sum e^2`` over the observed entries (inf when a run is not finite)."""
    e = np.concatenate([a.ravel() for a in errors])
    e = e[~np.isnan(e)]
    return 0.5 * float(np.sum(e ** 2)) if np.all(np.isfinite(e)) else np.inf


class _Search:
    """The state of one search (docs/own_data.md, "How the search decides")."""

    def __init__(self, data, opts: SearchOptions, fit_options: OutputErrorOptions, expires):
        data = data.leading(policy.SEARCH_SAMPLES)  # long records: candidate fits stay cheap
        self.data, self.opts, self.fit_options, self.expires = data, opts, fit_options, expires
        self.cuts = [min(max(2, round((1 - opts.holdout) * T)), T) for T in data.lengths]   # heads | tails
        self.head = Trajectories([data.y[b][:c] for b, c in enumerate(self.cuts)], None if data.u is None else
                                 [data.inputs(b)[:c] for b, c in enumerate(self.cuts)], dt=data.dt)
        self.rows, self.accepted, self.t0 = [], [], time.perf_counter()

    def score(self, model, theta, x0):
        """(head objective, criterion, tail RMS, k) of a fit on the heads."""
        err = free_run_errors(model, theta, self.data, x0)
        head = [e[:c] for e, c in zip(err, self.cuts)]
        tail = np.concatenate([e[c:].ravel() for e, c in zip(err, self.cuts)])
        tail = tail[~np.isnan(tail)]
        obj = objective_of(head)
        n = sum(int(np.sum(~np.isnan(e))) for e in head)
        k = int(model.params.free_index.size) + len(self.data) * model.nx
        if not np.isfinite(obj) or n == 0:
            return obj, np.inf, np.inf, k
        mse = max(2.0 * obj / n, 1e-300)
        ic = n * np.log(mse) + (2.0 * k if self.opts.criterion == "aic" else k * np.log(n))
        rms = float(np.sqrt(np.mean(tail ** 2))) if tail.size and np.all(np.isfinite(tail)) else (
            np.nan if not tail.size else np.inf)
        return obj, float(ic), rms, k

    def fit(self, model, theta, x0, data, budget, max_iters=None):
        opts = replace(self.fit_options, max_iters=max_iters or self.opts.max_iters, time_limit=budget)
        return refine_output_error(model, data, theta, x0=x0, options=opts)

    def sliced_fit(self, model, theta, x0, budget, parent, rival):
        """Fit on the heads in `SLICES` slices of ``budget``, each resumed from the last's best
        iterate, stopped when the criterion, projected linearly over the time left, cannot reach
        ``rival``'s (None: one fit); ``(result, note)``."""
        if rival is None or budget is None:
            return self.fit(model, theta, x0, self.head, budget), ""
        t0, its = time.perf_counter(), 0
        while True:
            left = budget - (time.perf_counter() - t0)
            res = self.fit(model, theta, x0, self.head, min(budget / SLICES, max(left, 1e-3)),
                           self.opts.max_iters - its)
            its, theta, x0 = its + int(res.iterations), res.theta, res.x0
            spent = time.perf_counter() - t0
            if str(res.status) != "time_limit" or spent >= budget or its >= self.opts.max_iters:
                return res, ""
            ic = self.score(model, theta, x0)[1]
            if ic - (parent["ic"] - ic) / spent * (budget - spent) >= rival["ic"]:
                return res, (f"; stopped after {spent:.0f} s: its {self.opts.criterion.upper()} {ic:.6g} cannot "
                             f"reach {rival['ic']:.6g} ({rival['structure']}) at its pace")

    def node(self, label, model, theta, x0, lifts, parent, t0, status="", message=""):
        obj, ic, tail, k = self.score(model, theta, x0)
        return dict(structure=label, model=model, theta=theta, x0=np.asarray(x0, float), lifts=lifts, parent=parent,
                    k=k, objective=obj, ic=ic, tail=tail, status=status, verdict="", wall_s=time.perf_counter() - t0,
                    message=message)

    def judge(self, child, parent) -> bool:
        if not np.isfinite(child["ic"]):
            child["verdict"] = "rejected: its free run is not finite"
            return False
        if not child["ic"] < parent["ic"]:
            child["verdict"] = f"rejected: {self.opts.criterion.upper()} not below its parent's {parent['ic']:.6g}"
            return False
        if np.isfinite(parent["tail"]) and not child["tail"] < parent["tail"]:
            child["verdict"] = f"rejected: tail RMS not below its parent's {parent['tail']:.4g}"
            return False
        child["verdict"] = "accepted"
        return True

    def log(self, row, depth):
        self.rows.append(row)
        logger.info("search [%d] depth %d %s: k=%d objective %.6g %s %.6g tail %.4g %s %.1f s -> %s", len(self.rows),
                    depth, row["structure"], row["k"], row["objective"], self.opts.criterion.upper(), row["ic"],
                    row["tail"], row["status"], row["wall_s"], row["verdict"])

    def candidate(self, label, parent, depth, budget, build, rival=None):
        """Fit the child ``build() -> (model, theta, x0, lifts)`` on the heads (in slices, against
        ``rival``, when given), judge it against ``parent`` and log it; the child when accepted, else None."""
        t0 = time.perf_counter()
        try:
            model, theta, x0, lifts = build()
            res, note = self.sliced_fit(model, theta, x0, budget, parent, rival)
            child = self.node(label, model, res.theta, res.x0, lifts, parent, t0, str(res.status), res.message)
            ok = self.judge(child, parent)
            child["verdict"] += note
        except (CeemError, RuntimeError) as exc:  # a move that cannot be built or fitted is reported
            child, ok = dict(structure=label, k=0, objective=np.inf, ic=np.inf, tail=np.inf, status="solver_failed",
                             verdict=f"rejected: {str(exc).splitlines()[0][:120]}", wall_s=time.perf_counter() - t0), False
        self.log(child, depth)
        self.accepted += [child] if ok else []
        return child if ok else None

    def grow(self, parent, aug, depth, budget, rival=None):
        tag = f"s{len(self.rows)}"   # one row per candidate: unique along every path

        def build():
            ctx = context_of(parent["model"], parent["theta"], parent["x0"], self.head)
            g = augment(aug, parent["model"], parent["theta"], parent["x0"], self.head, ctx, tag)
            return g.model, g.theta, g.x0, parent["lifts"] + [g.lift]
        return self.candidate(f"{parent['structure']} + {aug.label}", parent, depth, budget, build, rival)

    def user_candidate(self, name, model, theta, root, budget):
        theta = model.params.initial() if theta is None else model.params.validate(theta)
        return self.candidate(name, root, 1, budget, lambda: (model, theta, None, None))

    def budget(self, left: int, keep: float = FINAL_SHARE):
        """Seconds for one of ``left`` fits, keeping ``keep`` of the search's time for what follows."""
        return None if self.expires is None else max(
            (self.expires - time.perf_counter() - keep * (self.expires - self.t0)) / max(left, 1), 1e-3)

    def out_of_time(self) -> bool:
        return self.expires is not None and \
            self.expires - time.perf_counter() <= FINAL_SHARE * max(self.expires - self.t0, 0.0)

    def costly(self, node, moves, depth, share, root) -> list:
        """The accepted children of the costly ``moves`` from ``node`` in ``share`` seconds (sliced fits)."""
        accepted, t0 = [], time.perf_counter()
        for i, aug in enumerate(moves):
            budget = None if share is None else (share + t0 - time.perf_counter()) / (len(moves) - i)
            if self.out_of_time() or (budget is not None and budget <= 0):
                self.skip(node, aug, depth)
                continue
            rival = min([root] + self.accepted, key=lambda c: c["ic"])
            accepted += [c for c in [self.grow(node, aug, depth, budget, rival)] if c]
        return accepted

    def skip(self, node, aug, depth):
        self.log(dict(structure=f"{node['structure']} + {aug.label}", k=0, objective=np.nan, ic=np.nan, tail=np.nan,
                      status="not run", verdict="time limit", wall_s=0.0), depth)


def _rank(node) -> tuple:
    """Order of the accepted nodes: a costly move's fit cut by the time limit (far from an optimum) last,
    then the tail RMS (free run on held-back data), then the criterion (alone when there is no tail)."""
    cut = node["status"] == "time_limit" and node["structure"].rsplit(" + ", 1)[-1].startswith(COSTLY)
    return cut, node["tail"] if np.isfinite(node["tail"]) else np.inf, node["ic"]


def _moves(opts, node, costly: bool):
    used = node["structure"].split(" + ")[1:]
    return [a for a in opts.augmentations if a.applicable(node["model"]) and (a.kind in COSTLY) == costly
            and used.count(a.label) < REPEATS.get(a.kind, 1)]


def structure_search(model, data: Trajectories, theta, x0, *, options: SearchOptions | None = None,
                     fit_options: OutputErrorOptions = OutputErrorOptions(), expires: float | None = None,
                     user_objective: float | None = None) -> SearchResult:
    """Search structures grown from ``model`` at its optimum ``(theta, x0)`` on the estimation
    ``data`` until ``expires`` (a ``time.perf_counter()`` deadline); the result's objective on all of
    ``data`` is never above ``user_objective`` (the user's model's at ``(theta, x0)``)."""
    t_all = time.perf_counter()
    options = SearchOptions() if options is None else options
    s = _Search(data, options, fit_options, expires)
    theta = model.params.validate(theta)
    x0 = np.asarray(x0, float).reshape(len(data), model.nx)
    if user_objective is None:
        user_objective = objective_of(free_run_errors(model, theta, data, x0))
    t0, res = time.perf_counter(), s.fit(model, theta, x0, s.head, s.budget(1 + len(options.augmentations)))
    root = s.node("user model", model, res.theta, res.x0, [], None, t0, str(res.status), res.message)
    root["verdict"] = "the root (fitted on the heads)"
    s.log(root, 0)
    frontier, extra = [root], list(options.candidates)
    for depth in range(1, options.max_depth + 1):
        accepted = []
        for node in frontier:
            cheap, costly = _moves(options, node, False), _moves(options, node, True)
            pending = len(cheap) + len(extra)
            for name, m, th in extra:
                if not s.out_of_time():
                    accepted += [c for c in [s.user_candidate(name, m, th, root, s.budget(pending))] if c]
                pending -= 1
            extra = []
            starved = False     # from a budget below the parent's own fit time on (they could not finish)
            for aug in cheap:
                budget = s.budget(pending)
                pending -= 1
                starved = starved or (budget is not None and budget < node["wall_s"])
                if s.out_of_time() or starved:
                    s.skip(node, aug, depth)
                    continue
                accepted += [c for c in [s.grow(node, aug, depth, budget)] if c]
            accepted += s.costly(node, costly, depth, s.budget(options.max_depth - depth + 1), root)
        if not accepted:
            break
        frontier = sorted(accepted, key=_rank)[:options.beam]
    best, cut = min([root] + s.accepted, key=_rank), min([root] + s.accepted, key=lambda n: _rank(n)[1:])
    why = "" if cut is best else f"; {cut['structure']} has a lower tail RMS but the time limit cut its fit"
    return _final(s, model, theta, x0, data, best, user_objective, t_all, why)


def _final(s: _Search, model, theta, x0, data, best, user_objective, t_all, why="") -> SearchResult:
    """Refit the chosen node on all of ``data`` (docs/own_data.md) and build the result."""
    user = (model, theta, x0, user_objective, "user model", "nothing beat the user's model on the estimation data",
            "n/a", 0)
    chosen = user
    if best["parent"] is not None:
        fits = [(s.fit(best["model"], best["theta"], best["x0"], data, s.budget(1, 0.0), s.fit_options.max_iters),
                 "from its head optimum")]
        if not fits[0][0].cost <= user_objective and best["lifts"] is not None:
            th, x = theta, x0
            for lift in best["lifts"]:
                th, x = lift(th, x, data)
            fits.append((s.fit(best["model"], th, x, data, s.budget(1, 0.0), s.fit_options.max_iters),
                         "from the user's optimum lifted into it"))
        for res, how in fits:
            obj = objective_of(free_run_errors(best["model"], res.theta, data, res.x0))
            if obj <= min(user_objective, chosen[3]):
                chosen = (best["model"], res.theta, res.x0, obj, best["structure"],
                          f"refitted on all the estimation data {how}: {res.message}", str(res.status),
                          int(res.iterations))
        if chosen is user:
            chosen = user[:5] + (f"{best['structure']} refitted on all the estimation data did not reach the "
                                 "user's model's objective: the user's model is kept", "n/a", 0)
    for r in s.rows:
        r["chosen"] = r["structure"] == chosen[4]
    rows = [{k: v for k, v in r.items() if k not in ("model", "theta", "x0", "lifts", "parent")} for r in s.rows]
    m, th, x, obj, label, msg, status, its = chosen
    return SearchResult(m, th, np.asarray(x, float), float(obj), label, rows, s.opts.criterion,
                        time.perf_counter() - t_all, msg + why, status, its)
