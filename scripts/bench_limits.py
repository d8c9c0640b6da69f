"""Refusal times of crafted files and the time limits on long records (issue 33).

Prints, for each crafted file (a padded model file with valid digests, a model file whose
expression graph has 8.3M instructions, a model file with 100,000 history records), the size on
disk, the error line and the seconds to refuse it; with ``--time-limits`` also the wall-clock
time of ``ceem(time_limit=...)`` and of CLI ``fit --time-limit`` on long records against their
limits (minutes; several GB for 10^7 rows). ``--json`` prints the figures as JSON.

    python -m scripts.bench_limits [--time-limits] [--rows 1000000 10000000] [--json]

The crafting functions are also used by tests/test_contract.py at small sizes.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np


def small_model():
    import ceem_casadi as cc

    params = cc.Parameters(cc.Param("a", 0.6, lower=-2.0, upper=2.0), cc.Param("b", 0.4))
    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
                                            params=params, process_std=0.1, measurement_std=0.1, x1_mean=0.0,
                                            x1_std=1.0, name="lin")


def _valid_file(path: Path) -> Path:
    import ceem_casadi as cc

    return cc.save_model(path, small_model(), {"a": 0.8, "b": 0.5},
                         history=[{"iteration": 1, "J": 0.0, "theta": {"a": 0.8, "b": 0.5}}])


def craft(path, change) -> Path:
    """A model file rewritten with ``change(meta, arrays)`` and its digests recomputed (a forger's file)."""
    from ceem_casadi.deploy._modelfile import FORMAT, FORMAT_VERSION
    from ceem_casadi.io._archive import read_archive, write_archive

    path = Path(path)
    src = _valid_file(path.with_name("valid_" + path.name))
    meta, arrays = read_archive(src, expected_format=FORMAT, max_version=FORMAT_VERSION)
    meta.pop("sha256")
    change(meta, arrays)
    return write_archive(path, meta, arrays)


def padded_archive(path, pad_bytes: int) -> Path:
    """A valid model file with ``pad_bytes`` zero bytes (a sparse hole) between its zip members, and
    the file's SHA-256 recomputed: every digest holds, the zip directory skips the padding."""
    path = Path(path)
    src = _valid_file(path.with_name("valid_" + path.name))
    with zipfile.ZipFile(src) as zin, open(path, "w+b") as fh:
        with zipfile.ZipFile(fh, "w") as zout:
            for k, info in enumerate(zin.infolist()):
                if k == 1:  # the hole: the central directory records the true offsets
                    zout.start_dir += pad_bytes
                zout.writestr(info, zin.read(info))
            zout.comment = b"0" * 64
        fh.flush()
        fh.seek(0)
        size = path.stat().st_size
        h = hashlib.sha256()
        left = size - 64
        while left > 0:
            chunk = fh.read(min(left, 2 ** 24))
            h.update(chunk)
            left -= len(chunk)
        fh.seek(size - 64)
        fh.write(h.hexdigest().encode())
    return path


def huge_graph(path, n_instructions: int) -> Path:
    """A model file whose ``f`` graph has ``n_instructions`` rows (a chain of additions of x)."""
    import casadi as ca

    def change(meta, arrays):
        n = n_instructions
        code = np.empty((n, 4), dtype=np.int64)
        code[0] = (ca.OP_INPUT, 0, 0, 0)
        code[1:n - 1] = (ca.OP_ADD, 0, 0, 0)  # work[0] = work[0] + work[0]
        code[n - 1] = (ca.OP_OUTPUT, 0, 0, 0)
        arrays["sx/f/code"], arrays["sx/f/const"] = code, np.zeros(n)
        arrays["sx/f/shape"] = np.array([1, 1, 2, 1, 1], dtype=np.int64)
    return craft(path, change)


def long_history(path, n_records: int) -> Path:
    """A model file with ``n_records`` iteration records."""
    def change(meta, arrays):
        meta["history"] = [{"iteration": i, "J": 0.0} for i in range(n_records)]
    return craft(path, change)


def time_refusal(command: list[str]) -> tuple[float, int, str]:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "ceem_casadi.cli", *command], capture_output=True, text=True)
    return time.perf_counter() - t, p.returncode, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""


def refusals(tmp: Path) -> list[dict]:
    from ceem_casadi.deploy._modelfile import load_model
    from ceem_casadi.io._archive import ModelFileError

    cases = [("padded archive 1.5 GB", lambda p: padded_archive(p, int(1.5e9)), ["evaluate"]),
             ("graph 8.3M instructions", lambda p: huge_graph(p, 8_300_000), ["evaluate"]),
             ("history 100,000 records", lambda p: long_history(p, 100_000), ["plot"])]
    data = tmp / "d.csv"
    data.write_text("t,y0,u0\n" + "".join(f"{k},{np.sin(k)},{np.cos(k)}\n" for k in range(50)))
    t_start, _, _ = time_refusal(["--help"])  # the interpreter's and the imports' share of every CLI time
    rows = [{"case": "CLI start-up (--help)", "cli_s": round(t_start, 2)}]
    for name, make, cmd in cases:
        path = make(tmp / f"{cmd[0]}_{len(rows)}.npz")
        t = time.perf_counter()
        try:
            load_model(path)
            err = "LOADED"
        except ModelFileError as exc:
            err = str(exc)
        t_api = time.perf_counter() - t
        argv = [*cmd, "--model-file", str(path)] + (["--data", str(data)] if cmd[0] == "evaluate" else
                                                     ["--out-dir", str(tmp / "figs")])
        t_cli, code, line = time_refusal(argv)
        rows.append({"case": name, "file_MB": round(path.stat().st_size / 1e6, 1), "refused_s": round(t_api, 3),
                     "cli_s": round(t_cli, 2), "cli_exit": code, "error": (line or err)[:160]})
        path.unlink()
    return rows


def _fit_rows(tmp: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    u = rng.standard_normal(n)
    x = np.zeros(n)
    for k in range(1, n):  # a few seconds for 10^7
        x[k] = 0.8 * x[k - 1] + 0.5 * u[k - 1]
    path = tmp / f"rows_{n}.npz"
    np.savez(path, y=(x + 0.1 * rng.standard_normal(n))[:, None], u=u[:, None])
    return path


def time_limits(tmp: Path, sizes: list[int]) -> list[dict]:
    out = []
    model_py = tmp / "lin.py"
    model_py.write_text("import ceem_casadi as cc\n\ndef make():\n"
                        "    params = cc.Parameters(cc.Param('a', 0.6, lower=-2.0, upper=2.0), cc.Param('b', 0.4))\n"
                        "    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, "
                        "lambda x, u, p: x, nx=1, nu=1, params=params, process_std=0.1, measurement_std=0.1, "
                        "x1_mean=0.0, x1_std=1.0, name='lin')\n")
    for n in sizes:
        data = _fit_rows(tmp, n)
        limit = 20 if n >= 10 ** 7 else 5
        cmd = [sys.executable, "-m", "ceem_casadi.cli", "fit", "--model", f"{model_py}:make", "--data", str(data),
               "--max-iters", "1", "--time-limit", str(limit), "--out", str(tmp / f"m{n}.npz")]
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2 ** 20
        out.append({"case": f"CLI fit --max-iters 1 --time-limit {limit}, {n} rows", "limit_s": limit,
                    "wall_s": round(wall, 1), "ratio": round(wall / limit, 2), "exit": p.returncode,
                    "peak_child_GB_so_far": round(peak, 2), "stderr": p.stderr.strip().splitlines()[-1:]})
        data.unlink()
    import ceem_casadi as cc

    model = small_model()
    n = sizes[0]
    rng = np.random.default_rng(1)
    u = rng.standard_normal((n, 1))
    data, _ = cc.simulate(model, {"a": 0.8, "b": 0.5}, np.zeros((1, 1)), n, u=[u], process_std=0.05,
                          measurement_std=0.1, seed=2)
    t = time.perf_counter()
    res = cc.ceem(model, data, {"a": 0.6, "b": 0.4}, options=cc.CEEMOptions(time_limit=10))
    wall = time.perf_counter() - t
    out.append({"case": f"ceem(time_limit=10) on {n} samples", "limit_s": 10, "wall_s": round(wall, 1),
                "ratio": round(wall / 10, 2), "status": res.status})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limits", action="store_true", help="also measure the long-record time limits")
    ap.add_argument("--rows", type=int, nargs="+", default=[10 ** 6, 10 ** 7])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows = refusals(tmp)
        if args.time_limits:
            rows += time_limits(tmp, args.rows)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(" | ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
