"""Round trips and no silent loss (issue 15, points 5, 6, 7): simulate -> fit -> evaluate recovers the
parameters from any folder with a model given as a file path; checkpoints are not overwritten; outputs
are checked before fitting; errors name the true cause and CLI flags; SolverError carries the last
good result; a time column that disagrees with dt, or unsorted rows, is reported."""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import ceem_casadi as cc
from ceem_casadi.cli import main
from ceem_casadi.deploy._modelfile import build_model, load_model
from ceem_casadi.em._checkpoint import read_checkpoint
from models import lorenz

ROOT = Path(__file__).resolve().parents[1]
KW = json.dumps({"measurement_std": 0.05})
LINEAR = textwrap.dedent('''
    import casadi as ca
    import ceem_casadi as cc

    def make(a=0.9, nan_above=None):
        params = cc.Parameters(cc.Param("a", a), cc.Param("b", 0.5))
        def step(x, u, p):
            x_next = p.a * x + p.b * u
            return x_next if nan_above is None else x_next + 1e-9 * ca.sqrt(nan_above - x)
        return cc.StateSpaceModel.from_discrete(step, lambda x, u, p: x, nx=1, nu=1, params=params,
                                                process_std=0.1, measurement_std=0.1, dt=0.1)
''')


@pytest.fixture()
def linear(tmp_path, monkeypatch):
    (tmp_path / "linmodel.py").write_text(LINEAR)
    u = np.sin(0.3 * np.arange(40.0))
    x = np.zeros(40)
    for t in range(39):
        x[t + 1] = 0.8 * x[t] + 0.5 * u[t] + 0.1
    y = x + 0.05 * np.random.default_rng(0).standard_normal(40)
    pd.DataFrame({"t": 0.1 * np.arange(40), "u0": u, "y0": y}).to_csv(tmp_path / "d.csv", index=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_simulate_fit_evaluate_from_any_folder(tmp_path, monkeypatch, capsys):
    """Four simulated trajectories are fitted as four (the 'trajectory' column), the model given as a
    .py file path, in a folder where the package 'models' is not on the path."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "models" / "lorenz.py", tmp_path / "my_lorenz.py")
    x0 = lorenz.initial_states(4, seed=11).tolist()
    assert main(["simulate", "--model", str(ROOT / "models" / "lorenz.py") + ":single_lorenz", "--model-kwargs", KW,
                 "--theta", json.dumps(lorenz.TRUE), "--x0", json.dumps(x0), "--horizon", "100",
                 "--measurement-std", "0.05", "--seed", "3", "--out", "sim.csv"]) == 0
    assert sorted(pd.read_csv("sim.csv")["trajectory"].unique()) == [0, 1, 2, 3]
    capsys.readouterr()
    rc = main(["fit", "--model", "my_lorenz.py:single_lorenz", "--model-kwargs", KW, "--data", "sim.csv",
               "--theta0", json.dumps({"sigma": 9.5, "rho": 29.0, "beta": 2.5}), "--acceleration", "newton",
               "--out", "m.npz", "-q"])
    fit = json.loads(capsys.readouterr().out)
    assert rc == 0 and fit["status"] == "converged"
    for k, v in lorenz.TRUE.items():
        assert abs(fit["theta"][k] - v) / v < 0.01, fit       # one trajectory of 400 jumps: sigma 10.5
    saved = load_model("m.npz")
    assert saved.meta["data"]["lengths"] == [100] * 4 and saved.meta["data"]["trajectory_column"] == "trajectory"
    assert saved.source == f"{tmp_path / 'my_lorenz.py'}:single_lorenz"     # absolute: usable from anywhere
    assert main(["evaluate", "--model-file", "m.npz", "--data", "sim.csv", "--k", "1", "--json", "r.json"]) == 0
    report = json.loads(Path("r.json").read_text())
    assert report["prediction"]["1"]["overall"]["rmse"] < 3 * 0.05
    monkeypatch.chdir(ROOT)
    rebuilt = load_model(tmp_path / "m.npz", trust_source=True)             # the factory, from another folder
    assert rebuilt.model.params.names == ["sigma", "rho", "beta"]


def test_existing_checkpoint_not_overwritten(linear, capsys):
    args = ["fit", "--model", "linmodel.py:make", "--data", "d.csv", "--max-iters", "1", "--out", "m.npz", "-q"]
    assert main(args) == 1
    ckpt = linear / "m.npz.ckpt.npz"
    before = ckpt.read_bytes()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "--resume" in err and "--overwrite" in err
    assert ckpt.read_bytes() == before                       # left as it was
    assert main([*args, "--overwrite"]) == 1
    assert main([*args[:5], "--max-iters", "2", "--out", "m.npz", "--resume", "-q"]) == 1
    assert len(read_checkpoint(ckpt).history) == 2


def test_unwritable_output_found_before_fitting(linear, capsys):
    rc = main(["fit", "--model", "linmodel.py:make", "--data", "d.csv", "--out", "d.csv/m.npz", "--checkpoint",
               "ck.npz", "-q"])
    assert rc == 2 and "--out" in capsys.readouterr().err
    assert not (linear / "ck.npz").exists()                 # no fit ran


@pytest.mark.parametrize("case, words", [
    ("nan_model", ["non-finite model output", "f(x, u, p) = [nan]", "x = [", "--theta0"]),
    ("huge_data", ["data magnitude", "rescale"]),
    ("all_missing", ["all outputs missing", "y1"]),
])
def test_error_names_true_cause_and_cli_flags(linear, capsys, case, words):
    if case == "nan_model":
        argv = ["--model", "linmodel.py:make", "--model-kwargs", '{"nan_above": 0.3}', "--data", "d.csv"]
    elif case == "huge_data":
        df = pd.read_csv("d.csv")
        df["y0"] *= 1e300
        df.to_csv("big.csv", index=False)
        argv = ["--model", "linmodel.py:make", "--data", "big.csv"]
    else:
        pd.DataFrame({"y0": np.ones(30), "y1": np.nan}).to_csv("nan.csv", index=False)
        argv = ["--model", str(ROOT / "models" / "lorenz.py") + ":single_lorenz", "--data", "nan.csv"]
    assert main(["fit", *argv, "--out", "m.npz", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    first = err.split(": error: ", 1)[1]
    assert "\n" not in err and "x_init" not in err and "ceem()" not in err, err
    assert first.startswith(words[0]) or first.split(": ", 1)[1].startswith(words[0]), err
    for w in words:
        assert w in err, (w, err)


def test_solver_error_carries_last_good_result():
    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(1, seed=1), 60, measurement_std=0.05, seed=2)
    theta0 = {"sigma": 9.5, "rho": 29.0, "beta": 2.5}

    class FailingSecond(cc.learning.Learner):   # the second learning step reports an IPOPT failure
        calls = 0

        def solve(self, *a, **k):
            res = super().solve(*a, **k)
            FailingSecond.calls += 1
            return dataclasses.replace(res, status="Invalid_Number_Detected") if FailingSecond.calls == 2 else res

    sm = cc.smoothing.Smoother(model)
    quiet = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=5), smoother=sm,
                    learner=FailingSecond(model, data.lengths, stages=sm.stages))
    assert quiet.status == "solver_failed" and len(quiet.history) == 1
    FailingSecond.calls = 0
    with pytest.raises(cc.SolverError, match="learning failed") as info:
        cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=5, raise_on_failure=True), smoother=sm,
                learner=FailingSecond(model, data.lengths, stages=sm.stages))
    got = info.value.result
    assert got.status == "solver_failed" and len(got.history) == 1
    assert got.theta == quiet.theta and got.theta == quiet.history[0].theta      # the last good iterate


def test_time_column_checked(linear, caplog):
    model = build_model("linmodel.py:make")
    caplog.set_level(logging.WARNING, logger="ceem_casadi")
    cc.read_trajectories(["d.csv"], model)
    assert caplog.records == []                              # t = 0.1 k matches dt = 0.1: quiet
    df = pd.read_csv("d.csv")
    df.assign(t=0.25 * np.arange(len(df))).to_csv("slow.csv", index=False)
    cc.read_trajectories(["slow.csv"], model)
    assert "steps 0.25" in caplog.text and "dt is 0.1" in caplog.text
    caplog.clear()
    df.iloc[[0, 2, 1, *range(3, len(df))]].to_csv("shuffled.csv", index=False)
    cc.read_trajectories(["shuffled.csv"], model)
    assert "not sorted" in caplog.text and "row 2: 0.1 after 0.2" in caplog.text
