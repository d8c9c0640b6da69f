"""Scaling of CE-EM (issue 17): long records (a), many trajectories on Dask workers (b), and a
model of the per-iteration time fitted to (b) with its prediction for more workers (c).

(a) T = 10^3 .. 10^6, one trajectory: ``scripts.bench_scale_records.bench_records`` (another
    branch); reported as missing when that module is absent.
(b) B trajectories (Lorenz, T = 500; the helicopter-size linear + MLP model, 2,246 parameters,
    learner with a limited-memory Hessian) on a ``LocalCluster`` of 1 and 2 worker processes
    (one thread each), ``CEEMOptions(executor=Sharded(client))``, the cluster started with `QUIET_DASK`
    (Dask's own background work off or rarer; ``--dask-defaults``: Dask's defaults). Per EM iteration (median
    over iterations 2..): wall time, smoothing wall and its slowest shard's compute, learning wall, the
    client's time waiting for the map-reduce rounds and the rest (client-side IPOPT), J, the round trips to the
    workers, the overhead (wall minus the slowest shard's compute in every round trip), the imbalance (slowest shard minus
    the shards' mean, summed over the steps) and the bytes of pickled payload sent to / received from the
    workers. Speedup = wall(1 worker) / wall(2 workers), printed with the parallel capacity measured just before the
    W-worker runs (`parallel_capacity`: what the machine gives W processes then); CPU speedup = the workers' process
    CPU per iteration (iterations 2..) with one worker over the busiest worker's with W (the speedup if each worker had
    a core to itself: robust to load); the slowest shard's smoothing compute per trajectory against one worker's
    (above 1: the same work runs slower beside a neighbour). With most workers, `contention`: each shard's task alone
    against all at once (wall and CPU; ``--contention-reps``).
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
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import ceem_casadi as cc
from ceem_casadi.distributed import Sharded
from models import lorenz
from models.helicopter import heli_model

log = logging.getLogger(__name__)
# Dask's background work, which competes with the workers for the cores: the workers' statistical profiler
# (a stack sample every 10 ms), the event-loop tick monitor (every 20 ms), the system and memory monitors.
# Lorenz B = 256 on 2 workers (loaded 2-core machine, CPU seconds outside the shards' tasks per second of
# wall): the two workers 0.054 -> 0.003, the client process (client, scheduler, nannies) 0.041 -> 0.010.
QUIET_DASK = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
              "distributed.admin.system-monitor.interval": "5s", "distributed.worker.memory.monitor-interval": "1s"}


def _spin(n: int) -> float:
    t0 = time.perf_counter()
    s = 0
    for i in range(n):
        s += i
    return time.perf_counter() - t0


def _pid_after(delay: float) -> int:
    time.sleep(delay)
    return os.getpid()


def parallel_capacity(workers: int = 2, n: int = 4_000_000) -> float:
    """Throughput of ``workers`` processes running a pure-Python loop at once, relative to one alone
    (2.0 on an idle 2-core machine): the most a 1 -> ``workers`` speedup can show right now."""
    from multiprocessing import get_context

    one = _spin(n)
    with get_context("spawn").Pool(workers) as pool:
        # wait until every process has started and imported this module (seconds when it is the __main__ of
        # a run): tasks that sleep spread over the processes that are ready, so all have answered when every pid has
        while len(set(pool.map(_pid_after, [0.05] * workers * 4, chunksize=1))) < workers:
            pass
        t0 = time.perf_counter()
        pool.map(_spin, [n] * workers, chunksize=1)
        many = time.perf_counter() - t0
    return workers * one / many


def lorenz_problem(B: int, T: int, seed: int = 0):
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(B, seed=seed), T, measurement_std=0.01,
                          seed=seed + 1)
    return model, data, lorenz.perturbed(lorenz.TRUE, 0.1, seed=seed + 2), cc.LearnerOptions(), cc.SmootherOptions()


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
    # start 2 % from the truth (a warm start as in the helicopter pipeline, where N4SID and EKF + RTS
    # give the first iterate): from theta0 = linear, the first L-BFGS step moves the untrained head
    # far and the smoothing NLPs then hit IPOPT's iteration limit (37-48 s per trajectory, measured)
    start = {k: np.asarray(v, float) * (1 + 0.02 * rng.uniform(-1, 1, np.shape(v))) for k, v in truth.items()}
    return (model, data, start, cc.LearnerOptions(hessian="limited-memory", max_iters=20, rho_theta=RHO),
            cc.SmootherOptions(rho_x=RHO))


PROBLEMS = {"lorenz": lorenz_problem, "heli": heli_problem}
RHO = 0.5  # heli: rho_x = rho_theta of the paper's helicopter experiment


def per_iteration(stats: list[dict], iters: int) -> list[dict]:
    """Group a fit's `Sharded` stats into EM iterations (smooth, learn, J each). The smoothing task may also
    evaluate J and the learning step's first round (``task_s``; that J then needs no round trip, ``trips`` 0)."""
    steps = [s for s in stats if s["kind"] in ("smooth", "learn", "J")][1:]  # drop the initial J
    rows = []
    for k in range(iters):
        sm, le, J = steps[3 * k:3 * k + 3]
        task, J_trips = max(sm.get("task_s", sm["shard_s"])), J.get("trips", 1)
        slowest, learn_slowest = max(sm["shard_s"]), le.get("slowest_s", max(le["shard_s"]))
        J_slowest = max(J["shard_s"]) if J_trips else 0.0
        parallel = task + learn_slowest + J_slowest
        rows.append(dict(
            smooth_s=sm["wall_s"], slowest_shard_s=slowest, parallel_s=parallel, learn_s=le["wall_s"], learn_wait_s=le["wait_s"],
            learn_calls=le["calls"], learn_shard_s=max(le["shard_s"]), client_ipopt_s=le["wall_s"] - le["wait_s"] - le.get("setup_s", 0.0),
            J_s=J["wall_s"], J_shard_s=max(J["shard_s"]), trips=1 + le.get("trips", le["calls"]) + J_trips,
            overhead_s=(sm["wall_s"] - task) + (le["wait_s"] - learn_slowest) + (J["wall_s"] - J_slowest),
            imbalance_s=parallel - float(np.mean(np.sum([s["shard_s"] for s in (sm, le, J)], axis=0))),
            sent_bytes=sm["sent_bytes"] + le["sent_bytes"] + J["sent_bytes"],
            received_bytes=sm["received_bytes"] + le["received_bytes"] + J["received_bytes"]))
    return rows


def run_config(client, name, B, T, iters, workers, seed=0) -> dict:
    model, data, theta0, learner, smoother = PROBLEMS[name](B, T, seed)
    sharded = Sharded(client)
    stamps = [(time.perf_counter(), time.process_time())]
    cpu0, t0 = client.run(_worker_cpu), time.perf_counter()
    steady_cpu = []  # the workers' CPU at the ends of iteration 1 and of the last (setup and iteration 1 excluded)

    def on_iteration(rec):
        if len(stamps) == 1:  # before the stamp: iteration 1's wall, which the medians leave out, takes the message
            steady_cpu.append(client.run(_worker_cpu))
        stamps.append((time.perf_counter(), time.process_time()))
        if len(stamps) == iters + 1:
            steady_cpu.append(client.run(_worker_cpu))

    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(
        max_iters=iters, tol=0.0, executor=sharded, learner=learner, smoother=smoother), callback=on_iteration)
    total, cpu1 = time.perf_counter() - t0, client.run(_worker_cpu)
    if len(steady_cpu) == 2 and iters > 1:
        cpu0, cpu1, n_cpu = *steady_cpu, iters - 1
    else:
        n_cpu = len(res.history)
    rows = per_iteration(sharded.stats, len(res.history))
    walls = np.diff(np.array(stamps), axis=0)[1:]  # from the end of iteration 1 on (it includes sending x0)
    for r, (w, cpu) in zip(rows[1:], walls):
        # the client's serial part: what the slowest shard of each round does not cover (client CPU:
        # IPOPT, sums, (de)serialisation; and the messages' latency)
        r.update(wall_s=float(w), client_cpu_s=float(cpu), client_serial_s=float(w) - r["parallel_s"])
    steady = rows[1:] or rows
    if len(rows) == 1:
        rows[0]["wall_s"] = rows[0]["smooth_s"] + rows[0]["learn_s"] + rows[0]["J_s"]
        rows[0].update(client_cpu_s=float("nan"), client_serial_s=rows[0]["wall_s"] - rows[0]["parallel_s"])
    med = {k: float(np.median([r[k] for r in steady])) for k in steady[0]}
    setup = next(s for s in sharded.stats if s["kind"] == "setup")
    return dict(model=name, B=B, T=T, workers=workers, n_params=int(model.params.free_index.size),
                iterations=len(res.history), status=str(res.status), total_s=total, build_s=res.build_s,
                setup_s=setup["wall_s"], setup_sent_bytes=setup["sent_bytes"],
                states_bytes=int(sum(x.nbytes for x in res.x)), per_iter_median=med, per_iter=rows,
                # each worker's process CPU per iteration from iteration 2 on (over the whole fit if it stopped early)
                worker_cpu_per_iter_s=sorted((cpu1[a][0] - cpu0[a][0]) / n_cpu for a in cpu0))


def _worker_cpu() -> tuple[float, float]:
    """(CPU seconds, peak RSS in MB) of this process (run on a worker by ``client.run``)."""
    import resource

    return time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _dask_malloc(for_good: bool = False) -> None:
    """Dask's malloc in this worker: the nanny's MALLOC_TRIM_THRESHOLD_ = 64 kB, the mmap threshold pinned at 128 kB;
    ``for_good``: shard actors started later leave it so (``--dask-malloc``: the library's setting off)."""
    import ctypes

    from ceem_casadi.distributed import _tasks

    mallopt = ctypes.CDLL("libc.so.6").mallopt
    mallopt(-3, 128 << 10)
    mallopt(-1, 64 << 10)
    if for_good:
        _tasks.keep_freed_memory = lambda: None


def contention(client, name, B, T, seed=0, reps=3, rounds=3, mallocs=("kept", "dask")) -> dict:
    """Each shard's task alone (the other workers idle) against all at once, per step: client wall and the
    worker process's CPU (s). CPU per task rising when the shards run together is contention (memory bandwidth,
    page faults), wall rising more than CPU is waiting for a core (a loaded machine). At the states and
    parameters after one EM iteration; ``learn``: the learner's setup and ``rounds`` rounds of cost, gradient and
    Hessian. ``kept``: the library's malloc setting in the shard actors (`keep_freed_memory`); ``dask``: the
    nanny's, set back by ``client.run`` after the ``kept`` rows."""
    model, data, theta0, learner, smoother = PROBLEMS[name](B, T, seed)
    fit = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=1, tol=0.0, executor=Sharded(client),
                                                              learner=learner, smoother=smoother))
    engine = Sharded(client).start(model, data, smoother, learner, None)
    version, _ = engine._version_of([np.asarray(x) for x in fit.x])
    theta = model.params.to_vector(fit.theta)
    z = theta[model.params.free_index]

    def smooth(k):
        engine.actors[k].smooth(theta, version, -1, None).result()  # the source version stays

    def learn(k):
        engine.actors[k].terms(z, "all", (theta, version)).result()
        for _ in range(rounds - 1):
            engine.actors[k].terms(z, "all").result()

    def run(step, ks) -> list[tuple]:
        c0, w0 = client.run(_worker_cpu), time.perf_counter()
        with ThreadPoolExecutor(len(ks)) as pool:
            list(pool.map(step, ks))
        wall, c1 = time.perf_counter() - w0, client.run(_worker_cpu)
        return [(wall, c1[engine.where[k]][0] - c0[engine.where[k]][0]) for k in ks]

    shards, out = range(len(engine.actors)), {}
    for malloc in mallocs:
        if malloc == "dask":
            client.run(_dask_malloc)
        for step in (smooth, learn):
            alone, together = [], []
            for _ in range(reps):  # alternately, so that the machine's load hits both alike
                alone += [r for k in shards for r in run(step, [k])]
                together += run(step, list(shards))
            a, t = np.median(alone, axis=0), np.median(together, axis=0)
            out[f"{step.__name__}_{malloc}"] = dict(alone_wall_s=a[0], alone_cpu_s=a[1], together_wall_s=t[0],
                                                    together_cpu_s=t[1], cpu_ratio=t[1] / a[1])
    out["worker_peak_rss_mb"] = max(v[1] for v in client.run(_worker_cpu).values())
    return out


def median_run(runs: list[dict]) -> dict:
    """The run of median per-iteration wall time among repeats of one configuration, with every run's
    median in ``repeat_walls_s``."""
    runs = sorted(runs, key=lambda r: r["per_iter_median"]["wall_s"])
    return {**runs[len(runs) // 2], "repeat_walls_s": [r["per_iter_median"]["wall_s"] for r in runs]}


def part_b(models, Bs, T, iters, worker_counts, seed=0, repeats=1, dask_config=QUIET_DASK,
           contention_reps=3, dask_malloc=False) -> list[dict]:
    import dask
    from distributed import Client, LocalCluster

    out = []
    t0 = time.perf_counter()
    counts = sorted(worker_counts)
    with dask.config.set(dask_config), LocalCluster(n_workers=counts[0], threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        for w in counts:  # one cluster, scaled up (each worker a fresh process with an empty solver cache)
            cluster.scale(w)
            client.wait_for_workers(w)
            capacity = parallel_capacity(w) if w > 1 else 1.0  # what the VM gives w processes just before the runs
            if dask_malloc:
                client.run(_dask_malloc, True)
            start = time.perf_counter() - t0
            for name in models:
                for B in Bs:
                    row = median_run([run_config(client, name, B, T, iters, w, seed) for _ in range(repeats)])
                    row["cluster_start_s"], row["parallel_capacity"] = start, capacity
                    m = row["per_iter_median"]
                    print(f"  {name:6s} B={B:5d} workers={w}: {m['wall_s']:.3f} s/iter (median of "
                          f"{[round(v, 3) for v in row['repeat_walls_s']]}; smoothing {m['smooth_s']:.3f}, "
                          f"slowest shard {m['slowest_shard_s']:.3f}; learning {m['learn_s']:.3f}, "
                          f"{m['learn_calls']:.0f} rounds; J {m['J_s']:.3f} (shards {m['J_shard_s']:.3f}); "
                          f"{m['trips']:.0f} round trips; overhead {m['overhead_s']:.3f}, imbalance {m['imbalance_s']:.3f}; client serial "
                          f"{m['client_serial_s']:.3f} s, client CPU {m['client_cpu_s']:.3f} s; "
                          f"{m['sent_bytes'] / 1e3:.1f} kB out, {m['received_bytes'] / 1e3:.1f} kB in)", flush=True)
                    if contention_reps and w == counts[-1] > 1:
                        row["contention"] = contention(client, name, B, T, seed, contention_reps,
                                                       mallocs=("dask",) if dask_malloc else ("kept", "dask"))
                        for key, c in row["contention"].items():
                            if isinstance(c, dict):
                                print(f"    {key:12s} per task alone: {c['alone_wall_s']:.3f} s wall, "
                                      f"{c['alone_cpu_s']:.3f} s CPU; all {w} at once: {c['together_wall_s']:.3f} s "
                                      f"wall, {c['together_cpu_s']:.3f} s CPU (CPU x{c['cpu_ratio']:.3f})", flush=True)
                    out.append(row)
            t0 = time.perf_counter()
    for row in out:  # speedup against the 1-worker run of the same problem
        ref = [r for r in out if r["model"] == row["model"] and r["B"] == row["B"] and r["workers"] == 1]
        if ref:
            row["speedup"] = ref[0]["per_iter_median"]["wall_s"] / row["per_iter_median"]["wall_s"]
            row["cpu_ref"] = ref[0]["worker_cpu_per_iter_s"]
            row["cpu_speedup"] = sum(row["cpu_ref"]) / max(row["worker_cpu_per_iter_s"])
            # the slowest shard's smoothing compute per trajectory against one worker's (1.0: no slower with neighbours)
            row["shard_per_trajectory_ratio"] = (row["per_iter_median"]["slowest_shard_s"] * row["workers"]
                                                 / ref[0]["per_iter_median"]["slowest_shard_s"])
    return out


def _through_origin(x, y) -> float:
    return float(np.sum(x * y) / np.sum(x * x))


def _affine_nonneg_slope(W, y) -> tuple[float, float]:
    """Least squares y = a + b W with b >= 0 (overheads do not fall with more workers)."""
    (a, b), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(W), W]), y, rcond=None)
    return (float(a), float(b)) if b >= 0 else (float(np.mean(y)), 0.0)


def part_c(rows: list[dict], predict_workers=(16, 64)) -> dict:
    """Per model, the per-iteration time as slowest shard + reduction + client-side IPOPT, fitted to (b):

        t(B, W) = s B / W + (a0 + a1 W) + R [ l B / W + (c0 + c1 W) + i ] + j

    s, l: smoothing and per-round learning compute per trajectory of the slowest shard; a, c: the
    scheduling/transfer overhead of a smoothing step and of a learning round (growing at most
    linearly with W); R: learning rounds per iteration (median); i: client-side IPOPT per round;
    j: the J evaluation. Returns the fitted constants and the PREDICTION for ``predict_workers``."""
    out = {}
    for name in sorted({r["model"] for r in rows}):
        ms = [r["per_iter_median"] for r in rows if r["model"] == name]
        B = np.array([r["B"] for r in rows if r["model"] == name], float)
        W = np.array([r["workers"] for r in rows if r["model"] == name], float)
        calls = np.array([m["learn_calls"] for m in ms])
        s = _through_origin(B / W, np.array([m["slowest_shard_s"] for m in ms]))
        l_ = _through_origin(B / W, np.array([m["learn_shard_s"] for m in ms]) / calls)
        a0, a1 = _affine_nonneg_slope(W, np.array([m["smooth_s"] - m["slowest_shard_s"] for m in ms]))
        c0, c1 = _affine_nonneg_slope(W, np.array([(m["learn_wait_s"] - m["learn_shard_s"]) for m in ms]) / calls)
        i = float(np.median([m["client_ipopt_s"] / m["learn_calls"] for m in ms]))
        j = float(np.median([m["J_s"] for m in ms]))
        R = float(np.median(calls))

        def t(b, w, s=s, l_=l_, a0=a0, a1=a1, c0=c0, c1=c1, i=i, j=j, R=R):
            return s * b / w + a0 + a1 * w + R * (l_ * b / w + c0 + c1 * w + i) + j

        fit = np.array([t(b, w) for b, w in zip(B, W)])
        meas = np.array([m["smooth_s"] + m["learn_s"] + m["J_s"] for m in ms])
        pred = {str(b): {str(w): dict(t_iter_s=t(b, w), speedup=t(b, 1) / t(b, w)) for w in predict_workers}
                for b in sorted({*B.astype(int), 1024})}
        out[name] = dict(formula="t = s B/W + a0 + a1 W + R (l B/W + c0 + c1 W + i) + j",
                         s=s, l=l_, a0=a0, a1=a1, c0=c0, c1=c1, i=i, j=j, R=R,
                         rel_residual_max=float(np.max(np.abs(fit - meas) / meas)), prediction=pred,
                         note="PREDICTION from 1- and 2-worker runs on one shared machine; a real cluster's "
                              "network latency adds to c0 (per learning round) and a0")
    return out


def markdown(res: dict) -> str:
    """The (b) and (c) tables of ``res`` (as written by `main`) in Markdown."""
    lines = []
    if res.get("part_b"):
        lines += ["| model | B | workers | s / iteration | speedup | smoothing (slowest shard) | learning: rounds, "
                  "wait, client IPOPT | J | overhead (imbalance) | client serial (CPU) | kB out / in per iteration |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(res["part_b"], key=lambda r: (r["model"], r["B"], r["workers"])):
            m = r["per_iter_median"]
            lines.append(f"| {r['model']} | {r['B']} | {r['workers']} | {m['wall_s']:.2f} | {r.get('speedup', 1.0):.2f}x "
                         f"| {m['smooth_s']:.2f} ({m['slowest_shard_s']:.2f}) | {m['learn_calls']:.0f}, "
                         f"{m['learn_wait_s']:.2f}, {m['client_ipopt_s']:.2f} | {m['J_s']:.2f} | {m['overhead_s']:.2f} ({m['imbalance_s']:.3f}) "
                         f"| {m['client_serial_s']:.2f} ({m['client_cpu_s']:.2f}) "
                         f"| {m['sent_bytes'] / 1e3:.1f} / {m['received_bytes'] / 1e3:.1f} |")
    for name, m in (res.get("part_c") or {}).items():
        lines += ["", f"{name}: {m['formula']} with s = {m['s']:.3g} s, l = {m['l']:.3g} s, a0 = {m['a0']:.3g} s, "
                  f"a1 = {m['a1']:.3g} s, R = {m['R']:.0f}, c0 = {m['c0']:.3g} s, c1 = {m['c1']:.3g} s, "
                  f"i = {m['i']:.3g} s, j = {m['j']:.3g} s (largest relative residual {m['rel_residual_max']:.2f}). "
                  "PREDICTED:", "", "| B | W = 16: s / iteration (speedup vs 1) | W = 64 |", "|---|---|---|"]
        for b, ws in m["prediction"].items():
            lines.append(f"| {b} | " + " | ".join(f"{p['t_iter_s']:.2f} ({p['speedup']:.1f}x)" for p in ws.values()) + " |")
    return "\n".join(lines)


def part_a(smoke: bool):
    try:
        from scripts.bench_scale_records import bench_records
    except ImportError as exc:
        msg = (f"part (a) needs scripts/bench_scale_records.py (bench_records, branch longT), not present here "
               f"({exc}); run it after that branch is merged")
        print(msg)
        return {"missing": msg}
    return {"rows": bench_records(smoke=smoke)}


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
    ap.add_argument("--repeats", type=int, default=1, help="runs per configuration (part b: the median run is kept)")
    ap.add_argument("--contention-reps", type=int, default=3,
                    help="part b, most workers: each shard's task alone vs all at once, this many times (0: skip)")
    ap.add_argument("--dask-malloc", action="store_true",
                    help="part b: the workers keep Dask's malloc setting (the shard actors' keep_freed_memory off)")
    ap.add_argument("--dask-defaults", action="store_true", help="Dask's default configuration, not QUIET_DASK")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes (seconds): Lorenz only (unless --models is given), B = 2, 4, T = 30, 2 iterations")
    a = ap.parse_args(argv)
    if a.smoke:
        a.B, a.T, a.iters, a.contention_reps = "2,4", 30, 2, 1
        a.models = a.models if "--models" in (sys.argv[1:] if argv is None else argv) else "lorenz"
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
        cap = parallel_capacity(max(int(w) for w in a.workers.split(",")))
        res["machine"]["parallel_capacity"] = cap
        print(f"parallel capacity now: {cap:.2f}x (throughput of {a.workers.split(',')[-1]} processes vs one; "
              "an idle machine gives the number of cores)")
        print("part (b): per EM iteration, medians")
        res["part_b"] = part_b(a.models.split(","), [int(b) for b in a.B.split(",")], a.T, a.iters,
                               [int(w) for w in a.workers.split(",")], a.seed, a.repeats,
                               {} if a.dask_defaults else QUIET_DASK, a.contention_reps, a.dask_malloc)
        for r in res["part_b"]:
            if "speedup" in r and r["workers"] != 1:
                print(f"  speedup {r['model']} B={r['B']}: {r['speedup']:.2f}x with {r['workers']} workers "
                      f"(parallel capacity just before: {r['parallel_capacity']:.2f}x); workers' CPU per iteration "
                      f"{np.round(r['worker_cpu_per_iter_s'], 3)} against {np.round(r['cpu_ref'], 3)} with one: "
                      f"{r['cpu_speedup']:.2f}x (the speedup if every worker had its own core); smoothing per "
                      f"trajectory in the slowest shard x{r['shard_per_trajectory_ratio']:.3f} of one worker's")
    if "c" in parts:
        res["part_c"] = part_c(res["part_b"])
    print(markdown(res))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1, default=float)
    return res


if __name__ == "__main__":
    main()
