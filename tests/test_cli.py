"""CLI end to end (subprocesses): fit / evaluate / codegen / plot / simulate / smooth, kill + resume,
exit codes and one-line messages on bad input."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import ceem_casadi as cc
from ceem_casadi.deploy._modelfile import load_model
from ceem_casadi.em._checkpoint import read_checkpoint
from ceem_casadi.runtime._compile import compiler
from models import lorenz

ROOT = Path(__file__).resolve().parents[1]
MODEL = "models.lorenz:single_lorenz"
KW = json.dumps({"measurement_std": 0.05})
THETA0 = json.dumps({"sigma": 9.5, "rho": 29.0, "beta": 2.5})

INPUT_MODEL = textwrap.dedent('''
    import numpy as np
    import ceem_casadi as cc

    def make(a=0.9):
        params = cc.Parameters(cc.Param("a", a), cc.Param("b", 0.5))
        return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x,
                                                nx=1, nu=1, params=params, process_std=0.1,
                                                measurement_std=0.1, x1_mean=0.0, x1_std=1.0)
''')


def run(*args, env=None, cwd=None, check_rc=None, kill_after=None):
    """The CLI in a subprocess; ``kill_after=n``: SIGKILLed right after the n-th checkpoint (tests/_kill_after.py)."""
    env = dict(env or {})
    path = os.pathsep.join([str(ROOT), *([env.pop("PYTHONPATH")] if "PYTHONPATH" in env else [])])
    e = {**os.environ, "PYTHONPATH": path, "MPLBACKEND": "Agg", **env}
    cli = ["-m", "ceem_casadi.cli"] if kill_after is None else [str(ROOT / "tests" / "_kill_after.py"), str(kill_after)]
    proc = subprocess.run([sys.executable, *cli, *map(str, args)], capture_output=True,
                          text=True, env=e, cwd=cwd or ROOT, timeout=300)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def lorenz_csv(tmp_path_factory):
    """Two noisy Lorenz trajectories (100 samples, 2 % of outputs missing) in one CSV."""
    path = tmp_path_factory.mktemp("data") / "lorenz.csv"
    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, np.array([[-6.0, -6.0, 24.0], [-4.0, -7.0, 22.0]]), 100,
                          measurement_std=0.05, seed=1)
    frames = []
    for b, y in enumerate(data.y):
        y = y.copy()
        y[np.random.default_rng(b).random(y.shape) < 0.02] = np.nan
        frames.append(pd.DataFrame({"traj": b, "time": 0.04 * np.arange(len(y)), "y0": y[:, 0], "y1": y[:, 1]}))
    pd.concat(frames).to_csv(path, index=False)
    return path


def _fit(csv, out, *extra, env=None, check_rc=0, kill_after=None):
    return run("fit", "--model", MODEL, "--model-kwargs", KW, "--data", csv, "--trajectory-column", "traj",
               "--theta0", THETA0, "--acceleration", "newton", "--out", out, *extra, env=env, check_rc=check_rc,
               kill_after=kill_after)


def test_fit_evaluate_codegen_plot(lorenz_csv, tmp_path):
    proc = _fit(lorenz_csv, tmp_path / "m.npz")
    summary = json.loads(proc.stdout)
    assert summary["status"] == "converged"
    for k, v in lorenz.TRUE.items():                 # recovered within the noise's reach
        assert abs(summary["theta"][k] - v) / v < 0.01
    assert "iter   1/50" in proc.stderr and "converged after" in proc.stderr   # progress lines
    saved = load_model(tmp_path / "m.npz")
    assert saved.meta["data"]["lengths"] == [100, 100] and len(saved.history) == summary["iterations"]
    assert read_checkpoint(tmp_path / "m.npz.ckpt.npz").status == "converged"

    proc = run("evaluate", "--model-file", tmp_path / "m.npz", "--data", lorenz_csv, "--trajectory-column", "traj",
               "--k", "1,5", "--json", tmp_path / "report.json", check_rc=0)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["prediction"]["1"]["overall"]["fit_percent"] > 95       # one-step EKF prediction
    assert report["prediction"]["1"]["overall"]["rmse"] < 3 * 0.05
    assert "simulation" in proc.stdout and "k=5" in proc.stdout

    if compiler() is not None:
        run("codegen", "--model-file", tmp_path / "m.npz", "--out-dir", tmp_path / "c", "--name", "lz",
            "--build-example", "--saved-functions", check_rc=0)   # no factory needed: stored CasADi functions
        df = pd.read_csv(lorenz_csv)
        y = df[df.traj == 0][["y0", "y1"]].to_numpy()
        csv_in = tmp_path / "c" / "in.csv"
        df[df.traj == 0][["y0", "y1"]].to_csv(csv_in, index=False, na_rep="nan")
        out = subprocess.run([str(tmp_path / "c" / "lz"), str(csv_in)], capture_output=True, text=True,
                             check=True).stdout
        y_c = np.array([[float(v) for v in ln.split(",")] for ln in out.splitlines()])[:, :2]
        n = saved.model.noise
        ref = saved.predict(y, x0=saved.extra["x0"][0], Sigma0=(n.process_std ** 2), Q=n.process_std ** 2,
                            R=n.measurement_std ** 2)
        assert np.max(np.abs(y_c - ref.y_pred)) / np.max(np.abs(ref.y_pred)) < 1e-10

    for fmt in ("png", "svg"):
        proc = run("plot", "--model-file", tmp_path / "m.npz", "--data", lorenz_csv, "--trajectory-column",
                   "traj", "--out-dir", tmp_path / "fig", "--format", fmt, check_rc=0)
        for name in ("history", "states", "prediction"):
            assert (tmp_path / "fig" / f"{name}.{fmt}").stat().st_size > 1000
    assert (tmp_path / "fig" / "history.svg").read_text().lstrip().startswith("<?xml")

    run("smooth", "--model-file", tmp_path / "m.npz", "--data", lorenz_csv, "--trajectory-column", "traj",
        "--out", tmp_path / "x.csv", check_rc=0)
    xs = pd.read_csv(tmp_path / "x.csv")
    assert list(xs.columns) == ["trajectory", "t", "x0", "x1", "x2"] and len(xs) == 200


def test_parquet_data_equals_csv(lorenz_csv, tmp_path):
    """The same table as Parquet (pandas + pyarrow, the ``parquet`` extra) loads to the same trajectories."""
    pytest.importorskip("pyarrow")
    pq = tmp_path / "lorenz.parquet"
    pd.read_csv(lorenz_csv).to_parquet(pq, index=False)
    model = lorenz.single_lorenz(measurement_std=0.05)
    from_csv, desc_csv = cc.read_trajectories([lorenz_csv], model, trajectory_column="traj", describe=True)
    from_pq, desc_pq = cc.read_trajectories([pq], model, trajectory_column="traj", describe=True)
    assert list(from_pq.lengths) == list(from_csv.lengths) == [100, 100] and desc_pq["outputs"] == desc_csv["outputs"]
    for a, b in zip(from_pq.y, from_csv.y):
        np.testing.assert_array_equal(a, b)        # NaN (missing outputs) in the same places
    proc = run("evaluate", "--model-file", tmp_path / "none.npz", "--data", pq, check_rc=2)
    assert "no such file" in proc.stderr


def test_kill_after_two_iterations_and_resume(lorenz_csv, tmp_path):
    ref = json.loads(_fit(lorenz_csv, tmp_path / "ref.npz", "-q").stdout)
    proc = _fit(lorenz_csv, tmp_path / "k.npz", "-q", kill_after=2, check_rc=None)
    assert proc.returncode == -9                       # SIGKILL: nothing after the checkpoint ran
    assert not (tmp_path / "k.npz").exists()
    ckpt = read_checkpoint(tmp_path / "k.npz.ckpt.npz")
    assert ckpt.iterations == 2 and ckpt.status is None
    proc = _fit(lorenz_csv, tmp_path / "k.npz", "--resume")
    assert "resuming from" in proc.stderr and "iter   3/50" in proc.stderr
    res = json.loads(proc.stdout)
    assert res["status"] == "converged" and res["iterations"] > 2
    for k in lorenz.TRUE:
        assert abs(res["theta"][k] - ref["theta"][k]) <= 1e-6 * abs(ref["theta"][k]), (res, ref)
    hist = load_model(tmp_path / "k.npz").history
    assert [h["iteration"] for h in hist] == list(range(1, len(hist) + 1))
    # a resume of a finished fit returns it unchanged, without iterating
    again = json.loads(_fit(lorenz_csv, tmp_path / "k.npz", "--resume", "-q").stdout)
    assert again == res


def test_not_converged_exit_1_and_simulate(lorenz_csv, tmp_path):
    proc = run("fit", "--model", MODEL, "--model-kwargs", KW, "--data", lorenz_csv, "--trajectory-column", "traj",
               "--max-iters", "1", "--out", tmp_path / "m.npz", "-q", check_rc=1)
    assert json.loads(proc.stdout)["status"] == "max_iters" and proc.stderr == ""
    assert load_model(tmp_path / "m.npz").meta["metadata"]["status"] == "max_iters"   # results still written
    run("simulate", "--model-file", tmp_path / "m.npz", "--x0", "[-6, -6, 24]", "--horizon", "30",
        "--out", tmp_path / "sim.csv", check_rc=0)
    sim = pd.read_csv(tmp_path / "sim.csv")
    assert len(sim) == 30 and {"y0", "y1", "x0", "x1", "x2"} <= set(sim.columns)
    np.testing.assert_allclose(sim[["y0", "y1"]].to_numpy(), sim[["x0", "x2"]].to_numpy())  # y = C x, no noise


@pytest.fixture()
def input_model(tmp_path):
    (tmp_path / "mymodel.py").write_text(INPUT_MODEL)
    df = pd.DataFrame({"u0": np.sin(np.arange(50.0)), "y0": np.cos(np.arange(50.0))})
    df.to_csv(tmp_path / "good.csv", index=False)
    df.loc[7, "u0"] = np.nan
    df.to_csv(tmp_path / "nan_u.csv", index=False)
    (tmp_path / "bad.toml").write_text("max_iters = 3\nfoo = 1\n")
    return tmp_path


def test_input_model_fit_and_help(input_model):
    script = shutil.which("ceem-casadi")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if script:   # only when the console script runs this checkout (not another editable install)
        where = subprocess.run([sys.executable, "-c", "import ceem_casadi; print(ceem_casadi.__file__)"], env=env,
                               cwd=input_model, capture_output=True, text=True).stdout.strip()
        script = script if where and Path(where).resolve().parents[1] == ROOT else None
    if script:   # the console script, run in the model's folder (importable from the working directory)
        proc = subprocess.run([script, "fit", "--model", "mymodel:make", "--data", "good.csv", "--out", "m.npz",
                               "-q"], cwd=input_model, env=env, capture_output=True, text=True, timeout=300)
    else:
        proc = run("fit", "--model", "mymodel:make", "--data", "good.csv", "--out", "m.npz", "-q",
                   env={"PYTHONPATH": str(input_model)}, cwd=input_model)
    assert proc.returncode in (0, 1), proc.stderr
    assert (input_model / "m.npz").exists()
    assert load_model(input_model / "m.npz", rebuild=False).meta["source"] == "mymodel:make"
    for cmd in ("fit", "evaluate", "simulate", "smooth", "codegen", "plot"):
        assert f"usage: ceem-casadi {cmd}" in run(cmd, "--help", check_rc=0).stdout
    bad = run("plot", "--model-file", input_model / "nope.npz", "--out-dir", input_model, check_rc=2)
    assert "no such file" in bad.stderr and "\n" not in bad.stderr.strip()


def test_progress_and_checkpoint_units(tmp_path):
    import io

    from ceem_casadi.em._checkpoint import CheckpointWriter
    from ceem_casadi.em._progress import Progress, chain
    from ceem_casadi.plots import plot_history

    rec = cc.em.IterationRecord(1, -5.0, -5.0, 2.5, 0.25, 0.5, ["Solve_Succeeded"], "Solve_Succeeded", {"a": 1.0})
    lines, bar, quiet = io.StringIO(), io.StringIO(), io.StringIO()
    Progress(10, stream=lines)(rec)
    assert lines.getvalue() == ("iter   1/10: J = -5  dJ = +2.5  smooth 0.25 s  learn 0.50 s  "
                                "[Solve_Succeeded | Solve_Succeeded]\n")
    p = Progress(4, stream=bar, bar=True, offset=1)
    p(rec)
    p.close("converged")
    assert bar.getvalue().startswith("\r[############............] 2/4 J = -5") and "converged" in bar.getvalue()
    Progress(4, stream=quiet, quiet=True)(rec)
    assert quiet.getvalue() == ""
    assert chain(lambda r: None, lambda r: False)(rec) is False
    w = CheckpointWriter(tmp_path / "c.npz", {"a": 0.0})
    w(rec)
    rec.x = [np.ones((5, 2))]            # records that carry the states: the checkpoint keeps them
    w(rec)
    state = read_checkpoint(tmp_path / "c.npz")
    assert state.iterations == 2 and np.array_equal(state.x[0], np.ones((5, 2)))
    assert "x" not in state.history[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz"]   # no temporary files left behind
    assert plot_history(w.history, tmp_path / "h.svg").stat().st_size > 1000
    with pytest.raises(ValueError, match=".png or .svg"):
        plot_history(w.history, tmp_path / "h.jpg")


def test_sigint_keeps_checkpoint_and_resumes(tmp_path):
    import signal
    import time

    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(4, seed=3), 400, measurement_std=0.05, seed=4)
    pd.concat([pd.DataFrame({"traj": b, "y0": y[:, 0], "y1": y[:, 1]}) for b, y in enumerate(data.y)]).to_csv(
        tmp_path / "d.csv", index=False)
    args = [sys.executable, "-m", "ceem_casadi.cli", "fit", "--model", MODEL, "--model-kwargs", KW, "--data",
            tmp_path / "d.csv", "--trajectory-column", "traj", "--theta0", THETA0, "--max-iters", "500",
            "--out", tmp_path / "m.npz", "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = tmp_path / "m.npz.ckpt.npz"
    t0 = time.time()
    while not ckpt.exists() and proc.poll() is None and time.time() - t0 < 120:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)       # plain EM needs many iterations: still running here
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    state = read_checkpoint(ckpt)
    assert state.iterations >= 1 and state.status is None and not (tmp_path / "m.npz").exists()
    res = subprocess.run(args[:-1] + ["--resume", "--acceleration", "newton", "-q"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["status"] == "converged" and out["iterations"] > state.iterations
    for k, v in lorenz.TRUE.items():
        assert abs(out["theta"][k] - v) / v < 0.01


class _InterruptsWhenCollected:
    def __del__(self):
        import signal
        signal.raise_signal(signal.SIGINT)


def test_an_interrupt_inside_a_finaliser_stops_the_fit_at_that_iterations_end(tmp_path, monkeypatch):
    """A SIGINT landing in a ``__del__`` (CI saw one in ``ZipFile.__del__``) cannot raise there (Python prints
    "Exception ignored" and drops it): the fit stops at the end of that iteration with its checkpoint, nothing lost."""
    from ceem_casadi.em._checkpoint import ceem_checkpointed

    lost = []
    monkeypatch.setattr(sys, "unraisablehook", lost.append)
    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=5), 80, measurement_std=0.05, seed=6)
    with pytest.raises(KeyboardInterrupt):
        ceem_checkpointed(model, data, json.loads(THETA0), tmp_path / "a.npz",
                          options=cc.CEEMOptions(acceleration="none", max_iters=200),
                          callback=lambda rec: _InterruptsWhenCollected() and None if rec.iteration == 2 else None)
    state = read_checkpoint(tmp_path / "a.npz")
    assert state.iterations == 2 and state.status is None and not lost


def test_ceem_checkpointed_library(tmp_path):
    from ceem_casadi.em._checkpoint import CheckpointError, ceem_checkpointed

    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=5), 80, measurement_std=0.05, seed=6)
    theta0 = json.loads(THETA0)
    opts = cc.CEEMOptions(acceleration="newton")
    full = ceem_checkpointed(model, data, theta0, tmp_path / "a.npz", options=opts)
    seen = []
    part = ceem_checkpointed(model, data, theta0, tmp_path / "b.npz", options=opts,
                             callback=lambda rec: seen.append(rec.iteration) or len(seen) < 2)
    assert part.status == "stopped" and seen == [1, 2]
    rest = ceem_checkpointed(model, data, theta0, tmp_path / "b.npz", options=opts, resume_fit=True,
                             callback=lambda rec: seen.append(rec.iteration))
    assert rest.resumed_from == 2 and seen[2] == 3 and rest.status == full.status == "converged"
    assert [h["iteration"] for h in rest.history] == list(range(1, len(rest.history) + 1))
    # the checkpoint keeps the states of iteration 2: the resumed fit reaches the same fixed point
    # (its iteration count may differ: the joint-Newton damping is not part of the checkpoint)
    for k in theta0:
        assert abs(rest.theta[k] - full.theta[k]) <= 1e-8 * abs(full.theta[k])
    other, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=7), 80, measurement_std=0.05)
    with pytest.raises(CheckpointError, match="another model or data set"):
        ceem_checkpointed(model, other, theta0, tmp_path / "b.npz", options=opts, resume_fit=True)
