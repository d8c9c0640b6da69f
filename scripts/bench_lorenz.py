"""Benchmark CE-EM on the paper's Lorenz problems (issue 2).

Problems: (a) single Lorenz, 4 trajectories; (b) six coupled Lorenz attractors (n = 18,
ny = 16) with 2, 4 and 8 trajectories. T = 128, sigma_v = 0.01, deterministic dynamics,
initial parameters within 10% of the truth (free entries only, seeded).

Reported per problem: ``epochs``, ``wall_s`` (the fit, excluding one-off solver construction,
which is ``build_s``), median ``smooth_s`` / ``learn_s`` per epoch, ``param_rel_err`` (max over
free entries of |est - true| / max(|true|, 1): relative for sigma, rho, beta; absolute for the
coupling entries of H, many of which are near zero), ``eps`` (paper's dynamics error, 1000
seeded draws) at the start and the end, and ``peak_rss_mb`` (this process and its workers).

    python -m scripts.bench_lorenz [--problems single,coupled2,coupled4,coupled8] [--json PATH]
                                   [--time-limit 300] [--acceleration squarem] [--n-jobs 2]
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

import ceem_casadi as cc
from models import lorenz

PROBLEMS = {"single": (1, 4), "coupled2": (6, 2), "coupled4": (6, 4), "coupled8": (6, 8)}


def make_problem(name: str, seed: int = 0):
    """(model, data, theta_true, theta0) of a benchmark problem (seeded)."""
    K, B = PROBLEMS[name]
    if K == 1:
        truth = dict(lorenz.TRUE)
        model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
        masks = None
    else:
        truth, C = lorenz.coupled_truth(K, seed=seed)
        model = lorenz.coupled_lorenz(K, C, process_std=0.01, measurement_std=0.01)
        masks = {"H": lorenz.coupling_mask(K)}
    data, _ = cc.simulate(model, truth, lorenz.initial_states(B, K, seed=seed + 1), lorenz.HORIZON,
                          measurement_std=0.01, seed=seed + 2)
    theta0 = lorenz.perturbed(truth, 0.1, seed=seed + 3, free_masks=masks)
    return model, data, truth, theta0


def param_error(model, theta, truth) -> float:
    est, tru = model.theta_vector(theta), model.theta_vector(truth)
    free = model.params.free_index
    return float(np.max(np.abs(est[free] - tru[free]) / np.maximum(np.abs(tru[free]), 1.0)))


def peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024.0


def run(name: str, *, seed: int, max_iters: int, time_limit: float, acceleration: str, n_jobs: int,
        eps_target: float | None = None) -> dict:
    model, data, truth, theta0 = make_problem(name, seed)
    eps0 = lorenz.dynamics_error(model, theta0, truth)
    trace = []
    t_start = [None]

    def callback(rec):
        if t_start[0] is None:
            return None
        eps = lorenz.dynamics_error(model, rec.theta, truth)
        trace.append({"epoch": rec.iteration, "t_s": time.perf_counter() - t_start[0], "eps": eps, "J": rec.J,
                      "accepted": rec.accepted})
        if time.perf_counter() - t_start[0] > time_limit or (eps_target is not None and eps < eps_target):
            return False
        return None

    # build once (compiles stage functions on first use, cached on disk afterwards)
    opts = cc.CEEMOptions(max_iters=max_iters, acceleration=acceleration, n_jobs=n_jobs)
    t0 = time.perf_counter()
    smoother = cc.Smoother(model, opts.smoother)
    learner = cc.Learner(model, data.lengths, opts.learner, smoother.stages)
    smoother.for_length(lorenz.HORIZON)
    build_s = time.perf_counter() - t0
    t_start[0] = time.perf_counter()
    res = cc.ceem(model, data, theta0, options=opts, callback=callback, smoother=smoother, learner=learner)
    wall = time.perf_counter() - t_start[0]
    return {
        "problem": name, "trajectories": len(data), "epochs": res.iterations, "status": res.status,
        "wall_s": wall, "build_s": build_s + res.build_s,
        "smooth_s": float(np.median([r.smooth_s for r in res.history])) if res.history else float("nan"),
        "learn_s": float(np.median([r.learn_s for r in res.history])) if res.history else float("nan"),
        "param_rel_err": param_error(model, res.theta, truth), "eps0": eps0,
        "eps": lorenz.dynamics_error(model, res.theta, truth), "peak_rss_mb": peak_rss_mb(),
        "acceleration": acceleration, "n_jobs": n_jobs, "trace": trace,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="CE-EM benchmark on the paper's Lorenz problems")
    ap.add_argument("--problems", default="single,coupled2,coupled4,coupled8")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-iters", type=int, default=200)
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds per problem (fit only)")
    ap.add_argument("--eps-target", type=float, default=None, help="stop a run once eps is below this")
    ap.add_argument("--acceleration", choices=["none", "squarem"], default="squarem")
    ap.add_argument("--n-jobs", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    ap.add_argument("--smoke", action="store_true", help="single Lorenz, 3 epochs (for CI)")
    args = ap.parse_args(argv)
    names = ["single"] if args.smoke else args.problems.split(",")
    rows = []
    for name in names:
        if name not in PROBLEMS:
            ap.error(f"unknown problem {name!r}; choose from {sorted(PROBLEMS)}")
        row = run(name, seed=args.seed, max_iters=3 if args.smoke else args.max_iters,
                  time_limit=args.time_limit, acceleration=args.acceleration, n_jobs=args.n_jobs,
                  eps_target=args.eps_target)
        rows.append(row)
        print(f"{row['problem']:>9} B={row['trajectories']} epochs={row['epochs']:3d} wall={row['wall_s']:7.1f}s "
              f"build={row['build_s']:5.1f}s smooth/epoch={row['smooth_s']:.3f}s learn/epoch={row['learn_s']:.3f}s "
              f"param_err={row['param_rel_err']:.2e} eps {row['eps0']:.3g} -> {row['eps']:.3g} "
              f"rss={row['peak_rss_mb']:.0f}MB [{row['status']}]", flush=True)
        assert np.isfinite(row["eps"]) and np.isfinite(row["wall_s"])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": {"cores": 2}, "results": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
