"""The process-wide compiler pool (issue 17): no compiler process outlives a cancelled, timed-out
or abandoned job, and the groups of a fit share one pool (a Function common to two groups is
compiled once)."""
from __future__ import annotations

import _thread
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _procs import alive

from ceem_casadi.objective._stages import StageFunctions
from ceem_casadi.runtime._compile import compiler
from ceem_casadi.runtime._compile_pool import POOL, CompileJob
from models import lorenz

ROOT = Path(__file__).resolve().parents[1]
# a stand-in for gcc: a driver whose child (like cc1) writes its pid and runs for a minute
SLOW = "sleep 60 & echo $! > {pidfile}; wait"




def _child_pid(pidfile: Path) -> int:
    for _ in range(500):
        if pidfile.exists() and pidfile.read_text().strip():
            return int(pidfile.read_text())
        time.sleep(0.01)
    raise AssertionError("the slow command never started")


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc")
def test_timed_out_job_kills_the_compilers_children(tmp_path):
    pidfile = tmp_path / "pid"
    ends = []
    job = CompileJob(["sh", "-c", SLOW.format(pidfile=pidfile)], "slow", 1, finish=ends.append)
    POOL.submit([job], 2)
    pid = _child_pid(pidfile)
    assert alive(pid)
    with pytest.raises(RuntimeError, match="time limit"):
        job.wait(time.monotonic() + 0.2)
    time.sleep(0.2)
    assert not alive(pid)
    assert ends == [False]                                     # cleaned up, nothing moved into place


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc")
def test_interrupted_wait_kills_the_compilers_children(tmp_path):
    """Ctrl-C while a fit waits for its compilers ends them (they run in their own sessions, so
    the terminal's SIGINT never reaches them)."""
    pidfile = tmp_path / "pid"
    job = CompileJob(["sh", "-c", SLOW.format(pidfile=pidfile)], "slow", 1)
    POOL.submit([job], 2)
    pid = _child_pid(pidfile)
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        job.wait(time.monotonic() + 30)
    timer.join()
    time.sleep(0.2)
    assert not alive(pid)


def test_failed_command_reports_its_stderr():
    ends = []
    job = CompileJob(["sh", "-c", "echo 'error: boom' >&2; exit 3"], "broken", 1, finish=ends.append)
    POOL.submit([job], 2)
    with pytest.raises(RuntimeError, match="compiling broken failed: exit status 3: error: boom"):
        job.wait(time.monotonic() + 30)
    assert ends == [False]


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc")
def test_interpreter_exit_kills_unwaited_jobs(tmp_path):
    pidfile = tmp_path / "pid"
    script = (f"from ceem_casadi.runtime._compile_pool import POOL, CompileJob\n"
              f"import pathlib, time\n"
              f"POOL.submit([CompileJob(['sh', '-c', {SLOW.format(pidfile=pidfile)!r}], 'slow', 1)], 1)\n"
              f"while not pathlib.Path({str(pidfile)!r}).exists(): time.sleep(0.01)\n")
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=60, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    pid = _child_pid(pidfile)
    for _ in range(100):
        if not alive(pid):
            break
        time.sleep(0.02)
    assert not alive(pid)


@pytest.mark.skipif(compiler() is None, reason="needs a C compiler")
def test_prefetched_groups_share_the_pool_and_common_functions(tmp_path, monkeypatch):
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path))
    groups = (("obs_cost", "dyn_cost", "dyn_x_grad"), ("dyn_cost", "dyn_p_jac"))
    stages = StageFunctions(lorenz.single_lorenz(), compile=True)
    stages.prefetch(*groups)
    assert set(stages._pending) == {"obs_cost", "dyn_cost", "dyn_x_grad", "dyn_p_jac"}  # queued, not waited for
    got = [stages.get(*g) for g in groups]
    assert len(list(tmp_path.glob("*.so"))) == 4                          # dyn_cost once for both groups
    assert got[0][1] is got[1][0]
    rng = np.random.default_rng(0)
    for g, funs in zip(groups, got):
        for name, f in zip(g, funs):
            raw = stages._build(name)
            args = [rng.standard_normal(raw.sparsity_in(i).shape) for i in range(raw.n_in())]
            for a, b in zip(raw.call(args), f.call(args)):
                np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(compiler() is None or not hasattr(os, "fork"), reason="needs a C compiler and fork")
def test_forked_child_compiles_for_itself(tmp_path, monkeypatch):
    """A handle inherited through fork (a process pool forked during a prefetch) does not wait for
    the parent's compiler: the child compiles or finds the library itself."""
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path))
    from ceem_casadi.runtime._compile import start_compile

    raw = StageFunctions(lorenz.single_lorenz()).dyn_x_grad
    args = [np.full(raw.sparsity_in(i).shape, 0.5) for i in range(raw.n_in())]
    expected = [np.asarray(a) for a in raw.call(args)]
    (handle,) = start_compile([raw], "fork_test", timeout_s=60)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only with the right numbers
        try:
            got = handle.result().call(args)
            ok = all(np.allclose(np.asarray(g), e, rtol=1e-12, atol=1e-12) for g, e in zip(got, expected))
        except BaseException:  # any failure is the child's exit status
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    np.testing.assert_allclose(np.asarray(handle.result().call(args)[1]), expected[1], rtol=1e-12)


@pytest.mark.skipif(compiler() is None, reason="needs a C compiler")
def test_the_same_function_twice_is_one_job(tmp_path, monkeypatch):
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path))
    from ceem_casadi.runtime._compile import compile_functions

    raw = StageFunctions(lorenz.single_lorenz()).obs_cost
    first, second = compile_functions([raw, raw], "twice", timeout_s=20)
    args = [np.full(raw.sparsity_in(i).shape, 0.25) for i in range(raw.n_in())]
    assert float(first.call(args)[0]) == float(second.call(args)[0]) == float(raw.call(args)[0])
    assert len(list(tmp_path.glob("*.so"))) == 1
