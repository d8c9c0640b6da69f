"""One smoothing solve of one long record: the banded Newton solver against IPOPT (issue 17).

For each (model, T, solver) a fresh Python subprocess simulates the record of
``scripts/bench_scale_records.py`` (``lorenz``: single Lorenz; ``wh33``: 6-state
Wiener-Hammerstein from ``ceem_casadi/model/_block_oriented.py``), builds the smoother for it
(``SmootherOptions(solver=...)``, chunked from T = 20,000 on as by default) and solves ONE
smoothing problem at the benchmark's initial parameters (10 % off the truth) from the simulated
states plus N(0, 0.1^2) noise (seeded; the same start for both solvers). Reported per row:
``build_s``, ``solve_s``, ``iterations``, ``status``, ``cost``, ``peak_rss_mb`` (the child's
whole life, ``os.wait4``), ``rss_before_solve_mb`` and, for the banded row, ``x_rel_diff`` =
max |x_banded - x_ipopt| / max |x_ipopt| and ``cost_rel_diff`` against the IPOPT row of the
same run (the optimum is the same up to the solvers' tolerances).

    python -m scripts.bench_banded_smoother [--lengths 100000] [--models lorenz,wh33]
                                            [--solvers ipopt,banded] [--json PATH|-]

``--smoke``: T = 300, both models, both solvers (seconds).
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

ROOT = Path(__file__).resolve().parents[1]


def run_one(name: str, T: int, solver: str, x_path: str, seed: int = 0) -> dict:
    """Build and solve in this process (the child); saves the states to ``x_path`` (.npy)."""
    import ceem_casadi as cc
    from scripts.bench_scale_records import make_problem

    model, data, truth, theta0, x_true = make_problem(name, T, seed, with_states=True)
    x0 = x_true + 0.1 * np.random.default_rng(seed + 7).standard_normal(x_true.shape)
    del x_true
    t0 = time.perf_counter()
    smoother = cc.smoothing.Smoother(model, cc.SmootherOptions(solver=solver))
    ts = smoother.for_length(T)
    build_s = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    res = ts.solve(model, model.theta_vector(theta0), data.y[0], data.inputs(0), x0)
    np.save(x_path, res.x)
    return {"model": name, "T": T, "solver": solver, "build_s": build_s, "solve_s": res.wall_s,
            "iterations": res.iterations, "status": res.status, "success": bool(res.success),
            "cost": res.cost, "rss_before_solve_mb": rss}


def run_child(name: str, T: int, solver: str, x_path: str) -> dict:
    cmd = [sys.executable, "-m", "scripts.bench_banded_smoother", "--child", name, str(T), solver, x_path]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    row = {"model": name, "T": T, "solver": solver, "status": "error", "error": stderr[-1500:]}
    if os.waitstatus_to_exitcode(status) == 0:
        row = json.loads(stdout.strip().splitlines()[-1])
    row["peak_rss_mb"], row["process_s"] = usage.ru_maxrss / 1024.0, wall
    return row


def bench(lengths, models, solvers, verbose=False) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            for T in lengths:
                xs = {}
                for solver in solvers:
                    path = str(Path(tmp) / f"{name}_{T}_{solver}.npy")
                    row = run_child(name, int(T), solver, path)
                    if row["status"] != "error":
                        xs[solver] = np.load(path)
                    ref = next((r for r in rows if r["model"] == name and r["T"] == T and r["solver"] == "ipopt"
                                and r["status"] != "error"), None)
                    if solver != "ipopt" and ref is not None and solver in xs:
                        row["x_rel_diff"] = float(np.abs(xs[solver] - xs["ipopt"]).max() / np.abs(xs["ipopt"]).max())
                        row["cost_rel_diff"] = abs(row["cost"] - ref["cost"]) / abs(ref["cost"])
                    rows.append(row)
                    if verbose:
                        print(_format(row), flush=True)
    return rows


def _format(r) -> str:
    if r["status"] == "error":
        return f"{r['model']:>6} T={r['T']:>8} {r['solver']:>6}: ERROR {r['error'][-400:]}"
    diff = f", x diff {r['x_rel_diff']:.1e}, cost diff {r['cost_rel_diff']:.1e}" if "x_rel_diff" in r else ""
    return (f"{r['model']:>6} T={r['T']:>8} {r['solver']:>6}: build {r['build_s']:7.1f} s, solve {r['solve_s']:7.1f} s "
            f"({r['iterations']} it, {r['status']}), RSS before solve {r['rss_before_solve_mb']:6.0f} MB, "
            f"peak {r['peak_rss_mb']:6.0f} MB{diff}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="100000")
    ap.add_argument("--models", default="lorenz,wh33")
    ap.add_argument("--solvers", default="ipopt,banded")
    ap.add_argument("--json", default=None, help="write the rows as JSON to PATH ('-' = stdout)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--child", nargs=4, metavar=("MODEL", "T", "SOLVER", "X_PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(args.child[0], int(args.child[1]), args.child[2], args.child[3])))
        return 0
    lengths = [300] if args.smoke else [int(float(t)) for t in args.lengths.split(",")]
    rows = bench(lengths, args.models.split(","), args.solvers.split(","), verbose=args.json != "-")
    if args.json == "-":
        print(json.dumps(rows, indent=1))
    elif args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["status"] != "error" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
