"""The compile cache under adverse conditions (issue 25, item 5): an unwritable or full cache folder
falls back to the CasADi virtual machine with a warning naming the folder (no partial C file left),
a SIGKILL during a compile leaves no compiler running and its build folder is removed by the next
run, a model name that sanitises to '__' compiles, and a library copied in under a cached name
(another Function's, or another model's same-named one) is detected and rebuilt with a warning."""
from __future__ import annotations

import errno
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.runtime import _compile as cmp
from ceem_casadi.runtime._cache_guard import safe_name, sweep
from ceem_casadi.runtime._compile import CompileCacheError, compile_functions, compiler, start_compile
from models import lorenz

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(compiler() is None, reason="needs a C compiler")


def _fun(name="obs_cost", scale=1.0):
    x = ca.SX.sym("x", 2)
    return ca.Function(name, [x], [scale * ca.sumsqr(x) + ca.sin(x[0])])


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.suffix == ".c" or p.name.startswith("tmp-"))


def _fit_lorenz(caplog):
    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(1, seed=1), 40, measurement_std=0.05, seed=2)
    opts = cc.CEEMOptions(max_iters=1, smoother=cc.SmootherOptions(compile=True))
    with caplog.at_level(logging.WARNING):
        return cc.ceem(model, data, {"sigma": 9.0, "rho": 27.0, "beta": 2.5}, options=opts)


def test_unwritable_cache_falls_back_to_the_virtual_machine(tmp_path, monkeypatch, caplog):
    """$CEEM_CACHE under a regular file: the fit (compile=True) runs in the VM and the warning names the
    folder. Fails without CompileCacheError in start_compile (NotADirectoryError aborts the fit)."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path / "file" / "cache"))
    res = _fit_lorenz(caplog)
    assert np.isfinite(res.J)
    assert any(str(tmp_path / "file" / "cache") in r.getMessage() and "virtual machine" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_read_only_cache_falls_back(tmp_path, monkeypatch, caplog):
    """A read-only file system ([Errno 30] from mkdtemp; root ignores permission bits, so it is simulated):
    same fallback, and the message names the folder and the reason."""
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path / "cache"))

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(cmp.tempfile, "mkdtemp", read_only)
    with pytest.raises(CompileCacheError, match=rf"{tmp_path / 'cache'}.*Read-only file system"):
        compile_functions([_fun()], "ceem_ro")
    res = _fit_lorenz(caplog)
    assert np.isfinite(res.J)
    assert any("Read-only file system" in r.getMessage() for r in caplog.records)


def test_full_disk_gives_the_path_and_leaves_no_partial_c(tmp_path, monkeypatch):
    """ENOSPC while writing the C source: CompileCacheError with the folder, no 0-byte .c and no build
    folder left. Fails without the cleanup in _compile._job (the folder with an empty .c stays)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("CEEM_CACHE", str(folder))
    real = pathlib.Path.write_text

    def full(self, data, *args, **kwargs):
        if self.suffix == ".c":
            real(self, "", *args, **kwargs)  # what a full disk leaves: the file, empty
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    with pytest.raises(CompileCacheError, match=rf"{folder}.*No space left on device"):
        compile_functions([_fun()], "ceem_full")
    assert _leftovers(folder) == []


@pytest.mark.parametrize("name", ["__", "ceem_--", "9 lives"])
def test_names_that_sanitise_badly_compile(tmp_path, monkeypatch, name):
    """'__' made CasADi's code generator assert (and leaked a build folder); now a valid name is used."""
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path))
    (g,) = compile_functions([_fun()], name)
    assert float(g(np.array([1.0, 2.0]))) == pytest.approx(5.0 + np.sin(1.0))
    assert _leftovers(tmp_path) == []
    assert "__" not in safe_name(name) and safe_name(name)[0].isalpha()


@pytest.mark.parametrize("intruder", ["other_function", "same_name_other_model", "forged_record"])
def test_library_copied_under_a_cached_name_is_rebuilt(tmp_path, monkeypatch, caplog, intruder):
    """Another Function's library (and record) copied over a cached one: a warning and a rebuild, and the
    values are right. 'same_name_other_model' is an obs_cost worth 1e9 times ours (J wrong by 1e9 when
    loaded); 'forged_record' also rewrites the record's key, which only the value check catches.
    Fails without the key/function binding in _compile.verified (other_function: CasADi assertion;
    same name: 1e9) and, for the forged record, without same_values in CompiledHandle.result."""
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path))
    ours = _fun()
    theirs = _fun("dyn_cost") if intruder == "other_function" else _fun(scale=1e9)
    lib = start_compile([ours], "ceem_m")[0]
    lib.result()
    src = start_compile([theirs], "ceem_m")[0]
    src.result()
    shutil.copy(src.lib, lib.lib)
    shutil.copy(src.lib.with_suffix(".json"), lib.lib.with_suffix(".json"))
    if intruder == "forged_record":
        rec = json.loads(lib.lib.with_suffix(".json").read_text())
        rec["key"] = lib.lib.stem.rsplit("_", 1)[1]
        lib.lib.with_suffix(".json").write_text(json.dumps(rec))
    with caplog.at_level(logging.WARNING):
        (g,) = compile_functions([ours], "ceem_m")
    assert float(g(np.array([1.0, 2.0]))) == pytest.approx(5.0 + np.sin(1.0))
    assert any("is not used" in r.getMessage() and "rebuilding" in r.getMessage() for r in caplog.records)


def _cache_processes(folder: Path) -> list[str]:
    """Command lines of running processes that name ``folder`` (compilers working there)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (p / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            except OSError:
                continue
            if str(folder) in cmd and state != "Z":
                out.append(cmd[:200])
    return out


BIG = textwrap.dedent("""
    import sys, casadi as ca
    from ceem_casadi.runtime._compile import start_compile
    x = ca.SX.sym("x", 8)
    e = [x[i] for i in range(8)]
    for k in range(12000):
        e.append(ca.sin(e[-1] * e[-3 - (k % 5)]) + e[-2] / (1 + e[-8] ** 2))
    h = start_compile([ca.Function("dyn_big", [x], [ca.vertcat(*e[-8:])])], "ceem_kill")[0]
    print("started", flush=True)
    h.result()
""")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigkill_during_first_compile_leaves_no_compiler_and_no_stale_folder(tmp_path):
    """SIGKILL of a process while gcc compiles its first library: within 2 s no process works in the
    cache (the supervisor killed the compiler's group; before: gcc ran on for seconds), and no build
    folder of the dead process outlives the next process that compiles there (the supervisor
    removes it; `sweep` would a day later; before: kept forever), and no cc*.s of the killed compiler
    is left in $TMPDIR. Fails without the supervisor in _compile_pool (cc1 keeps running), or without
    the compiler's TMPDIR set to its build folder (a cc*.s stays in $TMPDIR)."""
    folder, outer = tmp_path / "cache", tmp_path / "tmp"
    outer.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CEEM_CACHE": str(folder), "TMPDIR": str(outer)}
    proc = subprocess.Popen([sys.executable, "-c", BIG], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        t_end = time.monotonic() + 60
        while not any("cc1" in c for c in _cache_processes(folder)) and time.monotonic() < t_end:
            time.sleep(0.05)
        assert any("cc1" in c for c in _cache_processes(folder)), "the compiler never started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    t_end = time.monotonic() + 2.0
    while _cache_processes(folder) and time.monotonic() < t_end:
        time.sleep(0.05)
    assert _cache_processes(folder) == []
    # issue 33: the killed compiler's temporaries (cc*.s) were in its build folder, not in $TMPDIR
    assert [p.name for p in outer.iterdir() if p.name.startswith("cc")] == []
    # the next process that builds a library there
    subprocess.run([sys.executable, "-c", "import casadi as ca; from ceem_casadi.runtime._compile import "
                    "compile_functions; x = ca.SX.sym('x'); compile_functions([ca.Function('f', [x], [x * x])], "
                    "'ceem_next')"], env=env, check=True, timeout=120)
    assert [p.name for p in folder.iterdir() if p.name.startswith("tmp-")] == []


def test_sweep_removes_build_folders_untouched_for_a_day(tmp_path):
    """A build folder untouched for ORPHAN_AGE_S (a day) is removed; a younger one (a build that waits in a queue
    or runs) is kept, and so is an old folder that is not a build folder."""
    from ceem_casadi.runtime._cache_guard import ORPHAN_AGE_S

    young, old, other = (tmp_path / n for n in ("tmp-young-1", "tmp-old-2", "notes"))
    for p, age in ((young, ORPHAN_AGE_S - 600), (old, ORPHAN_AGE_S + 600), (other, 10 * ORPHAN_AGE_S)):
        p.mkdir()
        os.utime(p, (time.time() - age,) * 2)
    assert sweep(tmp_path, float("inf")) == [old.name] and young.exists() and other.exists()


def test_a_build_removes_stale_build_folders_and_nothing_else(tmp_path, monkeypatch):
    """The next build in the cache removes a day-old build folder, and keeps a day-old
    folder of the user's (scripts/bench_lorenz.py keeps its peer venv at $CEEM_CACHE/peer_venv). Fails without
    the `sweep` call in _compile._job's finish (the build folder stays), or with any folder named with a
    ``_`` taken for a build folder in _cache_guard.libraries (it removed the venv)."""
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path))
    venv, orphan = tmp_path / "peer_venv", tmp_path / "tmp-ceem_stages_f-k2x_9ab1"
    (venv / "bin").mkdir(parents=True)
    orphan.mkdir()
    for p in (venv, orphan):
        os.utime(p, (time.time() - 2 * 86400,) * 2)
    compile_functions([_fun(scale=7.0)], "ceem_stale")
    assert not orphan.exists() and (venv / "bin").is_dir()


# --- issue 33: any OSError of the cache falls back once; compiler temporaries live in the build folder --------
def _fake_compiler(tmp_path, body: str) -> str:
    """A compiler script (sh) standing in for gcc: records its $TMPDIR, leaves a cc*.s there, runs ``body``."""
    cc_path = tmp_path / "fakecc"
    cc_path.write_text("#!/bin/sh\n" 'case "$1" in --version) echo fakecc 1.0; exit 0;; esac\n'
                       f"echo \"$TMPDIR\" >> {tmp_path / 'tmpdirs'}\n"
                       "touch \"$TMPDIR/ccFAKE.s\" \"$TMPDIR/ccFAKE.o\"\n" + body)
    cc_path.chmod(0o755)
    return str(cc_path)


def test_long_model_name_compiles(tmp_path, monkeypatch):
    """A 250-character model name with compilation on: the library name is shortened with a digest
    (it gave "File name too long"). Fails without unit_name's cap in _compile.start_compile."""
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path))
    (g,) = compile_functions([_fun()], "ceem_" + "m" * 250)
    assert float(g(np.array([1.0, 2.0]))) == pytest.approx(5.0 + np.sin(1.0))
    assert all(len(p.name) < 160 for p in tmp_path.iterdir())


def test_compiler_on_a_full_disk_falls_back_with_one_warning(tmp_path, monkeypatch, caplog):
    """The linker fails with "No space left on device" (a full cache disk): a fit with compile=True runs
    in the virtual machine with exactly one warning (it aborted with a RuntimeError traceback). Fails
    without ``disk_error`` in _compile_pool / CompiledHandle.result, or with one warning per group
    without _compile.fallback_warning."""
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", _fake_compiler(tmp_path, "echo '/usr/bin/ld: final link failed: No space left on "
                                                      "device' >&2\nexit 1\n"))
    monkeypatch.setattr(cmp, "_WARNED", set())
    res = _fit_lorenz(caplog)
    assert np.isfinite(res.J)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "No space left on device" in warnings[0] and "\n" not in warnings[0], warnings


def test_compiler_temporaries_in_the_build_folder(tmp_path, monkeypatch):
    """The compiler runs with TMPDIR = its build folder, so its cc*.s / cc*.o are removed with the folder,
    also after a failure: none is left in the cache or in $TMPDIR. Fails without the TMPDIR of the
    Popen env in _compile_pool.CompilePool._serve (the fake compiler's temporaries land in $TMPDIR)."""
    folder, outer = tmp_path / "cache", tmp_path / "outer_tmp"
    outer.mkdir()
    monkeypatch.setenv("CEEM_CACHE", str(folder))
    monkeypatch.setenv("TMPDIR", str(outer))
    monkeypatch.setenv("CC", _fake_compiler(tmp_path, "exit 1\n"))
    with pytest.raises(RuntimeError, match="compiling obs_cost failed"):
        compile_functions([_fun()], "ceem_tmp")
    used = (tmp_path / "tmpdirs").read_text().split()
    assert used and all(Path(d).parent == folder and Path(d).name.startswith("tmp-") for d in used), used
    assert list(outer.iterdir()) == [] and not any(p.name.startswith("cc") for p in folder.rglob("*"))
