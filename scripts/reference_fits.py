"""Reference fits whose numbers a refactoring must not change: run them, write their theta and J
as JSON, or compare them with an earlier run.

Four fits through the public API only (so the script survives a change of module layout):
single Lorenz (4 x 128, CE-EM defaults), six coupled Lorenz (B = 8, ``acceleration="newton"``,
10 iterations), Cascaded Tanks CE-EM on the real estimation data (torricelli structure, 10
iterations; skipped when the data are absent) and a Dask fit (2 worker processes, single Lorenz
5 trajectories; skipped without ``dask[distributed]``).

    python -m scripts.reference_fits --json before.json
    python -m scripts.reference_fits --compare before.json [--rtol 1e-10]
    python -m scripts.reference_fits --acceleration newton --json newton.json   # the fits that use the
                                                                               # default, with another one

``--acceleration`` sets the acceleration of the fits that take the API default (all but the coupled fit,
which names ``"newton"``): how the default was chosen (docs/choosing.md).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import ceem_casadi as cc
from models import lorenz

# the acceleration of the fits that take the API default (None: the default; --acceleration)
_DEFAULT: dict = {}


def _options(**kw) -> cc.CEEMOptions:
    """CEEMOptions of a fit that takes the default acceleration (unless ``--acceleration`` names one)."""
    return cc.CEEMOptions(**{**_DEFAULT, **kw})


def _record(res, seconds: float) -> dict:
    return {"status": str(res.status), "iterations": len(res.history), "J": float(res.J),
            "theta": {k: np.asarray(v, float).ravel().tolist() for k, v in res.theta.items()},
            "seconds": seconds}


def single_lorenz() -> dict:
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(4, seed=0), lorenz.HORIZON,
                          measurement_std=0.01, seed=1)
    t0 = time.perf_counter()
    res = cc.ceem(model, data, lorenz.perturbed(lorenz.TRUE, 0.1, seed=2), options=_options(max_iters=50))
    return _record(res, time.perf_counter() - t0)


def coupled_lorenz() -> dict:
    from scripts.bench_lorenz import make_problem
    model, data, _, theta0 = make_problem("coupled8", seed=0)
    t0 = time.perf_counter()
    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=10, acceleration="newton", n_jobs=1))
    return _record(res, time.perf_counter() - t0)


def cascaded_tanks() -> dict | None:
    from models.cascaded_tanks import cascaded_tanks as tanks_model
    from models.cascaded_tanks import initial_theta
    try:
        splits = cc.load_cascaded_tanks()
    except cc.io.DatasetNotFoundError:
        return None
    est = splits["estimation"]
    lin = cc.n4sid(est.data, order=2, horizon=10)
    model = tanks_model(initial_theta(est, lin), process_std=0.003, measurement_std=0.05, substeps=4)
    t0 = time.perf_counter()
    res = cc.ceem(model, est.data, model.params.initial(), options=_options(max_iters=10))
    return _record(res, time.perf_counter() - t0)


def dask_fit() -> dict | None:
    try:
        import distributed
    except ImportError:
        return None
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(5, seed=10), [64, 48, 64, 56, 48],
                          measurement_std=0.01, seed=11)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
        t0 = time.perf_counter()
        res = cc.ceem(model, data, lorenz.perturbed(lorenz.TRUE, 0.1, seed=5),
                      options=_options(executor=cc.Sharded(client)))
        return _record(res, time.perf_counter() - t0)


FITS = {"single_lorenz": single_lorenz, "coupled_lorenz_B8": coupled_lorenz,
        "cascaded_tanks_ceem": cascaded_tanks, "dask_single_lorenz": dask_fit}


def compare(new: dict, old: dict, rtol: float) -> list[str]:
    """Lines describing every difference above ``rtol`` (relative, per entry) between two runs."""
    bad = []
    for name, rec in old.items():
        if rec is None or new.get(name) is None:
            continue
        got = new[name]
        if got["status"] != rec["status"] or got["iterations"] != rec["iterations"]:
            bad.append(f"{name}: status/iterations {got['status']}/{got['iterations']} "
                       f"vs {rec['status']}/{rec['iterations']}")
        pairs = [("J", [got["J"]], [rec["J"]])] + [(k, got["theta"][k], v) for k, v in rec["theta"].items()]
        for key, a, b in pairs:
            a, b = np.asarray(a), np.asarray(b)
            err = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300))) if a.size else 0.0
            if err > rtol:
                bad.append(f"{name}: {key} differs by {err:.2e} relative")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the records to this file")
    ap.add_argument("--compare", help="compare with the records in this file")
    ap.add_argument("--rtol", type=float, default=1e-10)
    ap.add_argument("--only", nargs="+", choices=tuple(FITS), default=list(FITS))
    ap.add_argument("--acceleration", default=None,
                    help="acceleration of the fits that take the API default (default: the API's default)")
    args = ap.parse_args(argv)
    _DEFAULT.clear()
    if args.acceleration is not None:
        _DEFAULT["acceleration"] = args.acceleration
    records = {}
    for name in args.only:
        records[name] = FITS[name]()
        rec = records[name]
        print(f"{name}: " + ("skipped (data or extra missing)" if rec is None else
                             f"{rec['status']}, {rec['iterations']} iterations, J = {rec['J']:.12g}, "
                             f"{rec['seconds']:.1f} s"), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(records, fh, indent=1)
    if args.compare:
        with open(args.compare) as fh:
            bad = compare(records, {k: v for k, v in json.load(fh).items() if k in records}, args.rtol)
        print("\n".join(bad) if bad else f"all records agree to {args.rtol:g}")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
