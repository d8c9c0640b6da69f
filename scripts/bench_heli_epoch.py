"""One CE-EM epoch of the helicopter NL model at the real size, timed step by step.

Stand-in data (SYNTHETIC, ``scripts/heli_standin.py``) of the real size: 466 training
trajectories x 500 steps, nx = 10, nu = 10, ny = 6, MLP head 20 -> 32 -> 32 -> 6 (2,246
parameters). The targets are the normalised stand-in outputs (the residual of a naive model
has the same shape and scale; only the timing matters here). Warm start as in the pipeline:
N4SID (nx = 10) on ``--sid-size`` trajectories, head output layer zero, initial states by EKF + RTS.

Timed separately (seconds, JSON):
- ``smoothing``: the E-step, every trajectory by the smoother of ``--smoother-solver`` (default
  ``auto``: the library's choice, batched Newton steps for these 466 equal-length trajectories,
  the head's observation terms by numpy from the column-wise ``observe`` as the Adam learner
  takes it: ``Smoother(observe=...)``; ``--scalar-head``: by the compiled scalar programs);
  sequential, per trajectory mean/max and total), at the parameters after one learning step, warm-started
  at the previous states (``smoothing_first``: the first E-step from the EKF + RTS states, which
  are already optimal for the linear warm start; solver build there);
- ``learning_adam``: the M-step by `ceem_casadi.learning.AdamLearner` (``--adam-epochs``
  passes of mini-batches of 512 over all 233,000 samples, paper learning rates);
- ``learning_ipopt``: the generic IPOPT learner (limited-memory Hessian) on ``--ipopt-traj``
  trajectories for ``--ipopt-iters`` iterations, with the per-iteration time extrapolated
  linearly in the number of samples to the full size;
- ``epoch``: one complete ``ceem()`` iteration (smoothing with ``--n-jobs`` processes +
  Adam learning + the J evaluations), wall clock;
- ``floor``: the measured floor of each phase in the same run (``scripts/_floor.py``): one
  evaluation of every stage derivative of all trajectories + one banded factorisation and solve
  over all of them (smoothing), one full-batch objective + gradient evaluation over all 233,000
  stages by the Adam learner's own (matrix-valued) functions (learning: Adam needs no Hessian;
  an Adam epoch makes the same number of sample evaluations in mini-batches), with ``floor_s``,
  the phase time and their ``ratio`` (``smoothing_cpu``: the same in this process's CPU seconds,
  phase and floor, which a machine shared with other jobs disturbs far less than wall times);
- ``smoothing_ipopt_subset``: the IPOPT smoother on the first ``--ipopt-subset`` trajectories of
  the same step (per-trajectory time beside the batched smoother's, max state difference).

Run: ``python -m scripts.bench_heli_epoch --out results/bench_heli_epoch`` (a few minutes on 2
cores); ``--smoke`` is a tiny run that checks the outputs.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from ceem_casadi.baselines._n4sid import n4sid
from ceem_casadi.em._ceem import ceem
from ceem_casadi.em._options import CEEMOptions
from ceem_casadi.io._data import Trajectories
from ceem_casadi.learning import AdamLearner, AdamOptions
from ceem_casadi.learning._learner import Learner
from ceem_casadi.learning._options import LearnerOptions
from ceem_casadi.smoothing._initial_states import eks_states
from ceem_casadi.smoothing._options import SmootherOptions
from ceem_casadi.smoothing._smoother import Smoother
from models.helicopter import batch_functions, heli_model, linear_theta
from scripts import heli_convert, heli_standin
from scripts._floor import best_time, floor_row, format_floor, smoothing_floor

log = logging.getLogger(__name__)
RHO = 0.5           # rho_x = rho_theta (paper)


def main(argv=None):
    """Parse the arguments and run the benchmark with one BLAS thread (as ``ceem()`` does by
    default: multi-threaded BLAS on shared cores slows the banded factorisations ~70x)."""
    with threadpool_limits(limits=1, user_api="blas"):
        return _main(argv)


def _main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench_heli_epoch")
    ap.add_argument("--n-train", type=int, default=466)
    ap.add_argument("--T", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sid-size", type=int, default=100)
    ap.add_argument("--adam-epochs", type=int, default=1, help="Adam passes per learning step")
    ap.add_argument("--ipopt-traj", type=int, default=10, help="trajectories of the IPOPT learner timing")
    ap.add_argument("--ipopt-iters", type=int, default=20)
    ap.add_argument("--n-jobs", type=int, default=2, help="smoothing processes in the ceem() epoch")
    ap.add_argument("--skip-epoch", action="store_true", help="no complete ceem() iteration")
    ap.add_argument("--smoother-solver", default="auto", choices=("auto", "ipopt", "banded", "batched"),
                    help="SmootherOptions.solver of the timed smoothing steps and the epoch (auto = None)")
    ap.add_argument("--ipopt-subset", type=int, default=20,
                    help="trajectories re-smoothed by IPOPT in the same run for comparison (0 = none)")
    ap.add_argument("--mapped", action="store_true",
                    help="Adam learner on model.g.map/model.f.map instead of the matrix-valued model functions")
    ap.add_argument("--smoke", action="store_true", help="tiny run (6 x 100 steps)")
    ap.add_argument("--scalar-head", action="store_true",
                    help="smoother without observe=: the head's terms by the compiled scalar stage programs")
    a = ap.parse_args(argv)
    if a.smoke:
        a.n_train, a.T, a.sid_size, a.ipopt_traj, a.ipopt_iters, a.ipopt_subset = 6, 100, 6, 2, 5, 3
    solver = None if a.smoother_solver == "auto" else a.smoother_solver
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"synthetic_standin": True, "args": vars(a),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "note": "shared machine (several agents on 2 cores): times are noisy"}}
    t = time.perf_counter()
    root = heli_standin.write(out / "standin", a.n_train, 1, 1, a.T, seed=a.seed)
    d = heli_convert.read_folder(root)
    y, u = d["train_y"], d["train_u"]
    data = Trajectories(list(y), list(u))
    res["data_s"] = time.perf_counter() - t
    res["samples"] = {"observation": int(y.shape[0] * y.shape[1]), "dynamics": int(y.shape[0] * (y.shape[1] - 1))}

    model, theta0, head = heli_model(seed=a.seed)
    step, observe = batch_functions(head)
    t = time.perf_counter()
    fit = n4sid([(y[i], u[i]) for i in range(min(a.sid_size, len(y)))], order=10)
    theta = model.theta_vector(linear_theta(theta0, fit.A, fit.B, fit.C, fit.D))
    res["sid_s"] = time.perf_counter() - t
    t = time.perf_counter()
    xs = eks_states(model, theta, data)
    res["eks_init_s"] = time.perf_counter() - t
    res["n_parameters"] = int(model.params.size)

    # smoothing step (sequential) -----------------------------------------------------------------
    t = time.perf_counter()
    sm = Smoother(model, SmootherOptions(rho_x=RHO, solver=solver), observe=None if a.scalar_head else observe)
    sm.for_length(a.T)
    smoother_build = time.perf_counter() - t

    costs2 = []

    def smooth(th, x_init):
        t0, c0 = time.perf_counter(), time.process_time()
        sres = sm.solve(th, data, x_init)
        cpu = time.process_time() - c0
        walls = np.array([r.wall_s for r in sres])
        costs2[:] = [r.cost for r in sres]
        return [r.x for r in sres], {
            "total_s": time.perf_counter() - t0, "total_cpu_s": cpu, "per_trajectory_mean_s": float(walls.mean()),
            "per_trajectory_max_s": float(walls.max()),
            "ipopt_iterations_mean": float(np.mean([r.iterations for r in sres])),
            "ipopt_iterations_max": int(max(r.iterations for r in sres)),
            "statuses": sorted({r.status for r in sres})}

    # epoch 1 starts at the EKF + RTS states of theta0, which for the linear warm start (head
    # output zero) already are the MAP states: this smoothing step is nearly free
    xs1, res["smoothing_first"] = smooth(theta, xs)
    res["smoothing_first"]["build_s"] = smoother_build
    print(json.dumps({"smoothing_first": res["smoothing_first"]}), flush=True)

    # learning step by Adam -------------------------------------------------------------------------
    t = time.perf_counter()
    al = AdamLearner(model, AdamOptions(rho_theta=RHO, epochs=a.adam_epochs, seed=a.seed),
                     **({} if a.mapped else {"step": step, "observe": observe}))
    lr = al.solve(theta, data, xs1)         # first call builds the batch Functions
    first = time.perf_counter() - t
    F0 = al.objective(theta, data, xs1)
    res["learning_adam"] = {"first_call_s": first, "solve_s": lr.wall_s, "steps": lr.iterations,
                            "F_start": F0, "F_after": lr.cost, "status": lr.status}
    print(json.dumps({"learning_adam": res["learning_adam"]}), flush=True)
    theta1 = lr.theta_vec

    # the representative smoothing step: new theta, warm start at the previous states
    xs2, res["smoothing"] = smooth(theta1, xs1)
    print(json.dumps({"smoothing": res["smoothing"]}), flush=True)

    # the same step by the IPOPT smoother on a subset (a peer in the same run)
    if a.ipopt_subset:
        nb = min(a.ipopt_subset, len(y))
        ip = Smoother(model, SmootherOptions(rho_x=RHO, solver="ipopt"), stages=sm.stages)
        ip.for_length(a.T)
        t = time.perf_counter()
        ires = ip.solve(theta1, data[:nb], xs1[:nb])
        wall = time.perf_counter() - t
        res["smoothing_ipopt_subset"] = {
            "trajectories": nb, "total_s": wall, "per_trajectory_s": wall / nb,
            "per_trajectory_s_default_solver": res["smoothing"]["total_s"] / len(y),
            "iterations_mean": float(np.mean([r.iterations for r in ires])),
            "max_abs_state_difference": float(max(np.abs(r.x - x).max() for r, x in zip(ires, xs2))),
            "max_rel_cost_difference": float(max(abs(r.cost - c) / abs(r.cost) for r, c in zip(ires, costs2)))}
        print(json.dumps({"smoothing_ipopt_subset": res["smoothing_ipopt_subset"]}), flush=True)

    # the floors of the two phases, same run -------------------------------------------------------
    fs = smoothing_floor(sm.stages, theta1, data, xs1, RHO, observe=sm.observe)
    fs_cpu = smoothing_floor(sm.stages, theta1, data, xs1, RHO, clock=time.process_time, observe=sm.observe)
    fl = best_time([lambda: al.objective(theta, data, xs1, gradient=True)], repeats=2)
    res["floor"] = {"smoothing": floor_row(res["smoothing"]["total_s"], fs, res["smoothing"]["ipopt_iterations_mean"]),
                    "smoothing_cpu": floor_row(res["smoothing"]["total_cpu_s"], fs_cpu,
                                               res["smoothing"]["ipopt_iterations_mean"]),
                    "learning_adam": floor_row(lr.wall_s, fl)}
    for k, row in res["floor"].items():
        print(format_floor(k, row), flush=True)

    # learning step by the generic IPOPT learner on a subset ----------------------------------------
    nb = min(a.ipopt_traj, len(y))
    sub = Trajectories(list(y[:nb]), list(u[:nb]))
    t = time.perf_counter()
    le = Learner(model, sub.lengths, LearnerOptions(rho_theta=RHO, hessian="limited-memory",
                                                    max_iters=a.ipopt_iters, tol=1e-12), sm.stages)
    build = time.perf_counter() - t
    li = le.solve(theta, sub, xs1[:nb])
    per_iter = li.wall_s / max(li.iterations, 1)
    res["learning_ipopt"] = {"trajectories": nb, "build_s": build, "solve_s": li.wall_s,
                             "iterations": li.iterations, "status": li.status, "per_iteration_s": per_iter,
                             "per_iteration_full_size_s_extrapolated": per_iter * len(y) / nb}
    print(json.dumps({"learning_ipopt": res["learning_ipopt"]}), flush=True)

    # one complete CE-EM iteration -----------------------------------------------------------------
    if not a.skip_epoch:
        opts = CEEMOptions(max_iters=1, n_jobs=a.n_jobs, smoother=SmootherOptions(rho_x=RHO, solver=solver),
                           learner=LearnerOptions(rho_theta=RHO))
        t = time.perf_counter()
        fit = ceem(model, data, model.params.from_vector(theta1), options=opts, x_init=xs1,
                   smoother=sm, learner=al)
        rec = fit.history[0] if fit.history else None
        res["epoch"] = {"wall_s": time.perf_counter() - t, "n_jobs": a.n_jobs, "status": fit.status,
                        "smooth_s_summed_over_trajectories": None if rec is None else rec.smooth_s,
                        "learn_s": None if rec is None else rec.learn_s,
                        "J_start": fit.init_J, "J_after": fit.J}
        print(json.dumps({"epoch": res["epoch"]}), flush=True)
        smooth_epoch = res["epoch"]["smooth_s_summed_over_trajectories"]
        if smooth_epoch is not None:  # summed over the processes' trajectories: CPU-like seconds
            res["floor"]["epoch_smoothing_summed"] = floor_row(smooth_epoch, fs)
            res["floor"]["epoch_learning"] = floor_row(res["epoch"]["learn_s"], fl)
            for k in ("epoch_smoothing_summed", "epoch_learning"):
                print(format_floor(k, res["floor"][k]), flush=True)

    (out / "bench_heli_epoch.json").write_text(json.dumps(res, indent=2))
    if a.smoke:
        flat = [res["smoothing"]["total_s"], res["learning_adam"]["solve_s"], res["learning_ipopt"]["solve_s"]]
        assert all(np.all(np.isfinite(x)) for x in xs2)
        assert all(np.isfinite(v) and v > 0 for v in flat), flat
        assert res["learning_adam"]["F_after"] <= F0
    return res


if __name__ == "__main__":
    main()
