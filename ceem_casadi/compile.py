"""Compile small CasADi Functions to native code once and cache the shared library on disk.

The stage Functions of a model (one time step's cost, gradient, Hessian or Jacobian) are
short straight-line SX programs; compiled with ``gcc -O1`` they run ~10x faster than CasADi's
virtual machine (see ``CASADI_NOTES.md``). All Functions of one model go into one C file; the
library is cached under ``$CEEM_CACHE`` (default ``~/.cache/ceem_casadi``) keyed by the SHA-256
of the generated source, the compiler and its version, the flags and the CasADi version, so the
compile cost is paid once per model. Next to each library ``<name>.so`` a record ``<name>.json``
holds the SHA-256 of the library's bytes and the versions it was built with; a library whose
bytes or versions do not match its record (truncated, overwritten, from another compiler) is
never loaded: it is rebuilt with a warning.

Compiled Functions are loaded with ``ca.external`` and provide values only: the smoother and
the learner never ask CasADi to differentiate them (they pass grad_f and hess_lag explicitly).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import casadi as ca

log = logging.getLogger(__name__)
FLAGS = ("-O1", "-fPIC", "-shared", "-fno-math-errno")


def cache_dir() -> Path:
    return Path(os.environ.get("CEEM_CACHE", Path.home() / ".cache" / "ceem_casadi"))


def compiler() -> str | None:
    """The C compiler to use (``$CC`` or gcc/cc on PATH), or None."""
    for cc in (os.environ.get("CC"), "gcc", "cc"):
        if cc and shutil.which(cc):
            return cc
    return None


def _source(functions: list[ca.Function], name: str) -> str:
    gen = ca.CodeGenerator(name, {"with_header": False, "casadi_real": "double"})
    for f in functions:
        gen.add(f)
    return gen.dump()


@functools.lru_cache(maxsize=8)
def compiler_version(cc: str) -> str:
    """First line of ``cc --version`` (empty when it cannot be run)."""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.splitlines()[0].strip() if out else ""


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _record(cc: str) -> dict:
    return {"casadi": ca.__version__, "compiler": cc, "compiler_version": compiler_version(cc), "flags": list(FLAGS)}


def verified(lib: Path, cc: str) -> str | None:
    """None when ``lib`` matches its record ``lib.with_suffix('.json')`` (digest and versions), else why not."""
    try:
        rec = json.loads(lib.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return "no readable record of its digest"
    if not isinstance(rec, dict):
        return "no readable record of its digest"
    want = _record(cc)
    for k, v in want.items():
        if rec.get(k) != v:
            return f"built with {k} {rec.get(k)!r}, now {v!r}"
    try:
        if rec.get("sha256") != _file_sha256(lib):
            return "its bytes do not match the SHA-256 recorded when it was built (damaged or replaced)"
    except OSError as exc:
        return f"unreadable ({exc})"
    return None


def compile_functions(functions: list[ca.Function], name: str = "ceem_stages",
                      timeout_s: float = 600.0) -> list[ca.Function]:
    """Compiled versions of ``functions`` (same names, inputs and outputs), from the cache when
    the same source was compiled before. Raises ``RuntimeError`` when no compiler is found or
    compilation fails (the caller may fall back to the uncompiled Functions)."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set $CC or install gcc) to compile stage functions")
    src = _source(functions, name)
    key = hashlib.sha256((src + cc + compiler_version(cc) + " ".join(FLAGS) + ca.__version__).encode()).hexdigest()[:24]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"{name}_{key}.so"
    problem = verified(lib, cc) if lib.exists() else None
    if problem is not None:
        log.warning("compile cache: %s is not used: %s; rebuilding it", lib, problem)
    if not lib.exists() or problem is not None:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            c_file, so_tmp = Path(tmp) / f"{name}.c", Path(tmp) / "lib.so"
            c_file.write_text(src)
            cmd = [cc, *FLAGS, str(c_file), "-o", str(so_tmp), "-lm"]
            log.info("compiling %d stage functions (%d bytes of C): %s", len(functions), len(src), " ".join(cmd))
            # own process group, so that a timeout also ends cc1
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            try:
                _, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.communicate()
                raise RuntimeError(f"compiling {name} took longer than {timeout_s} s") from None
            if proc.returncode != 0:
                raise RuntimeError(f"compiling {name} failed: {err.decode(errors='replace')[-2000:]}")
            rec_tmp = Path(tmp) / "lib.json"
            rec_tmp.write_text(json.dumps({**_record(cc), "sha256": _file_sha256(so_tmp)}))
            os.replace(rec_tmp, lib.with_suffix(".json"))
            os.replace(so_tmp, lib)  # atomic: concurrent processes never see a partial library
    else:
        log.debug("using cached %s", lib)
    return [ca.external(f.name(), str(lib)) for f in functions]
