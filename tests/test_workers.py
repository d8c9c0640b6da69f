"""Smoothing workers die with their parent (issue 15, point 2): SIGKILL a ``fit --n-jobs 2``, no
worker is alive 5 s later."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from _procs import alive, children

import ceem_casadi as cc
from models import lorenz

ROOT = Path(__file__).resolve().parents[1]






@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the workers")
def test_workers_die_with_killed_parent(tmp_path):
    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(4, seed=3), 300, measurement_std=0.05, seed=4)
    pd.concat([pd.DataFrame({"traj": b, "y0": y[:, 0], "y1": y[:, 1]}) for b, y in enumerate(data.y)]).to_csv(
        tmp_path / "d.csv", index=False)
    args = [sys.executable, "-m", "ceem_casadi.cli", "fit", "--model", "models.lorenz:single_lorenz",
            "--model-kwargs", '{"measurement_std": 0.05}', "--data", tmp_path / "d.csv", "--trajectory-column",
            "traj", "--theta0", '{"sigma": 9.5, "rho": 29.0, "beta": 2.5}', "--max-iters", "500", "--n-jobs", "2",
            "--out", tmp_path / "m.npz", "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(list(map(str, args)), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        t0 = time.time()
        while not (tmp_path / "m.npz.ckpt.npz").exists() and proc.poll() is None and time.time() - t0 < 120:
            time.sleep(0.05)
        workers = children(proc.pid)
        assert proc.poll() is None and len(workers) >= 2, (workers, proc.stderr.read() if proc.poll() else "")
        proc.kill()
        proc.wait()
        time.sleep(5)
        assert [w for w in workers if alive(w)] == []
    finally:
        for w in workers:      # leave nothing running, whatever happened
            if alive(w):
                os.kill(w, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
