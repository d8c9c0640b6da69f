"""First build of the six-coupled-Lorenz stage Functions (issue 17, "First build").

Builds, with an EMPTY compile cache, every stage Function a six-coupled-Lorenz CE-EM fit with
``acceleration="newton"`` compiles (smoother: costs, state gradients and Gauss-Newton Hessians;
learner: the parameter Jacobian; joint steps: residual Jacobians), in a fresh subprocess per
variant, and reports per variant the wall time of the build, the CPU seconds of the compilers
(``os.wait4`` rusage of the child, which includes gcc), and the evaluation time of the compiled
``dyn_x_hess_triu`` and ``dyn_p_jac`` per stage (mapped over 2,000 stages; the runtime cost of a
flag set). Then a second build in the same cache (``cached_s``: loaded, not compiled).

Variants: ``jobs`` parallel compilers (1 = one after the other, as before issue 17) and the
optimisation flag: ``auto`` (the library's policy: ``-O1``, ``-O0`` for programs over
``O1_MAX_INSTRUCTIONS``), ``-O1`` for all (as before issue 17) or ``-O0`` for all.

    python -m scripts.bench_first_build [--variants 2:auto,1:-O1,2:-O1,2:-O0] [--json PATH|-]

Timings on a shared machine are noisy: compare variants of the same run; gcc's CPU seconds are
less sensitive to the load than its wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GROUPS = (("obs_cost", "dyn_cost", "obs_x_grad", "dyn_x_grad", "obs_x_hess_triu", "dyn_x_hess_triu"),
          ("dyn_p_jac",), ("obs_res_jac", "dyn_res_jac"))
TIMED = ("dyn_x_hess_triu", "dyn_p_jac")


def _eval_us(fun, raw, n: int = 2000, reps: int = 5) -> float:
    """Microseconds per stage of ``fun`` mapped over n stages (inputs converted once)."""
    import casadi as ca

    rng = np.random.default_rng(0)
    shared = ("p", "iw", "iv")
    args = [ca.DM(rng.standard_normal((raw.size1_in(i), raw.size2_in(i) * (1 if raw.name_in(i) in shared else n))))
            for i in range(raw.n_in())]
    X = [ca.MX.sym(f"a{i}", a.shape[0], a.shape[1]) for i, a in enumerate(args)]
    loop = ca.Function("loop", X, fun.map(n).call(X))
    loop.call(args)
    t0 = time.perf_counter()
    for _ in range(reps):
        loop.call(args)
    return (time.perf_counter() - t0) / reps / n * 1e6


def child(opt: str) -> dict:
    """Build all groups (compile on), time it; then time the compiled Functions."""
    from ceem_casadi import compile as cmp
    from ceem_casadi.stages import StageFunctions
    from models import lorenz

    if opt != "auto":  # one level for every Function instead of the library's opt_level policy
        cmp.COMPILE_FLAGS = (opt, *cmp.COMPILE_FLAGS[1:])
        cmp.O1_MAX_INSTRUCTIONS = 10**12
    truth, C = lorenz.coupled_truth(6, seed=0)
    model = lorenz.coupled_lorenz(6, C, process_std=1e-3)
    st = StageFunctions(model, "gauss-newton", compile=True)
    t0 = time.perf_counter()
    for g in GROUPS:
        st.instructions(g)
    sx_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for g in GROUPS:
        st.get(*g)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = StageFunctions(model, "gauss-newton", compile=True)
    for g in GROUPS:
        again.get(*g)
    cached_s = time.perf_counter() - t0
    ev = {f"eval_us_{n}": _eval_us(st.get(n)[0], st._build(n)) for n in TIMED}
    ev.update({f"eval_us_{n}_vm": _eval_us(st._build(n), st._build(n), reps=1) for n in TIMED[:1]})
    return {"sx_build_s": sx_s, "compile_wall_s": build_s, "cached_s": cached_s,
            "instructions": {n: st._build(n).n_instructions() for g in GROUPS for n in g}, **ev}


def run_variant(jobs: int, opt: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="ceem_build_") as cache, tempfile.TemporaryFile() as out, \
            tempfile.TemporaryFile() as err:
        env = {**os.environ, "CEEM_CACHE": cache, "CEEM_COMPILE_JOBS": str(jobs),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "scripts.bench_first_build", f"--child={opt}"], cwd=ROOT,
                                env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        text = out.read().decode()
        if os.waitstatus_to_exitcode(status) != 0:
            return {"jobs": jobs, "opt": opt, "error": err.read().decode(errors="replace")[-1500:]}
    row = {"jobs": jobs, "opt": opt, **json.loads(text.strip().splitlines()[-1])}
    # CPU of the child's own children (gcc, cc1, as, ld) = the whole child's CPU minus its own
    row["process_s"] = wall
    row["process_cpu_s"] = usage.ru_utime + usage.ru_stime
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="2:auto,1:-O1,2:-O1,2:-O0", help="jobs:flag,...")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        import resource

        row = child(args.child)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        row["gcc_cpu_s"] = kids.ru_utime + kids.ru_stime
        print(json.dumps(row))
        return 0
    rows = []
    for v in args.variants.split(","):
        jobs, opt = v.split(":")
        row = run_variant(int(jobs), opt)
        rows.append(row)
        if args.json != "-":
            print({k: (round(x, 2) if isinstance(x, float) else x) for k, x in row.items() if k != "instructions"},
                  flush=True)
    if args.json == "-":
        print(json.dumps(rows, indent=1))
    elif args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
