"""First build of the six-coupled-Lorenz stage Functions (issue 17, "First build").

Builds, with an EMPTY compile cache, every stage Function a six-coupled-Lorenz CE-EM fit with
``acceleration="newton"`` compiles (smoother: costs, state gradients and Gauss-Newton Hessians;
learner: the parameter Jacobian; joint steps: residual Jacobians), in a fresh subprocess per
variant, and reports per variant the wall time of the build, the CPU seconds of the compilers
(``os.wait4`` rusage of the child, which includes gcc), a timeline of the compiler processes,
and the evaluation time per stage of the smoother's Hessian, the learner's Jacobian and the joint
step's Functions (mapped over 2,000 stages; the runtime cost of a flag set). Then a second build
in the same cache (``cached_s``: loaded, not compiled).

Variants ``jobs:mode`` (jobs = parallel compilers):

- ``auto``: the library as a fit uses it: every group queued at once (``StageFunctions.prefetch``,
  one pool of compilers), then fetched group by group; ``-O1 -fno-thread-jumps``, ``-O0`` above
  ``O1_MAX_INSTRUCTIONS``. ``auto+groups``: the same, each group compiled only when asked for
  (no prefetch: cores idle at each group's tail). ``auto@N``: with ``O1_MAX_INSTRUCTIONS = N``.
- ``-O1`` / ``-O0``: every Function at that level (the library's other flags).
- ``previous``: the build before this change (commit fd9eba5): the joint step's Functions carry
  their own copy of the parameter Jacobian (``obs_res_jac``, ``dyn_res_jac``), ``-O1`` without
  ``-fno-thread-jumps``, ``-O0`` above 60,000 instructions, groups one after another.
- ``legacy``: before issue 17: as ``previous`` with ``-O1`` everywhere (run it with 1 job).
- ``fit``: a whole Newton fit with library defaults (B = 2, T = 60, 4 iterations): its ``build_s``
  and digests of the fitted numbers (run it on two versions of the library to compare them).

    python -m scripts.bench_first_build [--variants 2:auto,2:auto+groups,2:previous,1:legacy] [--json PATH|-]

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
SMOOTHER = ("obs_cost", "dyn_cost", "obs_x_grad", "dyn_x_grad", "obs_x_hess_triu", "dyn_x_hess_triu")
GROUPS = (SMOOTHER, ("dyn_p_jac",), ("obs_res_jac_x", "dyn_res_jac_z", "dyn_p_jac"))  # smoother, learner, joint
OLD_GROUPS = (SMOOTHER, ("dyn_p_jac",), ("obs_res_jac", "dyn_res_jac"))
JOINT, OLD_JOINT = GROUPS[2], OLD_GROUPS[2]
OLD_FLAGS = ("-O1", "-fPIC", "-fno-math-errno")


def _eval_us(fun, raw, n: int = 2000, reps: int = 5) -> float:
    """Microseconds per stage of ``fun`` mapped over n stages (inputs converted once; best of reps)."""
    import casadi as ca

    rng = np.random.default_rng(0)
    shared = ("p", "iw", "iv")
    args = [ca.DM(rng.standard_normal((raw.size1_in(i), raw.size2_in(i) * (1 if raw.name_in(i) in shared else n))))
            for i in range(raw.n_in())]
    X = [ca.MX.sym(f"a{i}", a.shape[0], a.shape[1]) for i, a in enumerate(args)]
    loop = ca.Function("loop", X, fun.map(n).call(X))
    loop.call(args)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        loop.call(args)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def _old_joint_functions(model) -> dict:
    """The joint step's Functions before this change: residual, state and parameter Jacobians in one."""
    import casadi as ca

    x, xn = ca.SX.sym("x", model.nx), ca.SX.sym("x_next", model.nx)
    u, y, m = ca.SX.sym("u", model.nu), ca.SX.sym("y", model.ny), ca.SX.sym("m", model.ny)
    p, iw, iv = ca.SX.sym("p", model.params.size), ca.SX.sym("iw", model.nx), ca.SX.sym("iv", model.ny)
    r_obs, r_dyn = m * iv * (y - model.g(x, u, p)), iw * (xn - model.f(x, u, p))
    z, d = ca.vertcat(x, xn), ca.densify
    return {"obs_res_jac": ca.Function("obs_res_jac", [x, u, y, m, p, iv],
                                       [d(r_obs), d(ca.jacobian(r_obs, x)), d(ca.jacobian(r_obs, p))],
                                       ["x", "u", "y", "m", "p", "iv"], ["r", "jac_x", "jac_p"]),
            "dyn_res_jac": ca.Function("dyn_res_jac", [x, xn, u, p, iw],
                                       [d(r_dyn), d(ca.jacobian(r_dyn, z)), d(ca.jacobian(r_dyn, p))],
                                       ["x", "x_next", "u", "p", "iw"], ["r", "jac_z", "jac_p"])}


def fit_child() -> dict:
    """A whole Newton fit (B = 2, T = 60, 4 iterations, library defaults) in the empty cache: its
    ``build_s`` (compilation included) and SHA-256 digests of the fitted parameters and states
    (equal digests from two versions of the library = the same numbers, bit for bit)."""
    import hashlib

    import ceem_casadi as cc
    from models import lorenz

    truth, C = lorenz.coupled_truth(6, seed=0)
    model = lorenz.coupled_lorenz(6, C, process_std=1e-3, measurement_std=0.01)
    data, _ = cc.simulate(model, truth, lorenz.initial_states(2, 6, seed=1), 60, measurement_std=0.01, seed=2)
    theta0 = lorenz.perturbed(truth, 0.1, seed=3, free_masks={"H": lorenz.coupling_mask(6)})
    t0 = time.perf_counter()
    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=4, acceleration="newton"))
    digest = lambda a: hashlib.sha256(np.ascontiguousarray(a, float).tobytes()).hexdigest()[:16]  # noqa: E731
    return {"fit_build_s": res.build_s, "fit_s": time.perf_counter() - t0, "kinds": [r.kind for r in res.history],
            "theta_sha256": digest(model.theta_vector(res.theta)),
            "x_sha256": digest(np.concatenate([np.ravel(x) for x in res.x]))}


def child(mode: str) -> dict:
    """Build all groups (compile on) as ``mode`` says, time it; then time the compiled Functions."""
    if mode == "fit":
        return fit_child()
    from ceem_casadi.objective import StageFunctions
    from ceem_casadi.runtime import _compile as cmp
    from models import lorenz

    old = mode in ("previous", "legacy")
    prefetch = mode.startswith("auto") and "+groups" not in mode
    if old:
        cmp.COMPILE_FLAGS, cmp.O1_MAX_INSTRUCTIONS = OLD_FLAGS, (60_000 if mode == "previous" else 10**12)
    elif mode in ("-O1", "-O0"):  # one level for every Function instead of the library's opt_level policy
        cmp.COMPILE_FLAGS, cmp.O1_MAX_INSTRUCTIONS = (mode, *cmp.COMPILE_FLAGS[1:]), 10**12
    elif "@" in mode:
        cmp.O1_MAX_INSTRUCTIONS = int(mode.split("@")[1].split("+")[0])
    cmp.FLAGS = cmp.COMPILE_FLAGS + cmp.LINK_FLAGS
    groups, joint = (OLD_GROUPS, OLD_JOINT) if old else (GROUPS, JOINT)
    truth, C = lorenz.coupled_truth(6, seed=0)
    model = lorenz.coupled_lorenz(6, C, process_std=1e-3)

    def stage_functions():
        st = StageFunctions(model, "gauss-newton", compile=True)
        if old:
            st._lazy.update({k: (lambda f=f: f) for k, f in _old_joint_functions(model).items()})
        return st

    st = stage_functions()
    t0 = time.perf_counter()
    for g in groups:
        st.instructions(g)
    sx_s = time.perf_counter() - t0
    t0, m0 = time.perf_counter(), time.monotonic()
    if prefetch:
        st.prefetch(*groups)
    for g in groups:
        st.get(*g)
    build_s = time.perf_counter() - t0
    timeline = sorted([j.label, j.cmd[1], round(j.started - m0, 3), round(j.ended - m0, 3)]
                      for j in cmp._IN_FLIGHT.values() if j.started is not None and j.ended is not None)
    t0 = time.perf_counter()
    again = stage_functions()
    for g in groups:
        again.get(*g)
    cached_s = time.perf_counter() - t0
    timed = ("dyn_x_hess_triu", "dyn_p_jac", *[n for n in joint if n != "dyn_p_jac"])
    ev = {n: _eval_us(st.get(n)[0], st._build(n)) for n in timed}
    return {"sx_build_s": sx_s, "compile_wall_s": build_s, "cached_s": cached_s,
            "eval_us": ev, "joint_eval_us": sum(ev[n] for n in joint),
            "levels": {n: cmp.opt_level(st._build(n)) for g in groups for n in g},
            "instructions": {n: st._build(n).n_instructions() for g in groups for n in g}, "timeline": timeline}


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
    ap.add_argument("--variants", default="2:auto,2:auto+groups,2:previous,1:legacy", help="jobs:mode,...")
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
            print({k: (round(x, 2) if isinstance(x, float) else x) for k, x in row.items()
                   if k not in ("instructions", "timeline", "levels")}, flush=True)
    if args.json == "-":
        print(json.dumps(rows, indent=1))
    elif args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
