"""The two solvers of the one output-error problem, measured on the repository's cases (issue 32
item 3): the Levenberg-Marquardt engine (default; and with variable projection of the parameters that
enter the output linearly) against IPOPT (Gauss-Newton Hessian), same start, same
``OutputErrorOptions`` otherwise (max_iters 500, time limit per run). Per case and solver: status,
iterations, final objective (relative to the lowest of the row) and wall time.

Cases: the damped pendulum of tests/test_output_error.py (2 trajectories, single and multiple
shooting k = 7); the 2,000-sample Wiener-Hammerstein record of tests/test_wh_conditioning.py
(3 + 3, degree 7, from the BLA initialiser, conditioned and unconditioned); Cascaded Tanks
(estimation split, from the data-driven guess of `models.cascaded_tanks.initial_theta`, levels in
[0, 20] V); Silverbox (first 5,000 training samples, from the N4SID-based guess of
`models.silverbox.initial_theta`). Real records need the shared data folder (skipped otherwise).

    python -m scripts.bench_output_error_solvers [--time-limit 120] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

import ceem_casadi as cc

SOLVERS = {"lm": dict(solver="lm"), "lm + projection": dict(solver="lm", variable_projection=True),
           "ipopt": dict(solver="ipopt")}


def _pendulum(shooting):
    from tests.test_output_error import START, _data, pendulum

    model = pendulum()
    return model, _data(model, T=60, noise=0.05, seed=3), START, dict(shooting=shooting)


def _wh(gain, basis):
    from scripts.bench_wh_realistic import make_record

    u, y0, _, _ = make_record(2000, 0)
    noise = 1e-3 * np.sqrt(np.mean(y0 ** 2))
    y = y0 + noise * np.random.default_rng(1).standard_normal(2000)
    data = cc.Trajectories([y[:, None]], [u[:, None]])
    init = cc.workflow.bla_initialise("wiener_hammerstein", data, 3, 3, feedthrough=(True, True), degree=7,
                                      gain=gain, basis=basis, measurement_std=noise)
    return init.model, data, init.theta, dict(x0=init.x0)


def _tanks():
    from ceem_casadi.baselines._n4sid import n4sid
    from ceem_casadi.io._datasets import load_cascaded_tanks
    from models.cascaded_tanks import cascaded_tanks, initial_theta

    est = load_cascaded_tanks()["estimation"]
    theta0 = initial_theta(est, n4sid(est.data, order=2, horizon=10))
    model = cascaded_tanks(theta0)
    return model, est.data, model.params.initial(), dict(x_lower=0.0, x_upper=20.0)


def _silverbox():
    from ceem_casadi.baselines._n4sid import n4sid
    from models.silverbox import DT, initial_theta, silverbox

    tr = cc.load_silverbox()["train"].data
    y, u = tr.y[0][:5000], tr.u[0][:5000]
    fit = n4sid([(y, u)], order=2)
    model = silverbox(initial_theta(fit.A, fit.B, fit.C, fit.D, float(y.mean()), float(u.mean())),
                      measurement_std=1e-3)
    return model, cc.Trajectories([y], [u], dt=DT), model.params.initial(), dict(x0=np.r_[y[0, 0], 0.0])


CASES = {"pendulum, single shooting": lambda: _pendulum(None), "pendulum, shooting=7": lambda: _pendulum(7),
         "WH 2,000, dc + chebyshev": lambda: _wh("dc", "chebyshev"),
         "WH 2,000, markov + monomial": lambda: _wh("markov", "monomial"),
         "Cascaded Tanks (estimation)": _tanks, "Silverbox (5,000 samples)": _silverbox}


def run(time_limit: float = 120.0, cases=None) -> dict:
    """``{case: {solver: row}}`` (module docstring)."""
    out = {}
    for name, make in CASES.items():
        if cases and name not in cases:
            continue
        try:
            model, data, theta, kw = make()
        except (FileNotFoundError, cc.io.DatasetNotFoundError) as exc:   # no shared data here
            out[name] = {"skipped": str(exc)}
            continue
        kw = dict(kw)
        bounds = {k: kw.pop(k) for k in ("x_lower", "x_upper") if k in kw}
        rows = {}
        for label, sopts in SOLVERS.items():
            opts = cc.OutputErrorOptions(max_iters=500, time_limit=time_limit, **bounds, **sopts)
            t0 = time.perf_counter()
            res = cc.refine_output_error(model, data, theta, options=opts, **kw)
            rows[label] = dict(status=str(res.status), iterations=res.iterations, cost=float(res.cost),
                               initial_cost=float(res.initial_cost), wall_s=time.perf_counter() - t0)
        best = min(r["cost"] for r in rows.values())
        for r in rows.values():
            r["cost_over_best"] = r["cost"] / best
        out[name] = rows
        print(f"{name}:", flush=True)
        for label, r in rows.items():
            print(f"  {label:<20} {r['status']:<12} {r['iterations']:5d} it  cost/best {r['cost_over_best']:.9f}"
                  f"  {r['wall_s']:7.2f} s", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per run")
    ap.add_argument("--case", action="append", help="run only this case (repeatable)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    print("(loaded machine timings)")
    res = run(args.time_limit, args.case)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
