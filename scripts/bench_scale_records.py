"""Long single records (issue 17, part (a) of ``scripts/bench_scale.py``): CE-EM on ONE trajectory
of T = 10^3 ... 10^6 samples; fit time, time per EM iteration and peak RSS.

Models: ``lorenz`` (single Lorenz, paper section 4.1: y = (x1, x3) + noise, sigma_v = sigma_w =
0.01, dt = 0.04) and ``wh33`` (6 states: ``models/block_oriented.wiener_hammerstein(3, 3)``, two
3rd-order linear blocks around a cubic polynomial, 15 free parameters, input a seeded Gaussian
sequence, sigma_w = 0.01, sigma_v = 0.02). ``block6`` (not run by default) is the earlier
stand-in (two cascaded first-order-section chains with a tanh between them, 3 free parameters),
kept to compare with the figures measured with it. Initial parameters
10 % from the truth (seeded); ``acceleration="newton"`` (joint Gauss-Newton steps after the first EM
step; ``--acceleration none`` is Algorithm 1) until ``tol`` or ``max_iters``.

Every run is a fresh Python subprocess, so its peak RSS (``os.wait4`` rusage of that child, in
MB) is the peak of that run alone: data simulation, solver construction, EKF/RTS
initialisation and the fit. Reported per row: ``model``, ``T``, ``fit_s`` (the whole
``cc.ceem`` call: solver construction, initial states, EM iterations), ``iterations``,
``s_per_iteration`` (median time of one iteration: smoothing + learning, or one joint step), ``build_s``,
``peak_rss_mb``, ``J`` (final joint log-density), ``theta_err`` (max over free entries of
|est - true| / max(|true|, 1)) and ``status``; and the measured floor of one iteration in the same
process after the fit (``scripts/_floor.py``, at the final states and parameters):
``smooth_floor_s`` (one evaluation of all stage derivatives + one banded factorisation and solve),
``learn_floor_s`` (one objective, gradient and Gauss-Newton Hessian evaluation), ``floor_s``
(their sum), the median ``smooth_s`` / ``learn_s`` of the EM iterations and of the joint Newton
steps (``joint_s``), and the ratios ``ratio`` = s_per_iteration / floor_s, ``smooth_ratio``,
``learn_ratio``.

    python -m scripts.bench_scale_records [--lengths 1000,10000,100000,1000000]
                                          [--models lorenz,wh33] [--json PATH|-] [--smoke]
                                          [--acceleration newton|none|squarem] [--max-iters 30]
                                          [--smoother-solver auto|ipopt|banded]

``--smoke``: T = 200 and 400, two iterations (a few seconds; tests). Timings on a shared machine
are noisy: compare rows of the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("lorenz", "wh33")
LENGTHS = (10**3, 10**4, 10**5, 10**6)
SMOKE_LENGTHS = (200, 400)


# --- the 6-state block model ------------------------------------------------------------------
def _block6_standin():
    """(model, truth): x1..x3 = a1-pole chain driven by u, v = tanh(k x3), x4..x6 = a2-pole chain
    driven by v, y = x6 (plus noise). Parameters a1, a2, k, b (input gain)."""
    import casadi as ca

    import ceem_casadi as cc

    truth = {"a1": 0.6, "a2": 0.5, "k": 1.5, "b": 0.8}
    params = cc.Parameters(cc.Param("a1", truth["a1"], lower=0.0, upper=0.99),
                           cc.Param("a2", truth["a2"], lower=0.0, upper=0.99),
                           cc.Param("k", truth["k"], lower=0.0), cc.Param("b", truth["b"], free=False))  # b, k: only the product is well determined

    def step(x, u, p):
        v = ca.tanh(p.k * x[2])
        return ca.vertcat(p.a1 * x[0] + p.b * u[0], p.a1 * x[1] + (1 - p.a1) * x[0],
                          p.a1 * x[2] + (1 - p.a1) * x[1], p.a2 * x[3] + v,
                          p.a2 * x[4] + (1 - p.a2) * x[3], p.a2 * x[5] + (1 - p.a2) * x[4])

    model = cc.StateSpaceModel.from_discrete(step, lambda x, u, p: x[5:6], nx=6, nu=1, params=params,
                                             process_std=0.01, measurement_std=0.02, name="block6_standin")
    return model, truth


SIM_CHUNK = 10_000


def simulate_long(model, truth, x0, T: int, *, u=None, process_std=0.0, measurement_std=0.0, seed=0):
    """``cc.simulate`` of one record in chunks of ``SIM_CHUNK`` samples, each continuing from the
    last state of the previous one (seeds ``seed + k``): one rollout over T = 10^6 would unroll a
    mapaccum of 10^6 calls (GBs). Returns ``(data, x (T, nx))``."""
    import ceem_casadi as cc

    ys, xs, start, k = [], [], np.asarray(x0, float).reshape(1, -1), 0
    while sum(len(x) for x in xs) < T:
        done = sum(len(x) for x in xs)
        n = min(SIM_CHUNK, T - done) + (1 if xs else 0)  # later chunks repeat their start state
        uk = None if u is None else [u[max(done - 1, 0) if xs else 0:][:n]]
        d, x = cc.simulate(model, truth, start, n, u=uk, process_std=process_std,
                           measurement_std=measurement_std, seed=seed + k)
        skip = 1 if xs else 0
        ys.append(d.y[0][skip:]), xs.append(x[0][skip:])
        start, k = x[0][-1:], k + 1
    return cc.Trajectories([np.vstack(ys)], None if u is None else [u]), np.vstack(xs)


def _wh33():
    """(model, truth): ``models/block_oriented.wiener_hammerstein(3, 3)`` (cubic polynomial f,
    G1 without, G2 with feedthrough; 6 states, 15 free parameters) at the demo's truth."""
    from ceem_casadi.model._block_oriented import wiener_hammerstein
    from scripts.block_oriented_demo import TRUTH

    return wiener_hammerstein(3, 3, theta0=TRUTH, scale=2.0, process_std=0.01, measurement_std=0.02), dict(TRUTH)


def make_problem(name: str, T: int, seed: int = 0, with_states: bool = False):
    """(model, data, truth, theta0) of one benchmark record (seeded); ``with_states``: and the
    simulated states (T, nx)."""
    from models import lorenz

    if name == "lorenz":
        model = lorenz.single_lorenz(process_std=1e-2, measurement_std=1e-2)
        truth = dict(lorenz.TRUE)
        data, x = simulate_long(model, truth, lorenz.initial_states(1, seed=seed + 1), T,
                                measurement_std=0.01, seed=seed + 2)
    elif name in ("block6", "wh33"):
        model, truth = _block6_standin() if name == "block6" else _wh33()
        u = np.random.default_rng(seed + 1).standard_normal((T, 1))
        data, x = simulate_long(model, truth, np.zeros((1, 6)), T, u=u, process_std=0.01,
                                measurement_std=0.02, seed=seed + 2)
    else:
        raise ValueError(f"model must be one of {MODELS} or block6, got {name!r}")
    theta0 = lorenz.perturbed(truth, 0.1, seed=seed + 3)
    if name == "wh33":  # g1_num[0] = 1 is fixed (the gain normalisation): keep it
        theta0["g1_num"][0] = 1.0
    return (model, data, truth, theta0) + ((x,) if with_states else ())


def theta_error(model, theta, truth) -> float:
    est, tru = model.theta_vector(theta), model.theta_vector(truth)
    free = model.params.free_index
    return float(np.max(np.abs(est[free] - tru[free]) / np.maximum(np.abs(tru[free]), 1.0)))


def run_one(name: str, T: int, max_iters: int = 30, acceleration: str = "newton", seed: int = 0,
            solver: str = "auto") -> dict:
    """Fit one record in this process (the child's work); no RSS (the parent measures it).
    ``solver``: the smoothing solver (``SmootherOptions.solver``; "auto" = None, the default)."""
    import ceem_casadi as cc

    model, data, truth, theta0 = make_problem(name, T, seed)
    opts = cc.CEEMOptions(max_iters=max_iters, acceleration=acceleration,
                          smoother=cc.SmootherOptions(solver=None if solver == "auto" else solver))
    t0 = time.perf_counter()
    res = cc.ceem(model, data, theta0, options=opts)
    fit_s = time.perf_counter() - t0
    em = [r.smooth_s + r.learn_s for r in res.history]  # EM and joint Newton steps alike
    row = {"model": name, "T": T, "fit_s": fit_s, "iterations": res.iterations,
           "s_per_iteration": float(np.median(em)) if em else float("nan"), "build_s": res.build_s,
           "acceleration": acceleration, "smoother_solver": solver, "J": res.J, "theta_err": theta_error(model, res.theta, truth), "status": str(res.status)}
    row.update(floors(model, res, data, row["s_per_iteration"]))
    return row


def floors(model, res, data, s_per_iteration: float) -> dict:
    """The floor of one iteration at the fit's final states and parameters (``scripts/_floor.py``)
    beside the measured phase times (medians over the fit's history) and their ratios."""
    from ceem_casadi.objective._stages import StageFunctions
    from scripts._floor import learning_floor, smoothing_floor

    stages = StageFunctions(model)
    theta_vec = model.theta_vector(res.theta)
    fs = smoothing_floor(stages, theta_vec, data, res.x)
    fl = learning_floor(stages, theta_vec, data, res.x, hessian=True)
    med = lambda v: float(np.median(v)) if v else float("nan")  # noqa: E731
    em = [r for r in res.history if r.kind == "em"]
    smooth_s, learn_s = med([r.smooth_s for r in em]), med([r.learn_s for r in em])
    return {"smooth_floor_s": fs, "learn_floor_s": fl, "floor_s": fs + fl, "smooth_s": smooth_s, "learn_s": learn_s,
            "joint_s": med([r.learn_s for r in res.history if r.kind == "newton"]),
            "ratio": s_per_iteration / (fs + fl), "smooth_ratio": smooth_s / fs, "learn_ratio": learn_s / fl}


def run_child(name: str, T: int, max_iters: int, acceleration: str = "newton", solver: str = "auto") -> dict:
    """``run_one`` in a fresh subprocess; adds ``peak_rss_mb`` of that child alone (os.wait4)."""
    cmd = [sys.executable, "-m", "scripts.bench_scale_records", "--child", name, str(T), str(max_iters),
           acceleration, solver]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # reap it here (not Popen.wait): its own rusage
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        return {"model": name, "T": T, "status": "error", "error": stderr[-1500:],
                "peak_rss_mb": usage.ru_maxrss / 1024.0, "process_s": wall}
    row = json.loads(stdout.strip().splitlines()[-1])
    row["peak_rss_mb"] = usage.ru_maxrss / 1024.0  # Linux: kB
    row["process_s"] = wall                          # incl. interpreter start-up and simulation
    return row


def bench_records(lengths=LENGTHS, models=MODELS, smoke: bool = False, max_iters: int | None = None,
                  acceleration: str = "newton", verbose: bool = False, solver: str = "auto") -> list[dict]:
    """One row per (model, T), each fitted in its own subprocess (see the module docstring).

    ``smoke``: lengths ``(200, 400)`` and 2 iterations, whatever ``lengths`` says.
    """
    if smoke:
        lengths, max_iters = SMOKE_LENGTHS, 2
    rows = []
    for name in models:
        for T in lengths:
            row = run_child(name, int(T), 30 if max_iters is None else max_iters, acceleration, solver)
            rows.append(row)
            if verbose:
                print(_format(row), flush=True)
    return rows


def _format(r: dict) -> str:
    if r.get("status") == "error":
        return f"{r['model']:>7} T={r['T']:>8}: ERROR {r['error'][-300:]}"
    return (f"{r['model']:>7} T={r['T']:>8}: fit {r['fit_s']:8.2f} s, {r['iterations']:>3} it, "
            f"{r['s_per_iteration']:7.3f} s/it, build {r['build_s']:5.2f} s, peak RSS {r['peak_rss_mb']:7.0f} MB, "
            f"J {r['J']:.6g}, theta err {r['theta_err']:.2e}, {r['status']}; floor {r['floor_s']:.3f} s "
            f"(ratio {r['ratio']:.2f}x; smoothing {r['smooth_s']:.3f} / {r['smooth_floor_s']:.3f} s = "
            f"{r['smooth_ratio']:.2f}x, learning {r['learn_s']:.3f} / {r['learn_floor_s']:.3f} s = {r['learn_ratio']:.2f}x)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default=",".join(str(t) for t in LENGTHS))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--max-iters", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the rows as JSON to PATH ('-' = stdout)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--acceleration", default="newton", choices=("none", "squarem", "newton"))
    ap.add_argument("--smoother-solver", default="auto", choices=("auto", "ipopt", "banded", "batched"),
                    help="SmootherOptions.solver (auto = the library's choice: banded from T = 20,000 on)")
    ap.add_argument("--child", nargs=5, metavar=("MODEL", "T", "MAX_ITERS", "ACCELERATION", "SOLVER"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        row = run_one(args.child[0], int(args.child[1]), int(args.child[2]), args.child[3], solver=args.child[4])
        print(json.dumps(row))
        return 0
    lengths = [int(float(t)) for t in args.lengths.split(",")]
    models = [m for m in args.models.split(",") if m]
    rows = bench_records(lengths, models, smoke=args.smoke, max_iters=args.max_iters,
                         acceleration=args.acceleration, verbose=args.json != "-", solver=args.smoother_solver)
    return write_rows(rows, args.json)


def write_rows(rows: list[dict], json_arg: str | None) -> int:
    """Rows as JSON to stdout (``-``) or to the file ``json_arg``; exit status 1 if a row failed."""
    if json_arg == "-":
        print(json.dumps(rows, indent=1))
    elif json_arg:
        Path(json_arg).write_text(json.dumps(rows, indent=1))
    return 0 if all(r.get("status") != "error" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
