"""Run the commands of ``docs/own_data.md`` in order (its ```bash blocks, then its ```python block).

On the real Cascaded Tanks data (default; from the repository root, as the tutorial says) this
regenerates the outputs quoted in the tutorial. ``--smoke`` runs the same sequence in a temporary
folder on 200 simulated samples of the tanks model (``--max-iters``/``max_iters`` cut to 3,
``--grid`` to two levels): ``tests/test_docs_own_data.py`` does this so that the tutorial cannot
silently rot. ``ceem-casadi`` is run as ``python -m ceem_casadi.cli`` of this checkout.

    python -m scripts.own_data_tutorial [--smoke] [--workdir DIR] [--json log.json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "own_data.md"
DOC_DATA = "../shared/data/cascaded_tanks/dataBenchmark.csv"
CLI = "ceem-casadi"


def doc_blocks(path: Path = DOC) -> list[tuple[str, str]]:
    """(language, code) of every fenced ```bash and ```python block, in order."""
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"^```(bash|python)\n(.*?)^```", Path(path).read_text(), re.S | re.M)]


def shell_commands(code: str) -> list[str]:
    """The commands of a bash block (continuation lines joined, comments and blank lines dropped)."""
    return [c.strip() for c in code.replace("\\\n", " ").splitlines() if c.strip() and not c.strip().startswith("#")]


def adapt(text: str, *, data: str, smoke: bool, compile_c: bool = True) -> str:
    """A command (or the Python block) as run here: this checkout's CLI, the model file by absolute
    path, the data path given; with ``smoke``, 3 iterations and two noise levels."""
    text = text.replace(f"{CLI} ", f"{sys.executable} -m ceem_casadi.cli ")
    text = text.replace(DOC_DATA, data).replace("models/cascaded_tanks.py", str(ROOT / "models" / "cascaded_tanks.py"))
    if smoke:
        text = re.sub(r"--max-iters \d+", "--max-iters 3", text)
        text = re.sub(r"max_iters=\d+", "max_iters=3", text)
        text = re.sub(r"--grid [\d.,]+", "--grid 1,10", text)
        text = re.sub(r"grid=\[[\d., ]+\]", "grid=[1, 10]", text)
    if not compile_c:
        text = text.replace(" --build-example", "")
    return text


def simulated_tanks_csv(path: Path, n: int = 200, seed: int = 0) -> Path:
    """``n`` samples of each split (columns uEst, uVal, yEst, yVal) simulated from the tanks model near
    the benchmark's fitted parameters: piecewise-constant pump voltages, process noise 0.01 V, sensor 0.05 V."""
    import pandas as pd

    import ceem_casadi as cc
    from models.cascaded_tanks import cascaded_tanks

    model = cascaded_tanks()
    theta = {**model.params.initial(), "kp": 0.045, "a1": 0.03, "a2": 0.04, "b1": 0.003, "kov": 0.9,
             "h1max": 9.9, "h2max": 9.9, "u0": 0.7}
    rng = np.random.default_rng(seed)
    us = [np.repeat(rng.uniform(2.0, 8.0, n // 20 + 1), 20)[:n, None] for _ in range(2)]
    data, _ = cc.simulate(model, theta, np.array([[5.0, 5.0], [4.0, 4.5]]), n, u=us, process_std=0.01,
                          measurement_std=0.05, seed=seed)
    pd.DataFrame({"uEst": us[0][:, 0], "uVal": us[1][:, 0], "yEst": data.y[0][:, 0], "yVal": data.y[1][:, 0],
                  "Ts": [4.0] + [np.nan] * (n - 1)}).to_csv(path, index=False)
    return path


def _in_process(lang: str, cmd: str, workdir: Path, env: dict) -> tuple[int, str, str]:
    """Run a ``ceem-casadi`` command (``main(argv)``) or the Python block in this process (no
    interpreter start-up per command: the test's mode); returns (exit code, stdout, stderr)."""
    import contextlib
    import io
    import shlex

    from ceem_casadi.cli._main import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(workdir), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if lang == "python":
            exec(compile(cmd, "docs/own_data.md", "exec"), {"__name__": "__own_data__"})
            rc = 0
        else:
            argv = [os.path.expandvars(a.replace("$DATA", env.get("DATA", "$DATA"))) for a in shlex.split(cmd)]
            rc = cli_main(argv[1:])
    return rc, out.getvalue(), err.getvalue()


def run_tutorial(workdir: Path, data: str, *, smoke: bool, echo: bool = True, in_process: bool = False) -> list[dict]:
    """Run every command of the tutorial in ``workdir``; a shell variable assignment (``DATA=...``)
    holds for the later commands. ``in_process``: the ``ceem-casadi`` commands and the Python block
    run in this process, other shell commands in bash. Returns one record per command (command,
    rc, seconds, output)."""
    from ceem_casadi.deploy._codegen import compiler

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    log = []
    for lang, code in doc_blocks():
        cmds = shell_commands(code) if lang == "bash" else [code]
        for cmd in cmds:
            if lang == "bash" and re.fullmatch(r"[A-Z_]+=\S+", cmd):
                name, value = cmd.split("=", 1)
                env[name] = adapt(value, data=data, smoke=smoke)
                continue
            if lang == "bash" and compiler() is None and "./tanks/c/" in cmd:
                continue
            t0 = time.perf_counter()
            run_cmd = adapt(cmd, data=data, smoke=smoke, compile_c=compiler() is not None)
            if in_process and (lang == "python" or cmd.startswith(f"{CLI} ")):
                rc, stdout, stderr = _in_process(lang, run_cmd.replace(f"{sys.executable} -m ceem_casadi.cli ",
                                                                       f"{CLI} "), workdir, env)
            else:
                args = [sys.executable, "-c", run_cmd] if lang == "python" else ["bash", "-o", "pipefail", "-c", run_cmd]
                proc = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True)
                rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
            rec = {"command": cmd, "language": lang, "rc": rc, "seconds": round(time.perf_counter() - t0, 2),
                   "stdout": stdout, "stderr": stderr}
            log.append(rec)
            if echo:
                print(f"$ {cmd}\n{stdout}{stderr}[rc {rc}, {rec['seconds']} s]\n", flush=True)
    return log


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="200 simulated samples, 3 iterations, in a temporary folder")
    ap.add_argument("--workdir", help="folder to run in (default: the repository root; --smoke: a temporary one)")
    ap.add_argument("--json", help="write the log (commands, exit codes, seconds, outputs) here")
    args = ap.parse_args(argv)
    tmp = None
    if args.smoke:
        tmp = Path(tempfile.mkdtemp(prefix="own_data_"))
        workdir = Path(args.workdir or tmp)
        data = str(simulated_tanks_csv(workdir / "tanks_sim.csv"))
    else:
        workdir, data = Path(args.workdir or ROOT), str((ROOT / DOC_DATA).resolve())
        workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log = run_tutorial(workdir, data, smoke=args.smoke)
    total = time.perf_counter() - t0
    print(f"{len(log)} commands, {total:.0f} s; exit codes {[r['rc'] for r in log]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"smoke": args.smoke, "seconds": total, "log": log}, indent=1))
    if tmp is not None and args.workdir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if all(r["rc"] in (0, 1) for r in log) else 1


if __name__ == "__main__":
    sys.exit(main())
