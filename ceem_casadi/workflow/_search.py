"""Structure search on estimation data only: nested augmentations of the user's model, judged on the heads and
held-back tails of the estimation trajectories (docs/own_data.md, "How the search decides")."""
from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from ..errors import CeemError, DataError
from ..io._data import Trajectories
from ..io._validate import check_candidate
from ..model._simulation import run
from ..runtime import _policy as policy
from ._augment import NOT_FOR_BLOCKS, augment, context_of, is_block_oriented
from ._search_options import DEFAULT_AUGMENTATIONS, SearchOptions, SearchResult
from .output_error import OutputErrorOptions, refine_output_error

__all__ = ["free_run_errors", "objective_of", "structure_search"]

logger = logging.getLogger(__name__)

#: how often a move may appear on one path (the polynomial moves compose into higher degrees)
REPEATS = {"output_poly": 2, "input_poly": 2, "poly_degree": 3, "nl_width": 2, "order": 2}

#: the costly moves: tried last at every depth (a fixed order)
COSTLY = ("mlp_output", "mlp_state")

#: share of ``time_limit`` kept for the final refit when the cap hits the candidates
FINAL_SHARE = 0.25


def free_run_errors(model, theta, data: Trajectories, x0, iv=None) -> list:
    """Weighted free-run errors ``(y - yhat) / sigma_v`` per trajectory ((T_b, ny), NaN where unobserved, inf
    where the run is not finite) from ``x0`` (B, nx); ``iv`` (ny,) the weights ``1 / sigma_v`` (default the model's)."""
    tv = model.params.to_vector(theta)
    iv = np.asarray(model.noise.inv_measurement_std if iv is None else iv, float)
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
    with np.errstate(over="ignore"):  # finite errors whose squares overflow: inf, without a warning
        return 0.5 * float(np.sum(e ** 2)) if np.all(np.isfinite(e)) else np.inf


class SearchState:
    """The state of one search (docs/own_data.md, "How the search decides"): every fit runs to its
    iteration limit; ``expires`` is only a safety cap (the candidates stop at 3/4 of it); every structure's errors
    are weighted by the user's model's ``1 / sigma_v`` (``iv``): a candidate's own noise levels do not score it."""

    def __init__(self, data, opts: SearchOptions, fit_options: OutputErrorOptions, expires, iv=None):
        data = data.leading(policy.SEARCH_SAMPLES)  # long records: candidate fits stay cheap
        self.data, self.opts, self.fit_options, self.expires, self.iv = data, opts, fit_options, expires, iv
        self.cuts = [min(max(2, round((1 - opts.holdout) * T)), T) for T in data.lengths]   # heads | tails
        self.head = data.leading(self.cuts)
        empty = [b for b, y in enumerate(self.head.y) if np.all(np.isnan(y))]
        if empty:   # checked by identify before its stages run (it builds a SearchState for that)
            raise DataError(f"search: trajectory {empty[0]} observes no output in its first {self.cuts[empty[0]]} "
                            "samples, the head the search fits (the rest is held back): drop it or lower holdout")
        self.rows, self.accepted, self.capped = [], [], False
        self.cap = None if expires is None else expires - FINAL_SHARE * max(expires - time.perf_counter(), 0.0)

    def score(self, model, theta, x0):
        """(head objective, criterion, tail RMS, k) of a fit on the heads."""
        err = free_run_errors(model, theta, self.data, x0, self.iv)
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

    def fit(self, model, theta, x0, data, max_iters, until):
        """A fit of at most ``max_iters`` iterations, cut at the ``until`` deadline (None: no cap)."""
        left = None if until is None else max(until - time.perf_counter(), 1e-3)
        res = refine_output_error(model, data, theta, x0=x0,
                                  options=replace(self.fit_options, max_iters=max_iters, time_limit=left))
        self.capped |= str(res.status) == "time_limit"
        return res

    def node(self, label, model, theta, x0, lifts, parent, t0, status="", message=""):
        obj, ic, tail, k = self.score(model, theta, x0)
        return dict(structure=label, model=model, theta=theta, x0=np.asarray(x0, float), lifts=lifts, parent=parent,
                    k=k, objective=obj, ic=ic, tail=tail, status=status, verdict="", wall_s=time.perf_counter() - t0,
                    message=message)

    def judge(self, child, parent) -> bool:
        rules = ((np.isfinite(child["ic"]), "its free run is not finite"),
                 (child["ic"] < parent["ic"], f"{self.opts.criterion.upper()} not below its parent's {parent['ic']:.6g}"),
                 (not np.isfinite(parent["tail"]) or child["tail"] < parent["tail"],
                  f"tail RMS not below its parent's {parent['tail']:.4g}"))
        why = next((w for ok, w in rules if not ok), None)
        child["verdict"] = "accepted" if why is None else f"rejected: {why}"
        return why is None

    def log(self, row, depth):
        self.rows.append(row)
        logger.info("search [%d] depth %d %s: k=%d objective %.6g %s %.6g tail %.4g %s %.1f s -> %s", len(self.rows),
                    depth, row["structure"], row["k"], row["objective"], self.opts.criterion.upper(), row["ic"],
                    row["tail"], row["status"], row["wall_s"], row["verdict"])

    def candidate(self, label, parent, depth, build) -> list:
        """Fit the child ``build() -> (model, theta, x0, lifts)`` on the heads, judge it against
        ``parent`` and log it; ``[child]`` when accepted, else ``[]`` (not run once the cap passed)."""
        t0 = time.perf_counter()
        if self.cap is not None and t0 >= self.cap:
            self.capped = True
            self.log(dict(structure=label, k=0, objective=np.nan, ic=np.nan, tail=np.nan, status="not run",
                          verdict="time limit", wall_s=0.0), depth)
            return []
        try:
            model, theta, x0, lifts = build()
            res = self.fit(model, theta, x0, self.head, self.opts.max_iters, self.cap)
            child = self.node(label, model, res.theta, res.x0, lifts, parent, t0, str(res.status), res.message)
            ok = self.judge(child, parent)
        except (CeemError, RuntimeError) as exc:  # a move that cannot be built or fitted is reported
            child, ok = dict(structure=label, k=0, objective=np.inf, ic=np.inf, tail=np.inf, status="solver_failed",
                             verdict=f"rejected: {str(exc).splitlines()[0][:120]}", wall_s=time.perf_counter() - t0), False
        self.log(child, depth)
        self.accepted += [child] if ok else []
        return [child] if ok else []

    def grow(self, parent, aug, depth) -> list:
        tag = f"s{len(self.rows)}"   # one row per candidate: unique along every path

        def build():
            ctx = context_of(parent["model"], parent["theta"], parent["x0"], self.head)
            g = augment(aug, parent["model"], parent["theta"], parent["x0"], self.head, ctx, tag)
            return g.model, g.theta, g.x0, None if parent["lifts"] is None else parent["lifts"] + [g.lift]
        grown = self.candidate(f"{parent['structure']} + {aug.label}", parent, depth, build)
        for child in grown:   # the moves on its path, a move's prior strengths as one (they share its repeats)
            child["moves"] = parent.get("moves", ()) + (replace(aug, prior_std=None).label,)
        return grown


def _rank(node) -> tuple:
    """Order of the accepted nodes: a fit cut by the time limit (far from an optimum) last, then the
    tail RMS (free run on held-back data), then the criterion (alone when there is no tail)."""
    return node["status"] == "time_limit", node["tail"] if np.isfinite(node["tail"]) else np.inf, node["ic"]


def _moves(opts, node) -> list:
    """The moves applicable to ``node`` (costly ones last; a move's prior strengths share its repeats); the default
    moves skip `NOT_FOR_BLOCKS` on a block-oriented model (an explicit list is taken as given)."""
    skip = NOT_FOR_BLOCKS if opts.augmentations == DEFAULT_AUGMENTATIONS and is_block_oriented(node["model"]) else ()
    return sorted([a for a in opts.augmentations if a.applicable(node["model"]) and a.kind not in skip
                   and node.get("moves", ()).count(replace(a, prior_std=None).label) < REPEATS.get(a.kind, 1)],
                  key=lambda a: a.kind in COSTLY)


def structure_search(model, data: Trajectories, theta, x0, *, options: SearchOptions | None = None,
                     fit_options: OutputErrorOptions = OutputErrorOptions(), expires: float | None = None,
                     user_objective: float | None = None) -> SearchResult:
    """Search structures grown from ``model`` at its optimum ``(theta, x0)`` on the estimation
    ``data``, every fit to ``options.max_iters`` iterations; ``expires`` (a ``time.perf_counter()``
    deadline) is a safety cap only. The result's objective on all of ``data`` is never above
    ``user_objective`` (the user's model's at ``(theta, x0)``)."""
    t_all = time.perf_counter()
    options = SearchOptions() if options is None else options
    s = SearchState(data, options, fit_options, expires, model.noise.inv_measurement_std)
    theta = model.params.validate(theta)
    x0 = np.asarray(x0, float).reshape(len(data), model.nx)
    if user_objective is None:
        user_objective = objective_of(free_run_errors(model, theta, data, x0))
    t0, res = time.perf_counter(), s.fit(model, theta, x0, s.head, options.max_iters, s.cap)
    root = s.node("user model", model, res.theta, res.x0, [], None, t0, str(res.status), res.message)
    root["verdict"] = "the root (fitted on the heads)"
    s.log(root, 0)
    frontier, users = [root], []
    for name, m, th in options.candidates:     # the user's structures: judged at depth 1, grown like the others
        th = check_candidate(name, m, data, th)
        users += s.candidate(name, root, 1, lambda m=m, th=th: (m, th, None, None))
    for depth in range(1, options.max_depth + 1):
        accepted = users if depth == 1 else []
        for node in frontier:
            for aug in _moves(options, node):
                accepted += s.grow(node, aug, depth)
        if not accepted:
            break
        frontier = sorted(accepted, key=_rank)[:options.beam]
    best, cut = min([root] + s.accepted, key=_rank), min([root] + s.accepted, key=lambda n: _rank(n)[1:])
    why = "" if cut is best else f"; {cut['structure']} has a lower tail RMS but the time limit cut its fit"
    return _final(s, model, theta, x0, data, best, user_objective, t_all, why)


def _final(s: SearchState, model, theta, x0, data, best, user_objective, t_all, why="") -> SearchResult:
    """Refit the chosen node on all of ``data`` (docs/own_data.md) and build the result."""
    user = (model, theta, x0, user_objective, "user model", "nothing beat the user's model on the estimation data",
            "n/a", 0)
    chosen = user
    if best["parent"] is not None:
        fits = [(s.fit(best["model"], best["theta"], best["x0"], data, s.fit_options.max_iters, s.expires),
                 "from its head optimum")]
        if not fits[0][0].cost <= user_objective and best["lifts"] is not None:
            th, x = theta, x0
            for lift in best["lifts"]:
                th, x = lift(th, x, data)
            fits.append((s.fit(best["model"], th, x, data, s.fit_options.max_iters, s.expires),
                         "from the user's optimum lifted into it"))
        for res, how in fits:
            obj = objective_of(free_run_errors(best["model"], res.theta, data, res.x0, s.iv))
            if obj <= min(user_objective, chosen[3]):
                chosen = (best["model"], res.theta, res.x0, obj, best["structure"],
                          f"refitted on all the estimation data {how}: {res.message}", str(res.status),
                          int(res.iterations))
        if chosen is user:
            chosen = user[:5] + (f"{best['structure']} refitted on all the estimation data did not reach the "
                                 "user's model's objective: the user's model is kept", "n/a", 0)
    mark = s.rows[0] if chosen[6] == "n/a" else best   # the chosen row, by identity ("n/a": the user's model kept)
    rows = [{**{k: v for k, v in r.items() if k not in ("model", "theta", "x0", "lifts", "parent", "moves")},
             "chosen": r is mark} for r in s.rows]
    m, th, x, obj, label, msg, status, its = chosen
    if s.capped:
        why += ("; the time limit cut the search (rows with status time_limit or not run): a faster machine or a "
                "larger time_limit can choose differently")
    return SearchResult(m, th, np.asarray(x, float), float(obj), label, rows, s.opts.criterion,
                        time.perf_counter() - t_all, msg + why, status, its, s.capped)
