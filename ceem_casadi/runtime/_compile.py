"""Compile small CasADi Functions to native code once and cache the shared libraries on disk, keyed by the
SHA-256 of the serialized Function, the compiler and the flags; a cache folder that cannot be used raises
`CompileCacheError` (callers fall back to the virtual machine). docs/runtime.md, "Native compilation"."""
from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

import casadi as ca

from ..errors import CeemError, OptionsError
from ._cache_guard import TMP_PREFIX, libraries, load_exact, safe_name, same_values, sweep
from ._compile_pool import DISK_ERRORS, FORKED, POOL, CompileJob

log = logging.getLogger(__name__)
# -fno-thread-jumps: gcc -O1 spent 75 % of its time threading the C's output guards (docs/runtime.md)
COMPILE_FLAGS = ("-O1", "-fno-thread-jumps", "-fPIC", "-fno-math-errno")  # the first: see opt_level
O1_MAX_INSTRUCTIONS = 120_000  # longer programs are compiled at -O0 (docs/runtime.md)
LINK_FLAGS = ("-shared",)
FLAGS = COMPILE_FLAGS + LINK_FLAGS  # recorded with every library (a change rebuilds the cache)
MAX_MB = 500  # the cache's default bound (MiB of libraries and records; the largest library seen: 11 MiB)
MAX_ATTEMPTS = 3  # loads of one library (a failed one is followed by a rebuild) before giving up


class CompileCacheError(CeemError, RuntimeError):
    """The compile cache folder cannot be written (read-only, full, not a folder); a ``RuntimeError``,
    so callers that compile automatically fall back to the CasADi virtual machine with a warning."""


def _cache_error(folder, why: str) -> CompileCacheError:
    return CompileCacheError(f"compile cache {folder}: {why}; free space there or set $CEEM_CACHE to a writable folder")


_WARNED: set = set()


def fallback_warning(logger, what: str, exc: Exception) -> None:
    """Log that ``what`` runs in the CasADi virtual machine because of ``exc``: a warning the first
    time per cache folder and kind of failure in this process, a debug message afterwards."""
    key = (str(cache_dir()), type(exc).__name__)
    level = logging.DEBUG if key in _WARNED else logging.WARNING
    _WARNED.add(key)
    logger.log(level, "%s not compiled (%s); using the CasADi virtual machine", what, exc)


def cache_dir() -> Path:
    return Path(os.environ.get("CEEM_CACHE", Path.home() / ".cache" / "ceem_casadi"))


def cache_max_bytes() -> float:
    """The cache's bound (bytes): ``$CEEM_CACHE_MAX_MB`` MiB (``inf``: none), default `MAX_MB`."""
    env = os.environ.get("CEEM_CACHE_MAX_MB") or str(MAX_MB)
    with contextlib.suppress(ValueError):
        if float(env) >= 0:
            return float(env) * 2 ** 20
    raise OptionsError(f"$CEEM_CACHE_MAX_MB: expected a number of MiB >= 0, got {env!r}")


CacheUsage = collections.namedtuple("CacheUsage", "folder libraries bytes max_bytes")


def compile_cache_usage() -> CacheUsage:
    """The compiled-library cache: its folder (``$CEEM_CACHE``), its libraries and their bytes (with their records),
    and its bound (``$CEEM_CACHE_MAX_MB``; each build evicts the least recently used beyond it); empty it with
    ``cc.runtime.clear_model_cache(disk=True)``.

    Returns
    -------
    CacheUsage
        A named tuple ``(folder, libraries, bytes, max_bytes)``.

    Raises
    ------
    OptionsError
        When ``$CEEM_CACHE_MAX_MB`` is not a number of MiB >= 0.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> usage = cc.runtime.compile_cache_usage()
    >>> usage.libraries >= 0 and usage.bytes >= 0 and usage.max_bytes > 0
    True
    """
    found = libraries(cache_dir())
    return CacheUsage(cache_dir(), len(found), sum(size for _, size in found.values()), cache_max_bytes())


def compiler() -> str | None:
    """The C compiler to use (``$CC`` or gcc/cc on PATH), or None."""
    return _find_compiler(os.environ.get("CC"), os.environ.get("PATH"))


@functools.lru_cache(maxsize=16)
def _find_compiler(cc_env: str | None, path: str | None) -> str | None:
    # cached: the lookup stats every PATH entry, and the EKF asks once per trajectory
    for cc in (cc_env, "gcc", "cc"):
        if cc and shutil.which(cc, path=path):
            return cc
    return None


CODEGEN_OPTIONS = {"with_header": False, "casadi_real": "double"}
KEY_SCHEME = "serialized-v1"  # change when the key's contents change (old libraries are then not found)


def _source(f: ca.Function, name: str) -> str:
    gen = ca.CodeGenerator(name, dict(CODEGEN_OPTIONS))
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


def _record(cc: str) -> dict:
    return {"casadi": ca.__version__, "compiler": cc, "compiler_version": compiler_version(cc), "flags": list(FLAGS)}


def verified(lib: Path, cc: str, key: str | None = None, function: str | None = None) -> str | None:
    """None when ``lib`` matches its record ``lib.with_suffix('.json')`` (digest, versions, and the
    cache ``key`` and ``function`` name it was built for, when given), else why not."""
    try:
        rec = json.loads(lib.with_suffix(".json").read_text())
    except (OSError, ValueError):
        rec = None
    if not isinstance(rec, dict):
        return "no readable record of its digest"
    want = {**_record(cc), "key": key, "function": function}
    for k, v in want.items():
        if v is not None and rec.get(k) != v:
            return f"built with {k} {rec.get(k)!r}, now {v!r}"
    try:
        if rec.get("sha256") != hashlib.sha256(lib.read_bytes()).hexdigest():
            return "its bytes do not match the SHA-256 recorded when it was built (damaged or replaced)"
    except OSError as exc:
        return f"unreadable ({exc})"
    return None


def cache_key(functions: list[ca.Function], name: str, cc: str) -> str:
    """Key of the library compiled from ``functions``: SHA-256 (24 hex digits) of each Function's
    serialization and optimisation level, the code-generation options, the library name, the
    compiler and its version, the flags and the CasADi version."""
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
    try:
        return max(1, int(env) if env else os.cpu_count() or 1)
    except ValueError:
        raise ValueError(f"CEEM_COMPILE_JOBS must be a positive integer, got {env!r}") from None


class CompiledHandle:
    """A Function being compiled (or found in the cache): `result` waits and loads it."""

    def __init__(self, f: ca.Function, group: str, lib: Path, job: CompileJob | None, deadline: float):
        self.f, self.group, self.lib, self.job, self.deadline = f, group, lib, job, deadline
        self.attempt = 1  # the loads of this library tried, this one included (`_again`)

    def result(self) -> ca.Function:
        """The compiled Function (``ca.external``); ``RuntimeError`` when compilation failed or timed out. A library
        that does not load or disagrees at a random point is rebuilt, with a warning (quietly when another process
        removed it), at most `MAX_ATTEMPTS` loads in all."""
        if self.job is not None:
            try:
                self.job.wait(self.deadline)
            except RuntimeError as exc:
                if self.job.disk_error:  # the folder's fault (full, read-only): the caller falls back
                    why = next((t for t in DISK_ERRORS if t in str(exc)), str(exc).splitlines()[0][:200])
                    raise _cache_error(self.lib.parent, f"compiling {self.f.name()} failed ({why})") from None
                if self.job.error != FORKED:
                    raise
                return self._again()
        with contextlib.suppress(OSError):
            os.utime(self.lib)  # its last use, for the least-recently-used eviction
        try:
            out = load_exact(self.f.name(), self.lib)
        except RuntimeError as exc:
            out, why = None, f"it does not load ({str(exc).strip().splitlines()[0][:200]})"
        else:
            why = None if same_values(out, self.f) else "its values differ from the Function's"
        _LOADING.discard(self.lib)
        if why is None:
            return out
        del out  # unload it before a rebuild at the same path
        gone = not self.lib.exists()  # evicted by another process after its build or check
        if self.attempt >= MAX_ATTEMPTS:  # built that often: the cache evicts too fast, or the compiler fails
            if gone:
                raise _cache_error(self.lib.parent, f"{self.lib.name} was removed by another process before each of "
                                                    f"{self.attempt} loads (is $CEEM_CACHE_MAX_MB too small?)")
            raise RuntimeError(f"compiled library {self.lib} of {self.f.name()} is not usable: {why}")
        log.log(logging.INFO if gone else logging.WARNING, "compile cache: %s is not used: %s; rebuilding it",
                self.lib, "it was removed before it was loaded" if gone else why)
        for p in (self.lib, self.lib.with_suffix(".json")):
            with contextlib.suppress(OSError):
                p.unlink()
        return self._again()

    def _again(self) -> ca.Function:
        """Build and load the library again (`result` stops after `MAX_ATTEMPTS` loads in all)."""
        handle = start_compile([self.f], self.group, max(self.deadline - time.monotonic(), 1.0))[0]
        handle.attempt = self.attempt + 1
        return handle.result()


MAX_UNIT_CHARS = 100  # of a library's name: with the key and suffixes well below a file name's 255 bytes


def unit_name(group: str, function: str) -> str:
    """The library name of ``function`` in ``group``: a C identifier of at most ``MAX_UNIT_CHARS`` characters
    (a longer one keeps its start and a 12-digit digest of the whole)."""
    unit = safe_name(f"{safe_name(group)}_{safe_name(function)}")
    if len(unit) > MAX_UNIT_CHARS:
        unit = safe_name(unit[:MAX_UNIT_CHARS - 13]) + "_" + hashlib.sha256(unit.encode()).hexdigest()[:12]
    return unit


_IN_FLIGHT: dict[Path, CompileJob] = {}  # libraries being built by this process, by path (one job each)
_LOADING: set[Path] = set()  # libraries of this process's handles not loaded yet: its evictions keep them
os.register_at_fork(after_in_child=_IN_FLIGHT.clear)


def start_compile(functions: list[ca.Function], name: str = "ceem_stages", timeout_s: float = 600.0,
                  jobs: int | None = None) -> list[CompiledHandle]:
    """Start compiling ``functions`` in the background (the process-wide pool, ``jobs`` at once), one cached
    library ``<name>_<function>_<key>.so`` and `CompiledHandle` each; ``RuntimeError`` without a compiler."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set $CC or install gcc) to compile stage functions")
    folder, max_bytes = cache_dir(), cache_max_bytes()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cache_error(folder, f"cannot create the folder ({exc.strerror or exc})") from None
    deadline = time.monotonic() + timeout_s
    handles, new = [], {}
    try:
        for f in functions:
            unit = unit_name(name, f.name())
            key = cache_key([f], name, cc)
            lib = folder / f"{unit}_{key}.so"
            job = new.get(lib) or _IN_FLIGHT.get(lib)  # the same Function twice: one job
            if job is None or job.done.is_set():  # not being built (or built earlier): the cache, checked
                problem = verified(lib, cc, key, f.name()) if lib.exists() else "missing"
                if problem not in (None, "missing") and lib.exists():  # not just evicted by another process
                    log.warning("compile cache: %s is not used: %s; rebuilding it", lib, problem)
                job = None if problem is None else _job(f, unit, lib, cc, key, max_bytes)
                if job is not None:
                    new[lib] = job
            handles.append(CompiledHandle(f, name, lib, job, deadline))
            _LOADING.add(lib)
            weakref.finalize(handles[-1], _LOADING.discard, lib)   # a handle dropped unloaded: evictable again
    except BaseException as exc:
        for job in new.values():  # generated but never queued: remove their C folders
            job.finish(False)
        if isinstance(exc, OSError):  # any file-system failure of the cache: the caller falls back
            raise _cache_error(folder, str(exc.strerror or exc)) from None
        raise
    _IN_FLIGHT.update(new)
    if new:
        jobs = jobs or compile_jobs()
        log.info("compiling %d stage functions (%d jobs): %s", len(new), jobs, " ".join(next(iter(new.values())).cmd))
        POOL.submit(list(new.values()), jobs)
    return handles


def _job(f: ca.Function, unit: str, lib: Path, cc: str, key: str, max_bytes: float) -> CompileJob:
    """Generate ``f``'s C into a fresh folder next to ``lib``; the job compiles it, moves library and record
    (binding ``key`` and the Function's name) into place and evicts beyond ``max_bytes`` (not what this process
    is about to load). An unwritable folder raises `CompileCacheError` and leaves nothing behind."""
    source = _source(f, unit)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{unit}-", dir=lib.parent))
        c_file, so_tmp, rec_tmp = tmp / f"{unit}.c", tmp / "lib.so", tmp / "lib.json"
        c_file.write_text(source)
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise _cache_error(lib.parent, f"cannot write the C source of {f.name()} ({exc.strerror or exc})") from None
    cmd = [cc, opt_level(f), *COMPILE_FLAGS[1:], *LINK_FLAGS, str(c_file), "-o", str(so_tmp), "-lm"]

    def finish(ok: bool):
        try:
            if not ok:
                return
            rec_tmp.write_text(json.dumps({**_record(cc), "key": key, "function": f.name(),
                                           "sha256": hashlib.sha256(so_tmp.read_bytes()).hexdigest()}))
            os.replace(rec_tmp, lib.with_suffix(".json"))
            os.replace(so_tmp, lib)
            sweep(lib.parent, max_bytes, keep={p.stem for p in set(_LOADING)})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    return CompileJob(cmd, f.name(), len(source) * (2 if cmd[1] == "-O0" else 5), finish, cleanup=str(tmp))


def compile_functions(functions: list[ca.Function], name: str = "ceem_stages",
                      timeout_s: float = 600.0, jobs: int | None = None) -> list[ca.Function]:
    """Compiled versions of ``functions`` (same names, inputs and outputs): `start_compile` and wait.
    Raises ``RuntimeError`` when no compiler is found or compilation fails."""
    return [h.result() for h in start_compile(functions, name, timeout_s, jobs)]


def compile_or_none(functions: list[ca.Function], name: str, logger, what: str,
                    strict: bool = False) -> list[ca.Function] | None:
    """`compile_functions`, or None when there is no compiler or it failed (`fallback_warning` about ``what``);
    ``strict`` (compilation asked for): only an unusable cache folder falls back, other failures raise."""
    try:
        return compile_functions(functions, name)
    except RuntimeError as exc:
        if strict and not isinstance(exc, CompileCacheError):
            raise
        fallback_warning(logger, what, exc)
        return None
