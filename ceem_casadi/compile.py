"""Compile small CasADi Functions to native code once and cache the shared library on disk.

The stage Functions of a model (one time step's cost, gradient, Hessian or Jacobian) are
short straight-line SX programs; compiled with ``gcc -O1`` they run ~10x faster than CasADi's
virtual machine (see ``CASADI_NOTES.md``). Each Function of a group goes into its own C file,
compiled in parallel processes (:func:`compile_jobs`) and linked into one library; the
library is cached under ``$CEEM_CACHE`` (default ``~/.cache/ceem_casadi``) keyed by
:func:`cache_key`: the SHA-256 of the serialized Functions (``f.serialize()``, the whole SX
program), their optimisation levels, the code-generation options, the compiler and its version,
the flags and the CasADi version, so the compile cost is paid once per model and a cached library
is loaded without generating its C source. Next to each library ``<name>.so`` a record ``<name>.json``
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
import time
from pathlib import Path

import casadi as ca

log = logging.getLogger(__name__)
COMPILE_FLAGS = ("-O1", "-fPIC", "-fno-math-errno")  # the first is the optimisation level, see opt_level
# gcc -O1 time grows super-linearly in the program length: six coupled Lorenz, dyn_p_jac (67k SX
# instructions) 35 s of gcc CPU at -O1, 3.6 s at -O0, and -O0 code ran 1.5-1.8x slower
# (dyn_x_hess, dyn_p_jac): programs longer than this are compiled at -O0
O1_MAX_INSTRUCTIONS = 60_000
LINK_FLAGS = ("-shared",)
FLAGS = COMPILE_FLAGS + LINK_FLAGS  # recorded with every library (a change rebuilds the cache)


def cache_dir() -> Path:
    return Path(os.environ.get("CEEM_CACHE", Path.home() / ".cache" / "ceem_casadi"))


def compiler() -> str | None:
    """The C compiler to use (``$CC`` or gcc/cc on PATH), or None."""
    for cc in (os.environ.get("CC"), "gcc", "cc"):
        if cc and shutil.which(cc):
            return cc
    return None


CODEGEN_OPTIONS = {"with_header": False, "casadi_real": "double"}
KEY_SCHEME = "serialized-v1"  # change when the key's contents change (old libraries are then not found)


def _source(functions: list[ca.Function], name: str) -> str:
    gen = ca.CodeGenerator(name, dict(CODEGEN_OPTIONS))
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


def _run_all(cmds: list[list[str]], jobs: int, timeout_s: float, name: str) -> None:
    """Run the commands, at most ``jobs`` at a time, each in its own process group (a timeout
    also ends cc1); raise ``RuntimeError`` on failure or when all together exceed ``timeout_s``."""
    t_end = time.monotonic() + timeout_s
    pending, running = list(cmds), []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                running.append(subprocess.Popen(pending.pop(0), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                start_new_session=True))
            proc = running[0]
            try:
                _, err = proc.communicate(timeout=max(t_end - time.monotonic(), 0.001))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"compiling {name} took longer than {timeout_s} s") from None
            running.pop(0)
            if proc.returncode != 0:
                raise RuntimeError(f"compiling {name} failed: {err.decode(errors='replace')[-2000:]}")
    finally:
        for proc in running:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.communicate()


def cache_key(functions: list[ca.Function], name: str, cc: str) -> str:
    """Key of the library compiled from ``functions``: SHA-256 (24 hex digits) of each Function's
    serialization (its SX program, names and options: the generated C is a function of it and of
    the CasADi version), its optimisation level, the code-generation options, the library name,
    the compiler and its version, the flags and the CasADi version. Cheaper than generating the C
    source (six coupled Lorenz: ~0.05 s instead of ~0.2 s per big Function, and no C written)."""
    h = hashlib.sha256()
    for part in (KEY_SCHEME, name, repr(sorted(CODEGEN_OPTIONS.items())), cc, compiler_version(cc), " ".join(FLAGS),
                 ca.__version__):
        h.update(part.encode() + b"\0")
    for f in functions:
        h.update(opt_level(f).encode() + b"\0")
        h.update(hashlib.sha256(f.serialize().encode()).digest())
    return h.hexdigest()[:24]


def opt_level(f: ca.Function) -> str:
    """``-O1`` for stage programs up to ``O1_MAX_INSTRUCTIONS`` SX instructions, ``-O0`` above."""
    n = f.n_instructions() if f.is_a("SXFunction") else 0
    return COMPILE_FLAGS[0] if n <= O1_MAX_INSTRUCTIONS else "-O0"


def compile_jobs() -> int:
    """Parallel compiler processes: ``$CEEM_COMPILE_JOBS``, else the number of CPUs."""
    env = os.environ.get("CEEM_COMPILE_JOBS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"CEEM_COMPILE_JOBS must be a positive integer, got {env!r}") from None
    return max(1, os.cpu_count() or 1)


def compile_functions(functions: list[ca.Function], name: str = "ceem_stages",
                      timeout_s: float = 600.0, jobs: int | None = None) -> list[ca.Function]:
    """Compiled versions of ``functions`` (same names, inputs and outputs), from the cache when
    the same source was compiled before. Raises ``RuntimeError`` when no compiler is found or
    compilation fails (the caller may fall back to the uncompiled Functions).

    Each Function is generated into its own C file and compiled to an object file, up to
    ``jobs`` (default :func:`compile_jobs`) compilers at a time, then linked into one library:
    gcc's time is dominated by the longest Function instead of the sum; programs longer than
    ``O1_MAX_INSTRUCTIONS`` are compiled at ``-O0`` (:func:`opt_level`). Six coupled Lorenz:
    see ``docs/scaling.md``."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set $CC or install gcc) to compile stage functions")
    key = cache_key(functions, name, cc)
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    lib = folder / f"{name}_{key}.so"
    problem = verified(lib, cc) if lib.exists() else None
    if problem is not None:
        log.warning("compile cache: %s is not used: %s; rebuilding it", lib, problem)
    if not lib.exists() or problem is not None:
        sources = [_source([f], f"{name}_{i}") for i, f in enumerate(functions)]
        levels = [opt_level(f) for f in functions]
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            so_tmp, objects, cmds = Path(tmp) / "lib.so", [], []
            # biggest first: with fewer compilers than files the longest one starts at once
            for i in sorted(range(len(sources)), key=lambda i: -len(sources[i])):
                c_file, o_file = Path(tmp) / f"{name}_{i}.c", Path(tmp) / f"{name}_{i}.o"
                c_file.write_text(sources[i])
                objects.append(str(o_file))
                cmds.append([cc, levels[i], *COMPILE_FLAGS[1:], "-c", str(c_file), "-o", str(o_file)])
            log.info("compiling %d stage functions (%d bytes of C, %d jobs): %s", len(functions),
                     sum(map(len, sources)), jobs or compile_jobs(), " ".join(cmds[0]))
            _run_all(cmds, jobs or compile_jobs(), timeout_s, name)
            _run_all([[cc, *LINK_FLAGS, *objects, "-o", str(so_tmp), "-lm"]], 1, timeout_s, name)
            rec_tmp = Path(tmp) / "lib.json"
            rec_tmp.write_text(json.dumps({**_record(cc), "sha256": _file_sha256(so_tmp)}))
            os.replace(rec_tmp, lib.with_suffix(".json"))
            os.replace(so_tmp, lib)  # atomic: concurrent processes never see a partial library
    else:
        log.debug("using cached %s", lib)
    return [ca.external(f.name(), str(lib)) for f in functions]
