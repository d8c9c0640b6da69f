"""Compile small CasADi Functions to native code once and cache the shared library on disk.

The stage Functions of a model (one time step's cost, gradient, Hessian or Jacobian) are
short straight-line SX programs; compiled with ``gcc -O1`` they run ~10x faster than CasADi's
virtual machine (see ``CASADI_NOTES.md``). All Functions of one model go into one C file; the
library is cached under ``$CEEM_CACHE`` (default ``~/.cache/ceem_casadi``) keyed by the SHA-256
of the generated source and the compiler flags, so the compile cost is paid once per model.

Compiled Functions are loaded with ``ca.external`` and provide values only: the smoother and
the learner never ask CasADi to differentiate them (they pass grad_f and hess_lag explicitly).
"""
from __future__ import annotations

import hashlib
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


def compile_functions(functions: list[ca.Function], name: str = "ceem_stages",
                      timeout_s: float = 600.0) -> list[ca.Function]:
    """Compiled versions of ``functions`` (same names, inputs and outputs), from the cache when
    the same source was compiled before. Raises ``RuntimeError`` when no compiler is found or
    compilation fails (the caller may fall back to the uncompiled Functions)."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set $CC or install gcc) to compile stage functions")
    src = _source(functions, name)
    key = hashlib.sha256((src + cc + " ".join(FLAGS) + ca.__version__).encode()).hexdigest()[:24]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"{name}_{key}.so"
    if not lib.exists():
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
            os.replace(so_tmp, lib)  # atomic: concurrent processes never see a partial library
    else:
        log.debug("using cached %s", lib)
    return [ca.external(f.name(), str(lib)) for f in functions]
