"""CE-EM versus output error on the paper's single Lorenz problem (docs/choosing.md).

The benchmark problem of ``scripts/bench_lorenz.py`` (single Lorenz, B = 4, T = 128, 10 % off
start, seeded): ``cc.ceem`` (``acceleration="newton"``) and ``cc.refine_output_error`` (single
shooting, the initial states estimated too) from the same start; prints wall time, status and the
relative parameter error of each.

    python -m scripts.ceem_vs_output_error [--seeds 0,1,2]
"""
from __future__ import annotations

import argparse
import time

import ceem_casadi as cc
from scripts.bench_lorenz import make_problem, param_error


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args(argv)
    for seed in (int(s) for s in args.seeds.split(",")):
        model, data, truth, theta0 = make_problem("single", seed=seed)
        t0 = time.perf_counter()
        fit = cc.ceem(model, data, theta0, options=cc.CEEMOptions(acceleration="newton"))
        t_ceem = time.perf_counter() - t0
        t0 = time.perf_counter()
        oe = cc.refine_output_error(model, data, theta0)
        t_oe = time.perf_counter() - t0
        print(f"seed {seed}: CE-EM {fit.status.value:>10} {t_ceem:6.2f} s err {param_error(model, fit.theta, truth):.2e}"
              f" | output error {oe.status.value:>13} {t_oe:6.2f} s err {param_error(model, oe.theta, truth):.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
