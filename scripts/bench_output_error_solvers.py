"""The solvers of the one output-error problem, measured on the repository's cases (issue 32 item 3):
the Levenberg-Marquardt engine (default) against IPOPT (Gauss-Newton and exact Hessian), same start, same
``OutputErrorOptions`` otherwise (max_iters 500, time limit per run). Per case and solver: status, iterations,
final objective (relative to the lowest of the row), test RMS (free run on held-out data, initial state from its first
samples), wall time and peak RSS. Each (case, solver) runs in its own process (peak RSS is the
process's; its baseline, the case built and no solver run, is printed too).

Cases: the damped pendulum of tests/test_output_error.py (2 trajectories, single and multiple
shooting k = 7; test: another draw); the Wiener-Hammerstein record of scripts/bench_wh_realistic.py
(3 + 3, degree 7, from the BLA initialiser, 2,000 samples conditioned and unconditioned, single and
k = 100, and 20,000 and 100,000 samples; test: another 2,000-sample record); Cascaded Tanks (estimation split, from
the data-driven guess of `models.cascaded_tanks.initial_theta`, levels in [0, 20] V, single and
k = 64; test: the validation split, V); Silverbox (first 5,000 training samples, from the N4SID-based
guess of `models.silverbox.initial_theta`, single and k = 500; test: the multisine test split, mV).
Real records need the shared data folder (skipped otherwise).

    python -m scripts.bench_output_error_solvers [--time-limit 120] [--case NAME] [--solver NAME] [--json out.json]

"ipopt (exact)" (``hessian="exact"``, removed: docs/output_error.md) runs only on a checkout that still
offers it; the others are skipped with the reason.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

import ceem_casadi as cc

SOLVERS = {"lm": dict(solver="lm"),
           "ipopt (gauss-newton)": dict(solver="ipopt"),
           "ipopt (exact)": dict(solver="ipopt", hessian="exact")}


def _rms_after(model, theta, test: cc.Trajectories, window: int, scale: float = 1.0, **kw) -> float:
    """Free-run RMS over all test trajectories after ``window`` samples, x0 from the first ``window``."""
    err = []
    for b in range(len(test)):
        y, u = test.y[b], None if test.u is None else test.u[b]
        x0 = cc.estimate_initial_state(model, y[:window], theta, u=None if u is None else u[:window], window=window,
                                       **kw)
        yhat = cc.simulate_output(model, theta, u, x0)
        err.append((y - yhat.reshape(y.shape))[window:])
    return scale * float(np.sqrt(np.nanmean(np.concatenate(err) ** 2)))


def _pendulum(shooting):
    from tests.test_output_error import START, _data, pendulum

    model = pendulum()
    test = _data(model, T=60, noise=0.05, seed=11)
    return (model, _data(model, T=60, noise=0.05, seed=3), START, dict(shooting=shooting),
            lambda th: _rms_after(model, th, test, 10))


def _wh(gain, basis, n=2000, shooting=None):
    from scripts.bench_wh_realistic import make_record

    u, y0, _, _ = make_record(n, 0)
    noise = 1e-3 * np.sqrt(np.mean(y0 ** 2))
    y = y0 + noise * np.random.default_rng(1).standard_normal(n)
    data = cc.Trajectories([y[:, None]], [u[:, None]])
    init = cc.workflow.bla_initialise("wiener_hammerstein", data, 3, 3, feedthrough=(True, True), degree=7,
                                      gain=gain, basis=basis, measurement_std=noise)
    ut, yt, _, _ = make_record(2000, 7)
    test = cc.Trajectories([yt[:, None]], [ut[:, None]])
    return (init.model, data, init.theta, dict(x0=init.x0, shooting=shooting),
            lambda th: _rms_after(init.model, th, test, 50))


def _tanks(shooting=None):
    from ceem_casadi.baselines._n4sid import n4sid
    from ceem_casadi.io._datasets import load_cascaded_tanks
    from models.cascaded_tanks import cascaded_tanks, initial_theta
    from scripts.cascaded_tanks import test_rms

    sets = load_cascaded_tanks()
    est = sets["estimation"]
    theta0 = initial_theta(est, n4sid(est.data, order=2, horizon=10))
    model = cascaded_tanks(theta0)
    return (model, est.data, model.params.initial(), dict(x_lower=0.0, x_upper=20.0, shooting=shooting),
            lambda th: test_rms(model, th, sets["test"])[0])


def _silverbox(shooting=None):
    from ceem_casadi.baselines._n4sid import n4sid
    from models.silverbox import DT, initial_theta, silverbox
    from scripts.silverbox import test_rms

    sets = cc.load_silverbox()
    tr = sets["train"].data
    y, u = tr.y[0][:5000], tr.u[0][:5000]
    fit = n4sid([(y, u)], order=2)
    model = silverbox(initial_theta(fit.A, fit.B, fit.C, fit.D, float(y.mean()), float(u.mean())),
                      measurement_std=1e-3)
    return (model, cc.Trajectories([y], [u], dt=DT), model.params.initial(),
            dict(x0=np.r_[y[0, 0], 0.0], shooting=shooting), lambda th: test_rms(model, th, sets["test_multisine"])[0])


CASES = {"pendulum, single shooting": lambda: _pendulum(None), "pendulum, shooting=7": lambda: _pendulum(7),
         "WH 2,000, dc + chebyshev": lambda: _wh("dc", "chebyshev"),
         "WH 2,000, markov + monomial": lambda: _wh("markov", "monomial"),
         "WH 2,000, dc + chebyshev, shooting=100": lambda: _wh("dc", "chebyshev", shooting=100),
         "WH 20,000, dc + chebyshev": lambda: _wh("dc", "chebyshev", n=20000),
         "WH 100,000, dc + chebyshev": lambda: _wh("dc", "chebyshev", n=100000),
         "Cascaded Tanks (estimation)": _tanks, "Cascaded Tanks, shooting=64": lambda: _tanks(64),
         "Silverbox (5,000 samples)": _silverbox, "Silverbox, shooting=500": lambda: _silverbox(500)}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_one(case: str, solver: str, time_limit: float) -> dict:
    """One (case, solver) in this process: the row of the table (module docstring)."""
    try:
        model, data, theta, kw, test_rms = CASES[case]()
    except (FileNotFoundError, cc.io.DatasetNotFoundError) as exc:   # no shared data here
        return {"skipped": str(exc)}
    kw = dict(kw)
    bounds = {k: kw.pop(k) for k in ("x_lower", "x_upper") if k in kw}
    base_mb = _peak_mb()
    try:
        opts = cc.OutputErrorOptions(max_iters=500, time_limit=time_limit, **bounds, **SOLVERS[solver])
    except (cc.OptionsError, TypeError) as exc:   # a solver this library no longer offers
        return {"skipped": str(exc)}
    t0 = time.perf_counter()
    res = cc.refine_output_error(model, data, theta, options=opts, **kw)
    wall = time.perf_counter() - t0
    try:
        rms = test_rms(res.theta)
    except Exception as exc:   # a test free run that fails is a figure, not a crash
        rms = float("nan")
        print(f"  (test RMS failed: {exc})", file=sys.stderr)
    return dict(status=str(res.status), iterations=res.iterations, cost=float(res.cost),
                initial_cost=float(res.initial_cost), gap=float(res.constraint_violation), test_rms=rms,
                wall_s=wall, base_mb=base_mb, peak_mb=_peak_mb())


def run(time_limit: float = 120.0, cases=None, solvers=None) -> dict:
    """``{case: {solver: row}}``, each row from its own process (module docstring)."""
    out = {}
    for name in CASES:
        if cases and name not in cases:
            continue
        rows = {}
        for label in SOLVERS:
            if solvers and label not in solvers:
                continue
            cmd = [sys.executable, "-m", "scripts.bench_output_error_solvers", "--one", name, label,
                   "--time-limit", str(time_limit)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            try:
                rows[label] = json.loads(proc.stdout.strip().splitlines()[-1])
            except (json.JSONDecodeError, IndexError):
                rows[label] = {"failed": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
        done = [r["cost"] for r in rows.values() if "cost" in r]
        best = min(done) if done else float("nan")
        print(f"{name}:", flush=True)
        for label, r in rows.items():
            if "cost" not in r:
                print(f"  {label:<21} {r.get('skipped') or r.get('failed')}", flush=True)
                continue
            r["cost_over_best"] = r["cost"] / best
            print(f"  {label:<21} {r['status']:<12} {r['iterations']:4d} it  cost {r['cost']:.9g} "
                  f"(/best-1 {r['cost_over_best'] - 1:.1e})  test RMS {r['test_rms']:.5g}  {r['wall_s']:7.2f} s  "
                  f"peak {r['peak_mb']:6.0f} MB (case {r['base_mb']:.0f})", flush=True)
        out[name] = rows
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per run")
    ap.add_argument("--case", action="append", help="run only this case (repeatable)")
    ap.add_argument("--solver", action="append", help="run only this solver (repeatable)")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "SOLVER"), help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(*args.one, args.time_limit)))
        return 0
    print("(loaded machine timings)")
    res = run(args.time_limit, args.case, args.solver)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
