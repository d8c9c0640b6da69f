"""Benchmark CE-EM on the paper's Lorenz problems (issue 2).

Problems: (a) single Lorenz, 4 trajectories; (b) six coupled Lorenz attractors (n = 18,
ny = 16) with 2, 4 and 8 trajectories. T = 128, sigma_v = 0.01, deterministic dynamics,
initial parameters within 10% of the truth (free entries only, seeded).

Reported per problem: ``epochs``, ``wall_s`` (the fit, excluding one-off solver construction,
which is ``build_s``), median ``smooth_s`` / ``learn_s`` per epoch, ``param_rel_err`` (max over
free entries of |est - true| / max(|true|, 1): relative for sigma, rho, beta; absolute for the
coupling entries of H, many of which are near zero), ``eps`` (paper's dynamics error, 1000
seeded draws) at the start and the end, and ``peak_rss_mb`` (this process and its workers);
the measured floor of one iteration in the same run (``scripts/_floor.py``, at the final states
and parameters): ``smooth_floor_s`` (one evaluation of all stage derivatives of all trajectories +
one banded factorisation and solve over all of them), ``learn_floor_s`` (one objective, gradient
and Gauss-Newton Hessian evaluation), ``floor_s`` = their sum and the ratios ``smooth_ratio`` =
smooth_s / smooth_floor_s, ``learn_ratio`` = learn_s / learn_floor_s.

    python -m scripts.bench_lorenz [--problems single,coupled2,coupled4,coupled8] [--json PATH]
                                   [--time-limit 300] [--acceleration squarem] [--n-jobs 2] [--peer]

With ``--peer`` the authors' published PyTorch implementation (PyPI ``ceem`` 0.0.4) runs on the
same data, initial parameters and initial state trajectories (ceem_casadi's EKF/RTS pass with
the initial parameters) in its own virtual environment, created on first use under
``$CEEM_CACHE/peer_venv`` (``--peer-venv``) with ``torch==2.13.0`` (CPU), ``scipy<1.11`` and
``numpy<2`` (see ``scripts/peer_ceem_runner.py`` for its configuration). For each problem it
prints both runs and ``speedup`` = (the peer's time to reach ceem_casadi's final eps, or its
whole run when it never does, shown as ">=") / ceem_casadi's wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import ceem_casadi as cc
from ceem_casadi.runtime._compile import cache_dir
from ceem_casadi.runtime._schema import ACCELERATIONS
from ceem_casadi.smoothing._initial_states import eks_states
from models import lorenz
from scripts._floor import learning_floor, smoothing_floor

PROBLEMS = {"single": (1, 4), "coupled2": (6, 2), "coupled4": (6, 4), "coupled8": (6, 8)}
# the model's sigma_w (the data are simulated without process noise). For the coupled problems
# 1e-3: at sigma_w = 1e-2 the maximiser of J itself (the CE-EM fixed point, reached by the joint
# Newton steps) has eps = 0.127 on seed 0 (coupled8), at 1e-3 it has eps = 0.086: with
# deterministic data the smaller sigma_w is the better-specified model.
PROCESS_STD = {"single": 1e-2, "coupled2": 1e-3, "coupled4": 1e-3, "coupled8": 1e-3}


def make_problem(name: str, seed: int = 0, process_std: float | None = None):
    """(model, data, theta_true, theta0) of a benchmark problem (seeded); ``process_std`` is the
    model's sigma_w (default ``PROCESS_STD[name]``)."""
    K, B = PROBLEMS[name]
    sw = PROCESS_STD[name] if process_std is None else process_std
    if K == 1:
        truth = dict(lorenz.TRUE)
        model = lorenz.single_lorenz(process_std=sw, measurement_std=0.01)
        masks = None
    else:
        truth, C = lorenz.coupled_truth(K, seed=seed)
        model = lorenz.coupled_lorenz(K, C, process_std=sw, measurement_std=0.01)
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


def run(name: str, *, seed: int, max_iters: int, time_limit: float, acceleration: str, n_jobs: int | None,
        eps_target: float | None = None, process_std: float | None = None,
        smoother_hessian: str = "gauss-newton", learner_hessian: str = "auto", rho_x: float = 0.0,
        smoother_solver: str | None = None) -> dict:
    """Fit one problem with CE-EM and return the benchmark record (see the module docstring).

    ``rho_x`` is the smoothing step's trust-region weight (paper eq. for x^(k); 0 = none);
    ``smoother_solver`` its ``SmootherOptions.solver`` (None: the library's choice)."""
    model, data, truth, theta0 = make_problem(name, seed, process_std)
    if n_jobs is None:  # processes pay off for the coupled problems' expensive smoothing only
        n_jobs = 1 if PROBLEMS[name][0] == 1 else 2
    eps0 = lorenz.dynamics_error(model, theta0, truth)
    trace = []
    t_start = [None]
    instrument = [0.0]  # time spent evaluating eps in the callback: not part of the fit

    def callback(rec):
        if t_start[0] is None:
            return None
        t_in = time.perf_counter()
        eps = lorenz.dynamics_error(model, rec.theta, truth)
        t_fit = t_in - t_start[0] - instrument[0]
        trace.append({"epoch": rec.iteration, "kind": rec.kind, "t_s": t_fit, "eps": eps, "J": rec.J,
                      "accepted": rec.accepted})
        instrument[0] += time.perf_counter() - t_in
        if t_fit > time_limit or (eps_target is not None and eps < eps_target):
            return False
        return None

    # build once (compiles stage functions on first use, cached on disk afterwards)
    opts = cc.CEEMOptions(max_iters=max_iters, acceleration=acceleration, n_jobs=n_jobs,
                          smoother=cc.SmootherOptions(hessian=smoother_hessian, rho_x=rho_x, solver=smoother_solver),
                          learner=cc.LearnerOptions(hessian=learner_hessian))
    t0 = time.perf_counter()
    smoother = cc.smoothing.Smoother(model, opts.smoother)
    learner = cc.learning.Learner(model, data.lengths, opts.learner, smoother.stages)
    smoother.for_length(lorenz.HORIZON)
    if acceleration == "newton":  # compile the joint step's stage Jacobians before the clock starts
        smoother.stages.get("obs_res_jac_x", "dyn_res_jac_z", "dyn_p_jac")
    build_s = time.perf_counter() - t0
    # the initial state trajectories (EKF + RTS with theta0) are computed outside the clock: the
    # peer receives the same ones (run_peer) and does not pay for them either
    t0 = time.perf_counter()
    x_init = eks_states(model, model.theta_vector(theta0), data)
    init_s = time.perf_counter() - t0
    t_start[0] = time.perf_counter()
    res = cc.ceem(model, data, theta0, options=opts, callback=callback, smoother=smoother, learner=learner,
                  x_init=x_init)
    # res.build_s: solvers built inside ceem (the trace's times include it: negligible when prebuilt)
    wall = time.perf_counter() - t_start[0] - res.build_s - instrument[0]
    em = [r for r in res.history if r.kind == "em"]
    newton = [r for r in res.history if r.kind == "newton"]
    med = lambda v: float(np.median(v)) if v else float("nan")  # noqa: E731
    theta_vec = model.theta_vector(res.theta)
    fs = smoothing_floor(smoother.stages, theta_vec, data, res.x, rho_x)
    fl = learning_floor(smoother.stages, theta_vec, data, res.x, hessian=learner.hessian != "limited-memory")
    smooth_s, learn_s = med([r.smooth_s for r in em]), med([r.learn_s for r in em])
    return {
        "problem": name, "trajectories": len(data), "epochs": res.iterations, "status": res.status,
        "em_steps": len(em), "newton_steps": len(newton),
        "wall_s": wall, "build_s": build_s + res.build_s, "init_s": init_s,
        "smooth_s": smooth_s, "learn_s": learn_s,
        "newton_s": med([r.learn_s for r in newton]),
        "smooth_floor_s": fs, "learn_floor_s": fl, "floor_s": fs + fl,
        "smooth_ratio": smooth_s / fs, "learn_ratio": learn_s / fl,
        "param_rel_err": param_error(model, res.theta, truth), "eps0": eps0,
        "eps": lorenz.dynamics_error(model, res.theta, truth), "peak_rss_mb": peak_rss_mb(),
        "acceleration": acceleration, "n_jobs": n_jobs, "smoother_hessian": smoother_hessian,
        "learner_hessian": learner_hessian, "rho_x": rho_x, "smoother_solver": smoother_solver or "auto",
        "trace": trace,
    }


# --- the authors' implementation as a peer -------------------------------------------------
PEER_REQUIREMENTS = ("torch==2.13.0", "ceem==0.0.4", "scipy<1.11", "numpy<2")
PEER_RUNNER = Path(__file__).with_name("peer_ceem_runner.py")


def peer_python(venv: Path) -> Path:
    """The peer venv's interpreter, creating the venv (once) when it does not import ceem."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import torch, ceem.ceem"]
    if py.exists() and subprocess.run(probe, capture_output=True, cwd=tempfile.gettempdir()).returncode == 0:
        return py
    print(f"creating the peer environment in {venv} ({', '.join(PEER_REQUIREMENTS)}) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS], check=True)
    subprocess.run(probe, check=True, cwd=tempfile.gettempdir())
    return py


def run_peer(name: str, *, seed: int, max_epochs: int, time_limit: float, eps_target: float | None,
             python: Path, process_std: float | None = None) -> dict:
    """The peer on problem ``name``: same data, initial parameters and initial states."""
    model, data, truth, theta0 = make_problem(name, seed, process_std)
    K = model.nx // 3
    x_init = eks_states(model, model.theta_vector(theta0), data)
    x_eps = lorenz.initial_states(1000, K, seed=0)
    f_true = np.asarray(model.rhs.map(1000)(x_eps.T, np.zeros((0, 1000)), model.theta_vector(truth))).T
    C = _observation_matrix(model)
    arr = lambda v: np.atleast_1d(np.asarray(v, float))  # noqa: E731
    payload = dict(y=np.stack(data.y), C=C, x_init=np.stack(x_init), sigma0=arr(theta0["sigma"]),
                   rho0=arr(theta0["rho"]), beta0=arr(theta0["beta"]),
                   H0=np.asarray(theta0.get("H", np.zeros((3, 3))), float),
                   H_free=lorenz.coupling_mask(K), x_eps=x_eps, f_true=f_true, dt=lorenz.DT,
                   sigma_v=model.noise.measurement_std[0], sigma_w=model.noise.process_std[0],
                   time_limit=time_limit, max_epochs=max_epochs,
                   eps_target=np.nan if eps_target is None else eps_target)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "problem.npz", Path(tmp) / "result.json"
        np.savez(src, **payload)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "2")
        proc = subprocess.run([str(python), str(PEER_RUNNER), str(src), str(dst)], capture_output=True,
                              text=True, cwd=tmp, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"peer run failed on {name}:\n{proc.stderr[-3000:]}")
        out = json.loads(dst.read_text())
    final = out["trace"][-1] if out["trace"] else {"eps": float("nan"), "theta": theta0}
    return {"problem": name, "trajectories": len(data), "epochs": out["epochs"], "wall_s": out["wall_s"],
            "epoch_s": out["wall_s"] / max(out["epochs"], 1), "eps": final["eps"],
            "param_rel_err": param_error(model, final["theta"], truth), "stop_reason": out["stop_reason"],
            "trace": [{k: r[k] for k in ("epoch", "t_s", "eps")} for r in out["trace"]]}


def _observation_matrix(model) -> np.ndarray:
    """C of the linear observation y = C x (the Lorenz models' known matrix)."""
    n = model.nx
    return np.asarray(model.g.map(n)(np.eye(n), np.zeros((model.nu, n)), np.zeros(model.params.size)))


def compare(ours: dict, peer: dict) -> dict:
    """Speed-up at equal error: the peer's time to reach our final eps over our wall time."""
    reached = [r["t_s"] for r in peer["trace"] if r["eps"] <= ours["eps"]]
    peer_time = reached[0] if reached else peer["wall_s"]
    return {"peer_time_to_our_eps_s": peer_time if reached else None, "peer_reached_our_eps": bool(reached),
            "speedup": peer_time / ours["wall_s"], "speedup_is_lower_bound": not reached}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="CE-EM benchmark on the paper's Lorenz problems")
    ap.add_argument("--problems", default="single,coupled2,coupled4,coupled8")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-iters", type=int, default=200)
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds per problem (fit only)")
    ap.add_argument("--eps-target", type=float, default=None, help="stop a run once eps is below this")
    ap.add_argument("--acceleration", choices=list(ACCELERATIONS), default="newton")
    ap.add_argument("--n-jobs", type=int, default=None, help="smoothing processes (default: 1 single, 2 coupled)")
    ap.add_argument("--process-std", type=float, default=None,
                    help="the model's sigma_w (default: 1e-2 single, 1e-3 coupled; see PROCESS_STD)")
    ap.add_argument("--smoother-hessian", choices=["gauss-newton", "exact"], default="gauss-newton",
                    help="the smoothing NLP's Hessian (the default was chosen with this benchmark)")
    ap.add_argument("--learner-hessian", choices=["auto", "exact", "gauss-newton", "limited-memory"],
                    default="auto", help="the learning NLP's Hessian")
    ap.add_argument("--smoother-solver", default="auto", choices=["auto", "ipopt", "banded", "batched"],
                    help="SmootherOptions.solver (auto = the library's choice)")
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    ap.add_argument("--smoke", action="store_true", help="single Lorenz, 3 epochs (for CI)")
    ap.add_argument("--peer", action="store_true",
                    help="also run the authors' ceem 0.0.4 (PyTorch) on the same problems, in its own venv")
    ap.add_argument("--peer-venv", default=None, help="the peer's venv (default: $CEEM_CACHE/peer_venv)")
    ap.add_argument("--peer-time-limit", type=float, default=None,
                    help="seconds per problem for the peer (default: --time-limit)")
    args = ap.parse_args(argv)
    peer_py = None
    if args.peer:
        peer_py = peer_python(Path(args.peer_venv) if args.peer_venv else cache_dir() / "peer_venv")
    names = ["single"] if args.smoke else args.problems.split(",")
    rows = []
    for name in names:
        if name not in PROBLEMS:
            ap.error(f"unknown problem {name!r}; choose from {sorted(PROBLEMS)}")
        row = run(name, seed=args.seed, max_iters=3 if args.smoke else args.max_iters,
                  time_limit=args.time_limit, acceleration=args.acceleration, n_jobs=args.n_jobs,
                  eps_target=args.eps_target, process_std=args.process_std,
                  smoother_hessian=args.smoother_hessian, learner_hessian=args.learner_hessian,
                  smoother_solver=None if args.smoother_solver == "auto" else args.smoother_solver)
        rows.append(row)
        print(f"{row['problem']:>9} [{row['smoother_solver']}] B={row['trajectories']} epochs={row['epochs']:3d} ({row['em_steps']} EM, "
              f"{row['newton_steps']} joint) wall={row['wall_s']:7.2f}s build={row['build_s']:5.1f}s "
              f"smooth/EM={row['smooth_s']:.3f}s learn/EM={row['learn_s']:.3f}s joint={row['newton_s']:.3f}s "
              f"param_err={row['param_rel_err']:.2e} eps {row['eps0']:.3g} -> {row['eps']:.3g} "
              f"rss={row['peak_rss_mb']:.0f}MB [{row['status']}]", flush=True)
        print(f"{'floor':>9} smooth {row['smooth_s']:.3f} / {row['smooth_floor_s']:.3f} s = {row['smooth_ratio']:.2f}x, "
              f"learn {row['learn_s']:.3f} / {row['learn_floor_s']:.3f} s = {row['learn_ratio']:.2f}x", flush=True)
        assert np.isfinite(row["eps"]) and np.isfinite(row["wall_s"])
        if peer_py is not None:
            peer = run_peer(name, seed=args.seed, max_epochs=3 if args.smoke else 5000,
                            time_limit=args.peer_time_limit or args.time_limit, eps_target=args.eps_target,
                            python=peer_py, process_std=args.process_std)
            row["peer"] = peer
            row.update(compare(row, peer))
            print(f"{'peer':>9} B={peer['trajectories']} epochs={peer['epochs']:3d} wall={peer['wall_s']:7.1f}s "
                  f"per epoch={peer['epoch_s']:.3f}s param_err={peer['param_rel_err']:.2e} eps -> {peer['eps']:.3g} "
                  f"[{peer['stop_reason']}]  speedup {'>=' if row['speedup_is_lower_bound'] else ''}"
                  f"{row['speedup']:.1f}x (per epoch {peer['epoch_s'] / (row['wall_s'] / max(row['epochs'], 1)):.1f}x)",
                  flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": {"cores": 2}, "results": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
