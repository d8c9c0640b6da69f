"""Paper figure "CE-EM vs particle EM" (section 4.1.2): learning curves, convergence, time per epoch.

Single Lorenz, sigma_w = 0.1, sigma_v = 0.5, four trajectories of T = 128 per seed, initial
parameters within 10 % of the truth, 10 seeds; CE-EM (Algorithm 1, no acceleration) and particle
EM (fully adapted PF with Np = 100, FFBSi with Ns = 10, SAEM) on the same data and initial guesses,
50 epochs each. The problem, both runners and the timing are those of
``scripts/bench_particle_vs_ceem.py``; this script adds the convergence analysis and the results
table:

* epochs to converge: the first epoch from which every parameter stays within ``--conv-tol``
  (relative, default 0.5 %) of the method's final estimate;
* the per-epoch runtime of each method (median over epochs 2.. of every seed) and their ratio.

Output (``--out DIR``): ``vs_particle.png`` (three panels: sigma, rho, beta vs epoch, 10 curves per
method, truth dashed), ``vs_particle.json``, ``vs_particle.md``.

    python -m scripts.lorenz_vs_particle [--seeds 0 ... 9] [--epochs 50] [--out DIR] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from models import lorenz
from scripts.bench_particle_vs_ceem import NAMES, make_problem, plot, run_ceem, run_pem, summarise


def epochs_to_converge(path: list[dict], rel_tol: float) -> int:
    """First epoch (1-based) from which every parameter stays within ``rel_tol`` of the last value."""
    est = np.array([[p[k] for k in NAMES] for p in path])
    ok = np.all(np.abs(est - est[-1]) <= rel_tol * np.abs(est[-1]), axis=1)
    bad = np.flatnonzero(~ok)
    return int(bad[-1] + 2) if bad.size else 1


def markdown(summary: dict, rows: list[dict]) -> str:
    c, p = summary["ceem"], summary["pem"]
    lines = ["| method | epochs | median time per epoch | epochs to converge (median, max) | "
             "max rel. error (median over seeds) | eps (median) |", "|---|---|---|---|---|---|"]
    for name, s, key in (("CE-EM", c, "ceem"), ("particle EM", p, "pem")):
        conv = [r[key]["epochs_to_converge"] for r in rows]
        lines.append(f"| {name} | {rows[0][key]['epochs']} | {1e3 * s['median_epoch_s']:.1f} ms | "
                     f"{int(np.median(conv))}, {max(conv)} | {s['median_max_rel_err']:.4f} | {s['median_eps']:.3f} |")
        if key == "ceem" and "ceem_newton" in rows[0]:
            nconv = [r["ceem_newton"]["epochs_to_converge"] for r in rows]
            nerr = np.median([r["ceem_newton"]["max_rel_err"] for r in rows])
            nep = np.median(np.concatenate([r["ceem_newton"]["epoch_s"] for r in rows]))
            lines.append(f"| CE-EM, acceleration='newton' | {rows[0]['ceem_newton']['epochs']} | {1e3 * nep:.1f} ms | "
                         f"{int(np.median(nconv))}, {max(nconv)} | {nerr:.4f} | - |")
    lines.append(f"\nRatio of the time per epoch, particle EM / CE-EM: **{summary['epoch_time_ratio_pem_over_ceem']:.1f}x** "
                 "(paper: 47x).")
    mean = {m: summary[m]["mean_theta"] for m in ("ceem", "pem")}
    se = {m: summary[m]["se_theta"] for m in ("ceem", "pem")}
    lines.append("\n| parameter | truth | CE-EM mean (SE) | particle EM mean (SE) |\n|---|---|---|---|")
    for k in NAMES:
        lines.append(f"| {k} | {lorenz.TRUE[k]:.3f} | {mean['ceem'][k]:.3f} ({se['ceem'][k]:.3f}) | "
                     f"{mean['pem'][k]:.3f} ({se['pem'][k]:.3f}) |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description="CE-EM vs particle EM on single Lorenz (paper section 4.1.2)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--epochs", type=int, default=50, help="epochs of each method")
    ap.add_argument("--pem-memory", type=int, default=5, help="SAEM window (iterations of samples in the M-step)")
    ap.add_argument("--conv-tol", type=float, default=0.005)
    ap.add_argument("--newton", action="store_true",
                    help="also run CE-EM with acceleration='newton' (joint steps; same fixed point)")
    ap.add_argument("--out", default="results/lorenz_vs_particle")
    ap.add_argument("--smoke", action="store_true", help="1 seed, 3 epochs each (< 1 min)")
    args = ap.parse_args(argv)
    seeds = args.seeds[:1] if args.smoke else args.seeds
    epochs = 3 if args.smoke else args.epochs
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows = []
    for seed in seeds:
        model, data, theta0 = make_problem(seed)
        row = {"seed": seed, "theta0": {k: float(theta0[k]) for k in NAMES},
               "ceem": run_ceem(model, data, theta0, epochs),
               "pem": run_pem(model, data, theta0, epochs, seed, args.pem_memory)}
        if args.newton:
            row["ceem_newton"] = run_ceem(model, data, theta0, epochs, acceleration="newton")
        for key in ("ceem", "pem", "ceem_newton"):
            if key in row:
                row[key]["epochs_to_converge"] = epochs_to_converge(row[key]["path"], args.conv_tol)
        rows.append(row)
        print(f"seed {seed}: CE-EM converged at epoch {row['ceem']['epochs_to_converge']:2d}, "
              f"{1e3 * row['ceem']['median_epoch_s']:6.1f} ms/epoch, err {row['ceem']['max_rel_err']:.4f} | "
              f"particle EM epoch {row['pem']['epochs_to_converge']:2d}, {1e3 * row['pem']['median_epoch_s']:7.1f} "
              f"ms/epoch, err {row['pem']['max_rel_err']:.4f}", flush=True)
    summary = summarise(rows)
    summary["wall_s"] = time.perf_counter() - t0
    plot(rows, out / "vs_particle.png")
    (out / "vs_particle.json").write_text(json.dumps({"summary": summary, "runs": rows}, indent=1))
    (out / "vs_particle.md").write_text(markdown(summary, rows))
    print(markdown(summary, rows))
    print(f"total {summary['wall_s']:.1f} s")
    if args.smoke:
        assert np.isfinite(summary["epoch_time_ratio_pem_over_ceem"])
        assert all(np.isfinite(r[m]["max_rel_err"]) for r in rows for m in ("ceem", "pem"))
        assert all((out / f).exists() for f in ("vs_particle.png", "vs_particle.json", "vs_particle.md"))
    return summary


if __name__ == "__main__":
    main()
