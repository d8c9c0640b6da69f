"""Where the time of a long-record fit goes (issue 17): one ``cc.ceem`` fit of ONE trajectory
(``scripts/bench_scale_records`` problems: single Lorenz by default) timed phase by phase.

Each fit runs in a fresh subprocess (peak RSS of that child alone, ``os.wait4``). Inside it the
library's entry points are wrapped with wall-clock timers for the duration of the fit (the
library itself is not changed): solver construction (``TrajectorySmoother``, ``Learner``,
``JointGaussNewton``), the EKF/RTS initial states (``eks_states``), every smoothing solve,
learning solve (``Learner`` or the client-side ``RemoteLearner``) and joint Newton step (with
its solver iterations), every evaluation of the
joint log-density J, the final identifiability check, and ``other`` = the fit's wall time
minus all of these (data checks, copies, the loop's bookkeeping). Per phase: total seconds,
calls, share of the fit, and the single calls (seconds, iterations).

    python -m scripts.bench_record_phases [--lengths 100000,1000000] [--model lorenz]
                                          [--max-iters 30] [--json PATH|-]

Timings on a loaded machine are inflated: compare shares (ratios) within a run.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench_scale_records import write_rows

ROOT = Path(__file__).resolve().parents[1]

# (phase, module, attribute path): the callables timed during the fit
TARGETS = (
    ("smoother_build", "ceem_casadi.smoothing._smoother", "TrajectorySmoother.__init__"),
    ("learner_build", "ceem_casadi.learning._learner", "Learner.__init__"),
    ("joint_build", "ceem_casadi.em._joint_gauss_newton", "JointGaussNewton.__init__"),
    ("initial_states", "ceem_casadi.em._ceem", "eks_states"),
    ("smoothing", "ceem_casadi.smoothing._smoother", "TrajectorySmoother.solve"),
    ("learning", "ceem_casadi.learning._learner", "Learner.solve"),
    ("learning", "ceem_casadi.learning._remote", "RemoteLearner.solve"),  # distributed / piecewise
    ("newton_step", "ceem_casadi.em._joint_gauss_newton", "JointGaussNewton.step"),
    ("evaluate_J", "ceem_casadi.smoothing._smoother", "Smoother.joint_log_density"),
    ("final_check", "ceem_casadi.em._ceem", "_check_learning_hessian"),
)


@contextlib.contextmanager
def phase_timers(calls: dict, stack: list | None = None):
    """Wrap every ``TARGETS`` callable; append ``(seconds, iterations or None)`` to
    ``calls[phase]`` per call; restore the originals on exit. ``stack``: the phases being run are
    pushed on it and popped (its last entry is the current phase)."""
    import importlib

    patched = []
    for phase, module, path in TARGETS:
        owner = importlib.import_module(module)
        *parents, name = path.split(".")
        for p in parents:
            owner = getattr(owner, p)
        original = getattr(owner, name)

        def timed(*args, __f=original, __phase=phase, **kw):
            t0 = time.perf_counter()
            (stack if stack is not None else []).append(__phase)
            try:
                out = __f(*args, **kw)
            finally:
                if stack:
                    stack.pop()
            calls.setdefault(__phase, []).append((time.perf_counter() - t0, getattr(out, "iterations", None)))
            return out

        setattr(owner, name, functools.wraps(original)(timed))
        patched.append((owner, name, original))
    try:
        yield calls
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def run_one(model_name: str, T: int, max_iters: int = 30) -> dict:
    """One timed fit in this process (the child's work)."""
    import ceem_casadi as cc
    from scripts.bench_scale_records import make_problem, theta_error

    t0 = time.perf_counter()
    model, data, truth, theta0 = make_problem(model_name, T)
    data_s = time.perf_counter() - t0
    calls: dict = {}
    with phase_timers(calls):
        t0 = time.perf_counter()
        res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=max_iters, acceleration="newton"))
        fit_s = time.perf_counter() - t0
    phases = {k: {"s": sum(c[0] for c in v), "calls": len(v), "each": [[round(c[0], 3), c[1]] for c in v]}
              for k, v in calls.items()}
    phases["other"] = {"s": fit_s - sum(p["s"] for p in phases.values()), "calls": 1, "each": []}
    return {"model": model_name, "T": T, "fit_s": fit_s, "data_s": data_s, "iterations": res.iterations,
            "J": res.J, "theta_err": theta_error(model, res.theta, truth), "status": str(res.status),
            "kinds": [r.kind for r in res.history], "phases": phases}


def run_child(model_name: str, T: int, max_iters: int) -> dict:
    """``run_one`` in a fresh subprocess, with ``peak_rss_mb`` of that child (os.wait4)."""
    cmd = [sys.executable, "-m", "scripts.bench_record_phases", "--child", model_name, str(T), str(max_iters)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        return {"model": model_name, "T": T, "status": "error", "error": stderr[-1500:],
                "peak_rss_mb": usage.ru_maxrss / 1024.0}
    row = json.loads(stdout.strip().splitlines()[-1])
    row["peak_rss_mb"] = usage.ru_maxrss / 1024.0
    return row


def format_row(r: dict) -> str:
    if r.get("status") == "error":
        return f"{r['model']} T={r['T']}: ERROR {r['error'][-400:]}"
    lines = [f"{r['model']} T={r['T']}: fit {r['fit_s']:.1f} s, {r['iterations']} iterations "
             f"({' '.join(r['kinds'])}), peak RSS {r['peak_rss_mb']:.0f} MB, J {r['J']:.9g}, "
             f"theta err {r['theta_err']:.2e}, {r['status']} (data simulation {r['data_s']:.1f} s, not in the fit)"]
    for name, p in sorted(r["phases"].items(), key=lambda kv: -kv[1]["s"]):
        each = ", ".join(f"{s:.2f}" + ("" if it is None else f" ({it} it)") for s, it in p["each"][:8])
        lines.append(f"  {name:<15} {p['s']:8.2f} s {100 * p['s'] / r['fit_s']:5.1f} %  x{p['calls']:<3} {each}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="100000")
    ap.add_argument("--model", default="lorenz")
    ap.add_argument("--max-iters", type=int, default=30)
    ap.add_argument("--json", default=None, help="write the rows as JSON to PATH ('-' = stdout)")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "T", "MAX_ITERS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(args.child[0], int(args.child[1]), int(args.child[2]))))
        return 0
    rows = []
    for T in [int(float(t)) for t in args.lengths.split(",")]:
        rows.append(run_child(args.model, T, args.max_iters))
        if args.json != "-":
            print(format_row(rows[-1]), flush=True)
    return write_rows(rows, args.json)


if __name__ == "__main__":
    sys.exit(main())
