"""Step time of the generated C EKF predictor next to the Python EKF.

Models: single Lorenz (nx = 3, ny = 2, RK4) and a 10-state linear + tanh-MLP model (nu = 2,
ny = 4, 16 hidden units). For each: generate C (theta folded in), compile with
``gcc -std=c99 -O2 -Wall -Wextra -Werror``, run the example program with ``--bench N`` on a
500-step trajectory (10 % of outputs missing), and time ``EKF.run`` (engines ``python`` and
``casadi``) on the same trajectory. Also checks that C and Python agree to 1e-10 relative.
Target: < 5 us per step for the 10-state model.

    python -m scripts.bench_codegen [--reps 200] [--out results/bench_codegen]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np

import ceem_casadi as cc
from ceem_casadi.deploy._codegen import compile_example, generate_ekf, run_example, write_csv
from ceem_casadi.filtering import EKF
from models.linear_mlp import linear_mlp_model
from models.lorenz import TRUE, single_lorenz


def _case(name, model, theta, x0, u, T, reps, out: Path, seed: int) -> dict:
    data, _ = cc.simulate(model, theta, x0, T, u=None if u is None else [u], process_std=0.0,
                          measurement_std=0.1, seed=seed)
    y = data.y[0].copy()
    y[np.random.default_rng(seed).random(y.shape) < 0.1] = np.nan
    pv = model.theta_vector(theta)
    P0, Q, R = np.eye(model.nx), model.noise.process_std ** 2, model.noise.measurement_std ** 2
    t0 = time.perf_counter()
    gen = generate_ekf(model, pv, out / name, name=name, x0=x0, P0=P0, Q=Q, R=R)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    exe = compile_example(gen)
    compile_s = time.perf_counter() - t0
    y_c, x_c = run_example(exe, y, u, ny=model.ny)
    csv = write_csv(out / name / "input.csv", y, u)
    proc = subprocess.run([str(exe), "--bench", str(reps), str(csv)], capture_output=True, text=True, check=True)
    c_us = float(proc.stderr.split("us_per_step=")[1].split()[0])
    ekf = EKF(model)
    res = {}
    for engine in ("python", "casadi"):
        ekf.run(pv, y, u, x0=x0, Sigma0=P0, Q=Q, R=R, engine=engine)  # warm up (builds mapaccum)
        n = max(1, reps // 50)
        t0 = time.perf_counter()
        for _ in range(n):
            ref = ekf.run(pv, y, u, x0=x0, Sigma0=P0, Q=Q, R=R, engine=engine)
        res[engine] = 1e6 * (time.perf_counter() - t0) / (n * T)
    rel = max(np.max(np.abs(y_c - ref.y_pred)) / np.max(np.abs(ref.y_pred)),
              np.max(np.abs(x_c - ref.x_filt)) / np.max(np.abs(ref.x_filt)))
    return {"model": name, "nx": model.nx, "nu": model.nu, "ny": model.ny, "T": T,
            "c_bytes": gen.source.stat().st_size, "generate_s": gen_s, "compile_s": compile_s,
            "c_us_per_step": c_us, "python_us_per_step": res["python"], "casadi_us_per_step": res["casadi"],
            "speedup_vs_python": res["python"] / c_us, "max_rel_diff": float(rel)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200, help="repetitions of the trajectory in C")
    ap.add_argument("--T", type=int, default=500, help="trajectory length (samples)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/bench_codegen")
    ap.add_argument("--smoke", action="store_true", help="tiny run (T = 100, 5 repetitions)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.reps, args.T = 5, 100
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [_case("lorenz", single_lorenz(measurement_std=0.1), TRUE, np.array([-6.0, -6.0, 24.0]), None,
                  args.T, args.reps, out, args.seed)]
    model, theta = linear_mlp_model(seed=args.seed)
    u = np.random.default_rng(args.seed + 1).standard_normal((args.T, model.nu))
    rows.append(_case("linear_mlp", model, theta, np.zeros(model.nx), u, args.T, args.reps, out, args.seed))
    print(f"{'model':<11} {'nx':>3} {'C us/step':>10} {'Python us/step':>15} {'CasADi us/step':>15} "
          f"{'C vs Python':>12} {'max rel diff':>13}")
    for r in rows:
        print(f"{r['model']:<11} {r['nx']:>3} {r['c_us_per_step']:>10.3f} {r['python_us_per_step']:>15.1f} "
              f"{r['casadi_us_per_step']:>15.1f} {r['speedup_vs_python']:>11.0f}x {r['max_rel_diff']:>13.2e}")
    result = {"rows": rows, "target_us_10_state": 5.0,
              "target_met": bool(rows[1]["c_us_per_step"] < 5.0), "reps": args.reps}
    (out / "bench_codegen.json").write_text(json.dumps(result, indent=2))
    for r in rows:
        assert np.isfinite(r["c_us_per_step"]) and r["max_rel_diff"] < 1e-10, r
    return result


if __name__ == "__main__":
    main()
