"""``cc.calibrate_noise`` on the real Cascaded Tanks record: which process-noise level each criterion
chooses on the estimation data, and the test RMS of that choice.

Same model and initial guess as ``scripts/cascaded_tanks.py`` (gray-box tanks with pump dead zone,
measurement std 0.05 V, RK4 with 4 substeps; initial guess from an order-2 N4SID model, see
``docs/results_real.md``). Grid: multipliers of the nominal process std 0.01 V per sample.
Every fit: CE-EM, ``acceleration="newton"``, at most ``--iters`` iterations. For comparison, the
rule of ``scripts/cascaded_tanks.py`` (lowest free-run RMS on the estimation data, simulated from
the first smoothed state) is applied to the same innovation-criterion fits. The test split is only
evaluated: free-run RMS after 5 samples, the initial state estimated from those 5 samples
(``cc.estimate_initial_state``, window 5), as in the benchmark protocol.

    python -m scripts.noise_calibration_tanks [--grid 0.1 0.3 1 3 10 30] [--iters 100] [--n-jobs 2]
        [--time-limit 1200] [--json out.json] [--plot-dir docs/figures]
"""
from __future__ import annotations

import argparse
import json
import time

import ceem_casadi as cc
from ceem_casadi.baselines._n4sid import n4sid
from ceem_casadi.io import simulation_rms
from models.cascaded_tanks import cascaded_tanks, initial_theta

INIT = 5  # test samples usable for the initial state (benchmark protocol)


def test_rms(model, theta, split) -> float:
    x0 = cc.estimate_initial_state(model, split.y, theta, u=split.u, window=INIT)
    return simulation_rms(split.y, cc.simulate_output(model, theta, split.u, x0), INIT)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0, 10.0, 30.0],
                    help="multipliers of the nominal process std 0.01 V/sample")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--n-jobs", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=1200.0, help="seconds per criterion")
    ap.add_argument("--criteria", nargs="+", default=["innovation", "holdout"])
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot-dir", default=None, help="write noise_calibration_tanks_<criterion>.png here")
    args = ap.parse_args(argv)
    splits = cc.load_cascaded_tanks()
    est, tst = splits["estimation"], splits["test"]
    theta0 = initial_theta(est, n4sid(est.data, order=2, horizon=10))
    model = cascaded_tanks(theta0, process_std=0.01, measurement_std=0.05, substeps=4)
    theta0 = model.params.initial()
    opts = cc.NoiseCalibrationOptions(ceem=cc.CEEMOptions(max_iters=args.iters, acceleration="newton"),
                                      n_jobs=args.n_jobs, time_limit=args.time_limit)
    out: dict = {"args": vars(args)}
    for crit in args.criteria:
        t0 = time.perf_counter()
        res = cc.calibrate_noise(model, est.data, theta0, grid=args.grid, criterion=crit, options=opts)
        rows = []
        for _, r in res.levels.iterrows():
            if r["fit"] is None:
                rows.append({"level": r["level"], "status": r["status"]})
                continue
            th = r["fit"].theta
            y_est = cc.simulate_output(model, th, est.u, r["fit"].x[0][0])
            rows.append({"level": r["level"], "process_std": r["process_std"][0], "status": r["status"],
                         "iterations": int(r["iterations"]), "J": r["J"], crit: r["criterion"],
                         "estimation_rms": simulation_rms(est.y, y_est) if crit == "innovation" else None,
                         "test_rms": test_rms(model, th, tst), "seconds": r["seconds"]})
        if args.plot_dir:
            import matplotlib
            matplotlib.use("Agg")
            ax = res.plot()
            ax.set_title(f"Cascaded Tanks, criterion {crit!r} (nominal 0.01 V/sample)")
            ax.figure.tight_layout()
            ax.figure.savefig(f"{args.plot_dir}/noise_calibration_tanks_{crit}.png", dpi=100)
        rec = {"rows": rows, "chosen_level": res.best.level, "chosen_test_rms": test_rms(model, res.best.theta, tst),
               "seconds": time.perf_counter() - t0}
        if crit == "innovation":
            ok = [r for r in rows if r.get("estimation_rms") is not None]
            script = min(ok, key=lambda r: r["estimation_rms"])
            rec["script_rule_level"], rec["script_rule_test_rms"] = script["level"], script["test_rms"]
        out[crit] = rec
        print(f"criterion {crit}: {rec['seconds']:.0f} s")
        for r in rows:
            print("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        print(f"  chosen level {res.best.level:g} (process std {res.best.process_std[0]:.4g} V): "
              f"test RMS {rec['chosen_test_rms']:.4f} V" + ("" if crit != "innovation" else
              f"; the script's rule (lowest estimation RMS) picks {rec['script_rule_level']:g}: "
              f"test RMS {rec['script_rule_test_rms']:.4f} V"), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2, default=float)
    return out


if __name__ == "__main__":
    main()
