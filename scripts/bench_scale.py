"""Scaling of CE-EM (issue 17): long records (a), many trajectories on Dask workers (b), and a
model of the per-iteration time fitted to (b) with its prediction for more workers (c).

(a) T = 10^3 .. 10^6, one trajectory: ``scripts.bench_scale_records.bench_records`` (another
    branch); reported as missing when that module is absent.
(b) B trajectories (Lorenz, T = 500; the helicopter-size linear + MLP model, 2,246 parameters,
    learner with a limited-memory Hessian) on a ``LocalCluster`` of 1 and 2 worker processes
    (one thread each), ``CEEMOptions(executor=Sharded(client))``. Per EM iteration (median over
    iterations 2..): wall time, smoothing wall and its slowest shard's compute, learning wall, the
    client's time waiting for the map-reduce rounds and the rest (client-side IPOPT), J, the
    overhead (wall minus the slowest shard's compute in every step) and the bytes of array payload
    sent to / received from the workers. Speedup = wall(1 worker) / wall(2 workers).
(c) t(B, W) = (s + l) B / W + o_0 + o_1 W, fitted by least squares to (b) per model: s, l the
    smoothing and learning compute per trajectory, o the overhead (scheduling, transfer, client
    IPOPT); its prediction for 16 and 64 workers is a PREDICTION, not a measurement.

Run: ``python -m scripts.bench_scale --json out.json --parts b,c`` (``--smoke``: seconds, tiny
sizes). Timings on a shared machine are noisy: compare ratios from the same run.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time

import numpy as np

import ceem_casadi as cc
from ceem_casadi.distributed import Sharded
from models import lorenz
from models.helicopter import heli_model

log = logging.getLogger(__name__)


def lorenz_problem(B: int, T: int, seed: int = 0):
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(B, seed=seed), T, measurement_std=0.01,
                          seed=seed + 1)
    return model, data, lorenz.perturbed(lorenz.TRUE, 0.1, seed=seed + 2), cc.LearnerOptions()


def heli_problem(B: int, T: int, seed: int = 0, hidden=(32, 32)):
    """The helicopter NL model's size (nx = nu = 10, ny = 6, MLP 20-32-32-6: 2,246 parameters) on
    data simulated from random stable linear matrices and a nonzero head."""
    model, theta0, _ = heli_model(hidden=hidden, seed=seed)
    _, truth, _ = heli_model(hidden=hidden, seed=seed + 1, head_scale=0.5)
    rng = np.random.default_rng(seed)
    nx, nu, ny = model.nx, model.nu, model.ny
    truth.update(A=0.9 * np.linalg.qr(rng.standard_normal((nx, nx)))[0], B=0.3 * rng.standard_normal((nx, nu)),
                 C=0.3 * rng.standard_normal((ny, nx)), D=0.1 * rng.standard_normal((ny, nu)))
    u = rng.standard_normal((B, T, nu))
    data, _ = cc.simulate(model, truth, 0.1 * rng.standard_normal((B, nx)), T, u=u, process_std=0.05,
                          measurement_std=0.05, seed=seed + 3)
    return model, data, theta0, cc.LearnerOptions(hessian="limited-memory", max_iter=20)


PROBLEMS = {"lorenz": lorenz_problem, "heli": heli_problem}


def per_iteration(stats: list[dict], iters: int) -> list[dict]:
    """Group a fit's :class:`Sharded` stats into EM iterations (smooth, learn, J each)."""
    steps = [s for s in stats if s["kind"] in ("smooth", "learn", "J")][1:]  # drop the initial J
    rows = []
    for k in range(iters):
        sm, le, J = steps[3 * k:3 * k + 3]
        slowest = max(sm["shard_s"])
        rows.append(dict(
            smooth_s=sm["wall_s"], slowest_shard_s=slowest, learn_s=le["wall_s"], learn_wait_s=le["wait_s"],
            learn_calls=le["calls"], learn_shard_s=max(le["shard_s"]), client_ipopt_s=le["wall_s"] - le["wait_s"] - le.get("setup_s", 0.0),
            J_s=J["wall_s"], overhead_s=(sm["wall_s"] - slowest) + (le["wait_s"] - max(le["shard_s"]))
            + (J["wall_s"] - max(J["shard_s"])),
            sent_bytes=sm["sent_bytes"] + le["sent_bytes"] + J["sent_bytes"],
            received_bytes=sm["received_bytes"] + le["received_bytes"] + J["received_bytes"]))
    return rows


def run_config(client, name, B, T, iters, workers, seed=0) -> dict:
    model, data, theta0, learner = PROBLEMS[name](B, T, seed)
    sharded = Sharded(client)
    stamps = [time.perf_counter()]
    t0 = time.perf_counter()
    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(
        max_iters=iters, tol=0.0, executor=sharded, learner=learner),
        callback=lambda rec: stamps.append(time.perf_counter()))
    total = time.perf_counter() - t0
    rows = per_iteration(sharded.stats, len(res.history))
    walls = np.diff(stamps)[1:]  # from the end of iteration 1 on (iteration 1 includes sending x0)
    for r, w in zip(rows[1:], walls):
        r["wall_s"] = float(w)
    steady = rows[1:] or rows
    if len(rows) == 1:
        rows[0]["wall_s"] = rows[0]["smooth_s"] + rows[0]["learn_s"] + rows[0]["J_s"]
    med = {k: float(np.median([r[k] for r in steady])) for k in steady[0]}
    setup = next(s for s in sharded.stats if s["kind"] == "setup")
    return dict(model=name, B=B, T=T, workers=workers, n_params=int(model.params.free_index.size),
                iterations=len(res.history), status=str(res.status), total_s=total, build_s=res.build_s,
                setup_s=setup["wall_s"], setup_sent_bytes=setup["sent_bytes"],
                states_bytes=int(sum(x.nbytes for x in res.x)), per_iter_median=med, per_iter=rows)


def part_b(models, Bs, T, iters, worker_counts, seed=0) -> list[dict]:
    from distributed import Client, LocalCluster

    out = []
    t0 = time.perf_counter()
    counts = sorted(worker_counts)
    with LocalCluster(n_workers=counts[0], threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        for w in counts:  # one cluster, scaled up (each worker a fresh process with an empty solver cache)
            cluster.scale(w)
            client.wait_for_workers(w)
            start = time.perf_counter() - t0
            for name in models:
                for B in Bs:
                    row = run_config(client, name, B, T, iters, w, seed)
                    row["cluster_start_s"] = start
                    m = row["per_iter_median"]
                    print(f"  {name:6s} B={B:5d} workers={w}: {m['wall_s']:.3f} s/iter (smoothing {m['smooth_s']:.3f}, "
                          f"slowest shard {m['slowest_shard_s']:.3f}; learning {m['learn_s']:.3f}, "
                          f"{m['learn_calls']:.0f} rounds; overhead {m['overhead_s']:.3f}; "
                          f"{m['sent_bytes'] / 1e3:.1f} kB out, {m['received_bytes'] / 1e3:.1f} kB in)", flush=True)
                    out.append(row)
            t0 = time.perf_counter()
    for row in out:  # speedup against the 1-worker run of the same problem
        ref = [r for r in out if r["model"] == row["model"] and r["B"] == row["B"] and r["workers"] == 1]
        if ref:
            row["speedup"] = ref[0]["per_iter_median"]["wall_s"] / row["per_iter_median"]["wall_s"]
    return out


def part_c(rows: list[dict], predict_workers=(16, 64)) -> dict:
    """Per model: least squares of t = k B / W + o_0 + o_1 W on the (b) medians, and its prediction."""
    out = {}
    for name in sorted({r["model"] for r in rows}):
        rs = [r for r in rows if r["model"] == name]
        B = np.array([r["B"] for r in rs], float)
        W = np.array([r["workers"] for r in rs], float)
        t = np.array([r["per_iter_median"]["wall_s"] for r in rs])
        compute = np.array([r["per_iter_median"]["slowest_shard_s"] + r["per_iter_median"]["learn_shard_s"]
                            for r in rs])
        k = float(np.sum(compute * B / W) / np.sum((B / W) ** 2))  # compute per trajectory (s), slowest shard
        rest = t - k * B / W
        A = np.column_stack([np.ones_like(W), W])
        (o0, o1), *_ = np.linalg.lstsq(A, rest, rcond=None)
        fit = k * B / W + o0 + o1 * W
        pred = {}
        for b in sorted(set(B.astype(int))):
            t1 = k * b + o0 + o1
            pred[str(b)] = {str(w): dict(t_iter_s=float(k * b / w + o0 + o1 * w),
                                         speedup=float(t1 / (k * b / w + o0 + o1 * w))) for w in predict_workers}
        out[name] = dict(model="t = k B / W + o0 + o1 W", k_s_per_traj=k, o0_s=float(o0), o1_s_per_worker=float(o1),
                         rel_residual_max=float(np.max(np.abs(fit - t) / t)), prediction=pred,
                         note="PREDICTION from 1- and 2-worker runs on one machine; network latency of a real "
                              "cluster adds to o0 (learning rounds x round trip)")
    return out


def part_a(smoke: bool):
    try:
        from scripts.bench_scale_records import bench_records
    except ImportError as exc:
        msg = (f"part (a) needs scripts/bench_scale_records.py (bench_records, branch longT), not present here "
               f"({exc}); run it after that branch is merged")
        print(msg)
        return {"missing": msg}
    try:
        return bench_records(smoke=smoke)
    except TypeError:  # a signature without smoke=
        return bench_records()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--parts", default="a,b,c", help="comma-separated subset of a, b, c")
    ap.add_argument("--models", default="lorenz,heli")
    ap.add_argument("--B", default="64,256,1024", help="numbers of trajectories (part b)")
    ap.add_argument("--T", type=int, default=500)
    ap.add_argument("--iters", type=int, default=3, help="EM iterations per configuration (medians from the 2nd)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes (seconds): Lorenz only (unless --models is given), B = 2, 4, T = 30, 2 iterations")
    a = ap.parse_args(argv)
    if a.smoke:
        a.B, a.T, a.iters = "2,4", 30, 2
        a.models = a.models if "--models" in (argv or []) else "lorenz"
    parts = set(a.parts.split(","))
    if not parts <= {"a", "b", "c"}:
        ap.error(f"--parts: expected a subset of a,b,c, got {a.parts}")
    logging.basicConfig(level=logging.WARNING)
    res = {"args": vars(a), "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                        "load_avg": os.getloadavg(),
                                        "note": "shared machine: timings are noisy, compare ratios from one run"}}
    if "a" in parts:
        res["part_a"] = part_a(a.smoke)
    if "b" in parts or "c" in parts:
        print("part (b): per EM iteration, medians")
        res["part_b"] = part_b(a.models.split(","), [int(b) for b in a.B.split(",")], a.T, a.iters,
                               [int(w) for w in a.workers.split(",")], a.seed)
        for r in res["part_b"]:
            if "speedup" in r and r["workers"] != 1:
                print(f"  speedup {r['model']} B={r['B']}: {r['speedup']:.2f}x with {r['workers']} workers")
    if "c" in parts:
        res["part_c"] = part_c(res["part_b"])
        for name, m in res["part_c"].items():
            print(f"part (c) {name}: t = {m['k_s_per_traj']:.4g} B/W + {m['o0_s']:.3g} + {m['o1_s_per_worker']:.3g} W "
                  f"(max rel. residual {m['rel_residual_max']:.2f}); predicted: "
                  + "; ".join(f"B={b}: " + ", ".join(f"{w} workers {p['t_iter_s']:.2f} s ({p['speedup']:.1f}x)"
                                                   for w, p in ws.items()) for b, ws in m["prediction"].items()))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1, default=float)
    return res


if __name__ == "__main__":
    main()
