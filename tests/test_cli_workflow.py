"""CLI workflow of issue 14 item 8: ``refine`` (output error), ``calibrate-noise``, and ``evaluate`` /
``plot`` estimating x0 for a model without an x1 prior; bad values of every new flag exit 2 with one
line. In-process (``main(argv)``) on a small damped oscillator with a hidden velocity."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pytest

import ceem_casadi as cc
from ceem_casadi.cli import main
from ceem_casadi.deploy._modelfile import load_model

OSC = textwrap.dedent('''
    import casadi as ca
    import ceem_casadi as cc

    def osc(k=1.0, c=0.2, process_std=0.01, measurement_std=0.01):
        """Damped oscillator (Euler, dt 0.1): position observed, velocity hidden; no x1 prior."""
        params = cc.Parameters(cc.Param("k", k, lower=0.05, upper=10.0), cc.Param("c", c, lower=0.0, upper=5.0))
        def step(x, u, p):
            return ca.vertcat(x[0] + 0.1 * x[1], x[1] + 0.1 * (-p.k * x[0] - p.c * x[1] + u[0]))
        return cc.StateSpaceModel.from_discrete(step, lambda x, u, p: x[0], nx=2, nu=1, params=params, dt=0.1,
                                                process_std=process_std, measurement_std=measurement_std)
''')
TRUE = {"k": 2.0, "c": 0.3}
X0 = np.array([[1.0, -0.5], [-0.8, 0.6]])
SIGMA_V = 0.01


def _osc_model():
    namespace: dict = {}
    exec(OSC, namespace)
    return namespace["osc"]()


def write_workflow(d) -> None:
    """osc.py and sim.csv in folder ``d``: two trajectories of 120 samples, zero process noise,
    sensor noise 0.01 (shared with tests/test_cli_exit2.py)."""
    (d / "osc.py").write_text(OSC)
    model = _osc_model()
    rng = np.random.default_rng(3)
    u = [np.sin(0.2 * np.arange(120.0))[:, None] + 0.3 * rng.standard_normal((120, 1)) for _ in X0]
    data, xs = cc.simulate(model, TRUE, X0, 120, u=u, process_std=0.0, measurement_std=SIGMA_V, seed=4)
    pd.concat([pd.DataFrame({"trajectory": b, "u0": data.inputs(b)[:, 0], "y0": data.y[b][:, 0]})
               for b in range(len(data))]).to_csv(d / "sim.csv", index=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("workflow")
    write_workflow(d)
    return d


def _run(folder, monkeypatch, capsys, *argv):
    monkeypatch.chdir(folder)
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_refine_recovers_truth_single_and_multiple_shooting(folder, monkeypatch, capsys):
    """From the factory's k = 1, c = 0.2 (truth 2, 0.3), output error reaches the truth within the
    noise's reach, and the estimated initial states are the simulated ones; multiple shooting has
    the same optimum."""
    thetas = []
    for extra in ([], ["--shooting", "10"]):
        out = f"refined{len(thetas)}.npz"
        rc, stdout, err = _run(folder, monkeypatch, capsys, "refine", "--model", "osc.py:osc", "--data", "sim.csv",
                               "--out", out, *extra)
        assert rc == 0, err
        saved = load_model(folder / out)
        for k, v in TRUE.items():
            assert abs(float(saved.theta[k]) - v) < 0.02 * v, (k, saved.theta)
        np.testing.assert_allclose(saved.extra["x0"], X0, atol=0.02)
        summary = json.loads(stdout)
        assert summary["cost_after"] < summary["cost_before"] and "cost" in err
        thetas.append([float(saved.theta[k]) for k in TRUE])
    np.testing.assert_allclose(thetas[0], thetas[1], rtol=1e-5)


def test_refine_time_limit_exit_1_file_written(folder, monkeypatch, capsys):
    rc, stdout, _ = _run(folder, monkeypatch, capsys, "refine", "--model", "osc.py:osc", "--data", "sim.csv",
                         "--out", "short.npz", "--max-iter", "1")
    assert rc == 1 and json.loads(stdout)["status"] == "max_iters"
    assert (folder / "short.npz").is_file()


def test_calibrate_noise_matches_library(folder, monkeypatch, capsys):
    """The chosen level, the table and the saved model's process noise are those of cc.calibrate_noise."""
    rc, stdout, err = _run(folder, monkeypatch, capsys, "calibrate-noise", "--model", "osc.py:osc", "--data",
                           "sim.csv", "--grid", "0.1,1,10", "--max-iters", "8", "--out", "cal.npz",
                           "--table", "cal.csv", "--plot", "cal.png")
    assert rc in (0, 1), err
    model = _osc_model()
    data = cc.Trajectories([g[["y0"]].to_numpy() for _, g in pd.read_csv(folder / "sim.csv").groupby("trajectory")],
                           [g[["u0"]].to_numpy() for _, g in pd.read_csv(folder / "sim.csv").groupby("trajectory")],
                           0.1)
    ref = cc.calibrate_noise(model, data, model.params.initial(), grid=[0.1, 1, 10], criterion="innovation",
                             options=cc.NoiseCalibrationOptions(ceem=cc.CEEMOptions(max_iters=8,
                                                                                    acceleration="newton")))
    table = pd.read_csv(folder / "cal.csv")
    np.testing.assert_allclose(table["level"], ref.levels["level"])
    np.testing.assert_allclose(table["criterion"], ref.levels["criterion"], rtol=1e-6)
    assert table.loc[table["chosen"], "level"].item() == ref.best.level == json.loads(stdout)["level"]
    saved = load_model(folder / "cal.npz")
    np.testing.assert_allclose(saved.model.noise.process_std, ref.best.process_std)
    np.testing.assert_allclose([float(saved.theta[k]) for k in TRUE], [float(ref.best.theta[k]) for k in TRUE],
                               rtol=1e-6)
    assert (folder / "cal.png").stat().st_size > 1000 and len(saved.history) == len(ref.best.fit.history)


def test_evaluate_and_plot_estimate_x0_without_prior(folder, monkeypatch, capsys):
    """The true model (no x1_mean) evaluated without x0: the free-run RMS is the sensor noise, which
    only a right initial state gives (zeros: > 0.3); --x0-window N leaves N samples out; --x0 as given."""
    truth = ["--model", "osc.py:osc", "--model-kwargs", json.dumps(TRUE), "--data", "sim.csv"]
    for extra, skip in (([], 20), (["--x0-window", "8"], 8), (["--x0", json.dumps(X0.tolist())], 0),
                        (["--x0", "estimate"], 20)):
        rc, stdout, err = _run(folder, monkeypatch, capsys, "evaluate", *truth, "--k", "1", "--json", "r.json", *extra)
        assert rc == 0, err
        report = json.loads((folder / "r.json").read_text())
        assert report["skip"] == skip
        assert 0.7 * SIGMA_V < report["simulation"]["overall"]["rmse"] < 1.3 * SIGMA_V, (extra, report)
        assert ("estimated from the first" in stdout) == (skip > 0)
    rc, _, _ = _run(folder, monkeypatch, capsys, "evaluate", *truth, "--x0", "[[0, 0], [0, 0]]", "--json", "r.json")
    assert rc == 0 and json.loads((folder / "r.json").read_text())["simulation"]["overall"]["rmse"] > 0.3

    rc, stdout, err = _run(folder, monkeypatch, capsys, "plot", *truth, "--trajectory", "1", "--x0-window", "10",
                           "--out-dir", "figs")
    assert rc == 0, err
    assert "estimated from the first 10 samples" in stdout
    for name in ("states", "simulation", "prediction"):
        assert (folder / "figs" / f"{name}.png").stat().st_size > 1000
