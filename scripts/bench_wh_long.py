"""CE-EM on a long Wiener-Hammerstein record from the library's own initialiser (issue 24, item 3).

The record is ``scripts/bench_scale_records``'s ``wh33`` (the 961 s run of docs/scaling.md): the
6-state model ``wiener_hammerstein(3, 3)`` (cubic f on v / 2, 15 free parameters) at the demo's
truth, one trajectory of T samples, u ~ N(0, 1) (seeded), process noise 0.01 on every state,
measurement noise 0.02. The fit never sees the truth:

1. initialiser: ``bla_initialise("wiener_hammerstein", data, 3, 3, refine=True)`` on the record
   (the library uses its first 100,000 samples for the BLA and the splits and polishes the best
   split by output error on the first 20,000: ``ceem_casadi/workflow/initialisation/_bla.py``);
2. CE-EM: ``cc.ceem(init.model, data, init.theta, CEEMOptions(acceleration="newton"))`` with the
   default ``tol`` and the long-record policy's warm start (a fit of the leading 20,000 samples
   first, ``CEEMOptions.warm_start``); ``--warm-start 0`` turns it off.

Printed and written (``--json``): the initialiser's wall time (and of its output-error polish), the
warm-start fit's and the whole-record fit's wall time, iterations (by kind) and status, the wall and
CPU seconds of the whole-record iterations by kind and the rest (initial states, evaluations of J,
final check), final theta error against the truth (max over free entries of |est - true| /
max(|true|, 1), the truth mapped to the fit's ``scale``), the free-run RMS on a fresh noise-free
record of ``--test-length`` samples plus measurement noise (from rest, the first 500 samples left
out) against the noise std and the truth's own RMS on it, the process's peak RSS at the end of the fit
(``fit_peak_rss_mb``: simulation, initialiser, CE-EM) and at the end (with the floors' measurement) and CPU seconds,
and (unless ``--no-floor``) the floor of one iteration at the final iterate (``scripts/_floor.py``).

    python -m scripts.bench_wh_long [--length 1000000] [--json out.json] [--warm-start N]
                                    [--max-iters 50] [--no-floor] [--smoke] [--baseline base.json]
                                    [--rss-phases]

``--rss-phases``: the largest resident set of each phase of CE-EM (initial states, smoothing, learning,
joint step, J, ...; ``fit`` is the rest), sampled every 20 ms, and their seconds (``rss_by_phase_mb``,
``seconds_by_phase`` in the JSON).

``--baseline``: the JSON of another run (e.g. of the previous release, run in the same session) to
compare with: whole-fit wall and CPU ratios, peak RSS ratio, theta's, J's and the test RMS's
relative differences (``baseline`` in the JSON).

``--smoke``: T = 3,000 with a warm start of 1,000 samples (seconds; tests). On a shared machine
wall times are noisy: the CPU seconds of the process are disturbed less.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import threading
import time

import numpy as np

import ceem_casadi as cc
from ceem_casadi.workflow import bla_initialise
from scripts.bench_scale_records import floors, make_problem, simulate_long

TEST_SEED = 1000
TRANSIENT = 500
WH_SCALE = 2.0  # the scale of f's input in the record's true model (bench_scale_records._wh33)


def truth_in(scale: float, truth: dict) -> dict:
    """The truth in the parameterisation of a model with f's input scale ``scale``: same blocks (unit
    leading Markov coefficient, sections from the poles), f's coefficients rescaled from v / 2 to v / scale."""
    out = {k: np.array(v, float) for k, v in truth.items()}
    out["f_coef"] = out["f_coef"] * (scale / WH_SCALE) ** np.arange(out["f_coef"].size)
    return out


def theta_error(model, theta, truth) -> float:
    est, tru = model.theta_vector(theta), model.theta_vector(truth)
    free = model.params.free_index
    return float(np.max(np.abs(est[free] - tru[free]) / np.maximum(np.abs(tru[free]), 1.0)))


def test_record(truth_model, truth, n: int):
    """(u (n, 1), y (n,)): a fresh input, the truth's noise-free run from rest plus measurement noise."""
    u = np.random.default_rng(TEST_SEED).standard_normal((n, 1))
    data, _ = simulate_long(truth_model, truth, np.zeros((1, 6)), n, u=u, measurement_std=0.02, seed=TEST_SEED + 1)
    return u, data.y[0][:, 0]


def free_run_rms(model, theta, u, y) -> float:
    yhat = np.asarray(cc.simulate_output(model, theta, u, np.zeros(model.nx)))[:, 0]
    return float(np.sqrt(np.mean((yhat[TRANSIENT:] - y[TRANSIENT:]) ** 2)))


def _by_kind(history) -> dict:
    out: dict = {}
    for r in history:
        k = out.setdefault(r.kind, {"n": 0, "s": 0.0})
        k["n"] += 1
        k["s"] += r.smooth_s + r.learn_s
    return out


@contextlib.contextmanager
def rss_by_phase(peaks: dict, calls: dict):
    """Largest resident set (MB) per phase of ``scripts.bench_record_phases.TARGETS`` (``fit`` outside
    them) in ``peaks``, sampled every 20 ms while the block runs and as each phase starts and ends (so a phase
    shorter than the interval, or run while a loaded machine starves the sampler, is still listed); each call's
    seconds in ``calls``."""
    from scripts.bench_record_phases import phase_timers

    stop, page = threading.Event(), os.sysconf("SC_PAGE_SIZE") / 2 ** 20

    def read():
        with open("/proc/self/statm") as fh:
            rss = int(fh.read().split()[1]) * page
        peaks[stack[-1]] = round(max(peaks.get(stack[-1], 0.0), rss))

    class Sampled(list):
        def append(self, phase):
            super().append(phase)
            read()

        def pop(self):
            read()
            return super().pop()

    stack = Sampled(["fit"])

    def sample():
        while not stop.wait(0.02):
            read()

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        with phase_timers(calls, stack):
            yield peaks
    finally:
        stop.set()
        thread.join()


def run(T: int, warm_start: int | None, max_iters: int, floor: bool, test_length: int, seed: int = 0,
        phases: bool = False) -> dict:
    c_proc = time.process_time()
    truth_model, data, truth, _ = make_problem("wh33", T, seed)
    row: dict = {"T": T, "simulate_cpu_s": time.process_time() - c_proc}
    t0, c0 = time.perf_counter(), time.process_time()
    init = bla_initialise("wiener_hammerstein", data, 3, 3, refine=True, process_std=0.01, measurement_std=0.02)
    row.update(init_s=time.perf_counter() - t0, init_cpu_s=time.process_time() - c0, bla_split_rms=init.best.rms,
               polish_s=init.refinement.wall_s, polish_status=str(init.refinement.status),
               polish_iterations=init.refinement.iterations)
    model = init.model
    true_theta = truth_in(init.best.scale, truth)
    row["theta_err_init"] = theta_error(model, init.theta, true_theta)
    opts = cc.CEEMOptions(acceleration="newton", max_iters=max_iters, warm_start=warm_start)
    t0, c0, peaks, calls = time.perf_counter(), time.process_time(), {}, {}
    with rss_by_phase(peaks, calls) if phases else contextlib.nullcontext():
        res = cc.ceem(model, data, init.theta, options=opts)
    row.update(rss_by_phase_mb=peaks, seconds_by_phase={k: round(sum(c[0] for c in v), 2) for k, v in calls.items()})
    row.update(ceem_s=time.perf_counter() - t0, ceem_cpu_s=time.process_time() - c0, status=str(res.status),
               iterations=res.iterations, J=res.J, tol=opts.tol, message=res.message, build_s=res.build_s,
               kinds=_by_kind(res.history), theta_err=theta_error(model, res.theta, true_theta),
               theta=model.theta_vector(res.theta).tolist())
    warm = res.warm_start
    if warm is not None:
        row.update(warm_length=len(warm.x[0]), warm_s=warm.wall_s, warm_status=str(warm.status),
                   warm_iterations=warm.iterations, warm_kinds=_by_kind(warm.history),
                   theta_err_warm=theta_error(model, warm.theta, true_theta))
    # the fit's own peak (simulation, initialiser and CE-EM; the floors and the test record below come later)
    row["fit_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    steps = sum(k["s"] for k in row["kinds"].values())
    row["other_s"] = row["ceem_s"] - steps - (row.get("warm_s") or 0.0)  # initial states, J, final check
    row["total_s"] = row["init_s"] + row["ceem_s"]
    row["total_cpu_s"] = row["init_cpu_s"] + row["ceem_cpu_s"]
    u, y = test_record(truth_model, truth, test_length)
    row.update(noise_std=0.02, test_rms=free_run_rms(model, res.theta, u, y),
               test_rms_truth=free_run_rms(truth_model, truth, u, y),
               test_rms_init=free_run_rms(model, init.theta, u, y))
    row["test_rms_over_noise"] = row["test_rms"] / row["noise_std"]
    if floor:
        em = [r.smooth_s + r.learn_s for r in res.history]
        row.update({f"floor_{k}": v for k, v in floors(model, res, data, float(np.median(em))).items()})
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    row["process_cpu_s"] = time.process_time()
    return row


def _format(r: dict) -> str:
    kinds = ", ".join(f"{k} {v['n']} ({v['s']:.1f} s)" for k, v in r["kinds"].items())
    warm = (f"warm start {r['warm_length']} samples: {r['warm_s']:.1f} s, {r['warm_iterations']} it, "
            f"{r['warm_status']}\n" if "warm_s" in r else "no warm start\n")
    text = (f"T = {r['T']}: initialiser {r['init_s']:.1f} s (CPU {r['init_cpu_s']:.1f}; output-error polish "
            f"{r['polish_s']:.1f} s, {r['polish_iterations']} it, {r['polish_status']}), theta err {r['theta_err_init']:.2e}\n"
            + warm +
            f"CE-EM {r['ceem_s']:.1f} s (CPU {r['ceem_cpu_s']:.1f}): {r['status']} after {r['iterations']} iterations "
            f"[{kinds}; other {r['other_s']:.1f} s]\n"
            f"total {r['total_s']:.1f} s (CPU {r['total_cpu_s']:.1f}); theta err {r['theta_err']:.2e}; test RMS "
            f"{r['test_rms']:.4f} = {r['test_rms_over_noise']:.3f} x noise std (truth {r['test_rms_truth']:.4f}, "
            f"initialiser {r['test_rms_init']:.4f}); peak RSS {r['fit_peak_rss_mb']:.0f} MB to the end of the fit, "
            f"{r['peak_rss_mb']:.0f} MB with the floors' measurement; process CPU {r['process_cpu_s']:.1f} s")
    if "floor_floor_s" in r:
        text += (f"\nfloor of one iteration {r['floor_floor_s']:.2f} s (smoothing {r['floor_smooth_floor_s']:.2f}, "
                 f"learning {r['floor_learn_floor_s']:.2f}); median EM smoothing {r['floor_smooth_s']:.2f} s "
                 f"({r['floor_smooth_ratio']:.2f}x), learning {r['floor_learn_s']:.2f} s ({r['floor_learn_ratio']:.2f}x), "
                 f"joint step {r['floor_joint_s']:.2f} s ({r['floor_joint_s'] / r['floor_floor_s']:.2f}x the iteration's "
                 f"floor); outside the iterations {r['other_s']:.1f} s ({r['other_s'] / r['floor_floor_s']:.2f}x)")
    return text


def compare(row: dict, base: dict) -> dict:
    """This run against ``base`` (another run's JSON, e.g. of the previous release in the same session):
    wall and CPU ratios of the whole fit and of CE-EM, peak RSS ratio, the largest relative difference of
    theta (entries with |theta| >= 1e-3, else absolute), of J and of the test RMS."""
    out = {f"{k}_ratio": row[k] / base[k] for k in ("total_s", "total_cpu_s", "ceem_s", "ceem_cpu_s", "peak_rss_mb")
           if base.get(k)}
    if base.get("theta") and row.get("theta"):
        a, b = np.asarray(row["theta"]), np.asarray(base["theta"])
        out["theta_rel_diff"] = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-3)))
    out["J_rel_diff"] = abs(row["J"] - base["J"]) / abs(base["J"])
    out["test_rms_rel_diff"] = abs(row["test_rms"] - base["test_rms"]) / base["test_rms"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=float, default=1e6)
    ap.add_argument("--warm-start", type=int, default=None, help="CEEMOptions.warm_start (default: the policy)")
    ap.add_argument("--max-iters", type=int, default=50)
    ap.add_argument("--test-length", type=int, default=20_000)
    ap.add_argument("--no-floor", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--rss-phases", action="store_true", help="largest resident set per phase of the fit")
    ap.add_argument("--baseline", default=None, help="JSON of another run (e.g. the previous release) to compare with")
    args = ap.parse_args(argv)
    T, warm, test_n = int(args.length), args.warm_start, args.test_length
    if args.smoke:
        T, warm, test_n = 3000, 1000 if warm is None else warm, 2000
    row = run(T, warm, args.max_iters, not args.no_floor, test_n, phases=args.rss_phases)
    print(_format(row), flush=True)
    if row["rss_by_phase_mb"]:
        print("largest resident set by phase (MB): " + ", ".join(f"{k} {v}" for k, v in row["rss_by_phase_mb"].items()))
        print("seconds by phase: " + ", ".join(f"{k} {v}" for k, v in row["seconds_by_phase"].items()))
    if args.baseline:
        with open(args.baseline) as fh:
            row["baseline"] = compare(row, json.load(fh))
        print("against the baseline: " + ", ".join(f"{k} {v:.3g}" for k, v in row["baseline"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(row, fh, indent=1, default=str)
    return 0 if row["status"] == "converged" else 1


if __name__ == "__main__":
    sys.exit(main())
