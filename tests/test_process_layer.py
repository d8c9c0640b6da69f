"""The process layer (issue 23, item 6): every worker pool ends with its parent on SIGKILL and
SIGTERM, stops at once on SIGINT, and compilers leave no process or temporary folder behind
(bug 4: ``calibrate-noise --n-jobs 2`` left two workers running after SIGKILL/SIGTERM and took
99 s to exit on SIGINT). Subprocesses with bounded waits."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from _procs import alive, children

import ceem_casadi as cc
from ceem_casadi.runtime._pool import WorkerPool
from models import lorenz

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find processes")






def _wait_until(cond, timeout: float) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.fixture(scope="module")
def lorenz_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "d.csv"
    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(4, seed=3), 300, measurement_std=0.05, seed=4)
    pd.concat([pd.DataFrame({"traj": b, "y0": y[:, 0], "y1": y[:, 1]}) for b, y in enumerate(data.y)]).to_csv(
        path, index=False)
    return path


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_calibrate_noise_workers_end_with_their_parent(lorenz_csv, tmp_path, sig):
    """Plain EM (slow linear convergence) keeps every worker busy in a long chain of fits."""
    args = [sys.executable, "-m", "ceem_casadi.cli", "calibrate-noise", "--model", "models.lorenz:single_lorenz",
            "--model-kwargs", '{"measurement_std": 0.05}', "--data", lorenz_csv, "--trajectory-column", "traj",
            "--theta0", '{"sigma": 9.5, "rho": 29.0, "beta": 2.5}', "--grid", "0.01,0.1,1,10,100",
            "--max-iters", "500", "--acceleration", "none", "--n-jobs", "2", "--out", tmp_path / "cal.npz", "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(list(map(str, args)), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        assert _wait_until(lambda: len(children(proc.pid)) >= 2 or proc.poll() is not None, 120)
        workers = children(proc.pid)
        assert proc.poll() is None and len(workers) >= 2, proc.stderr.read().decode()[-2000:]
        time.sleep(0.5)  # the workers are inside their first fits
        t0 = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=30)  # bounded; SIGINT used to wait for the workers' chains (> 150 s here)
        exit_s = time.monotonic() - t0
        assert _wait_until(lambda: not any(alive(w) for w in workers), 5.0), [w for w in workers if alive(w)]
        if sig == signal.SIGINT:
            assert proc.returncode == 130 and exit_s < 5.0, (proc.returncode, exit_s)  # loaded machine: 2 s + margin
    finally:
        for w in workers:
            if alive(w):
                os.kill(w, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


def _square(x):
    return x * x


def _slow(x):
    time.sleep(60)
    return x


def test_worker_pool_maps_in_order_and_is_killed_on_interruption():
    with WorkerPool(2) as pool:
        assert pool.map(_square, range(5)) == [0, 1, 4, 9, 16]
    pool = WorkerPool(2)
    future = pool.executor.submit(_slow, 1)
    assert _wait_until(lambda: len(pool.pids()) == 2, 30)
    pids = pool.pids()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt), pool:
        raise KeyboardInterrupt
    assert time.monotonic() - t0 < 5.0 and not any(alive(p) for p in pids)
    # the executor's management thread marks the future once it sees its workers gone (asynchronously)
    assert _wait_until(lambda: future.cancelled() or future.done(), 10)


COMPILER_PARENT = textwrap.dedent('''
    import sys, time
    from ceem_casadi.runtime._compile_pool import POOL, CompileJob
    pidfile, tmpdir = sys.argv[1], sys.argv[2]
    code = "import os, time; open(%r, 'w').write(str(os.getpid())); time.sleep(120)" % pidfile
    job = CompileJob([sys.executable, "-c", code], "fake compiler", 1, cleanup=tmpdir)
    POOL.submit([job], 1)
    print("submitted", flush=True)
    time.sleep(120)
''')


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_process_leaves_no_compiler_and_no_temporary_folder(tmp_path, sig):
    pidfile, tmpdir = tmp_path / "compiler.pid", tmp_path / "job_tmp"
    tmpdir.mkdir()
    (tmpdir / "unit.c").write_text("int x;")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", COMPILER_PARENT, str(pidfile), str(tmpdir)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    compiler_pid = None
    try:
        assert _wait_until(lambda: pidfile.exists() and pidfile.read_text().strip() != "", 60), \
            proc.stderr.read().decode() if proc.poll() is not None else "no compiler started"
        compiler_pid = int(pidfile.read_text())
        assert alive(compiler_pid)
        proc.send_signal(sig)
        proc.wait(timeout=30)
        assert _wait_until(lambda: not alive(compiler_pid), 5.0)
        assert _wait_until(lambda: not tmpdir.exists(), 5.0)
    finally:
        if compiler_pid and alive(compiler_pid):
            os.kill(compiler_pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
