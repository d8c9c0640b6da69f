"""The CLI's promises on the surfaces added last (issue 25, items 1, 2, 3, 6 and 7 as seen from the
command line): no code runs from the working directory, every output is checked before work and
results are written before anything optional, the API's warnings reach stderr, bad input exits 2
with one line that names the CLI option (never an API argument)."""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import ceem_casadi as cc
from ceem_casadi.cli import main
from ceem_casadi.deploy._modelfile import FORMAT, FORMAT_VERSION, read_archive, save_model
from ceem_casadi.em._checkpoint import write_checkpoint
from ceem_casadi.io._archive import write_archive
from models import lorenz

ROOT = Path(__file__).resolve().parents[1]
FACTORY = textwrap.dedent('''
    import ceem_casadi as cc

    def make(a=0.7):
        params = cc.Parameters(cc.Param("a", a))
        return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + 0.5, lambda x, u, p: x, nx=1,
                                                params=params, process_std=0.1, measurement_std=0.1,
                                                x1_mean=1.0, x1_std=1.0, name="lin")
''')
TRAP = 'open({marker!r}, "w").write("ran")\n'
# what the console script 'ceem-casadi' does: its sys.path[0] is the script's folder, never the cwd
CONSOLE = ("import os, sys; cwd = os.path.realpath(os.getcwd()); "
           "sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != cwd]; "
           "from ceem_casadi.cli import main; sys.exit(main())")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A shared folder as a user unpacks it: data, a factory file, a model file, and a pandas.py and
    matplotlib.py that would write a marker file if they ran."""
    d = tmp_path_factory.mktemp("shared")
    (d / "mymodel.py").write_text(FACTORY)
    spec = importlib.util.spec_from_file_location("trust_factory", d / "mymodel.py")  # not a cached 'mymodel'
    factory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(factory)
    model = factory.make()
    data, _ = cc.simulate(model, {"a": 0.8}, np.array([[1.0]]), 60, process_std=0.05, measurement_std=0.1, seed=3)
    pd.DataFrame({"y0": data.y[0][:, 0]}).to_csv(d / "d.csv", index=False)
    save_model(d / "m.npz", model, {"a": 0.8}, history=[{"iteration": 1, "J": -5.0, "theta": {"a": 0.8}}],
               metadata={"status": "converged"})
    for mod in ("pandas", "matplotlib"):
        (d / f"{mod}.py").write_text(TRAP.format(marker=str(d / f"RAN_{mod}")))
    return d


def _run(folder, *args, launcher="console"):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    head = ["-c", CONSOLE] if launcher == "console" else ["-m", "ceem_casadi.cli"]
    return subprocess.run([sys.executable, *head, *map(str, args)], capture_output=True, text=True, env=env,
                          cwd=folder, timeout=300)


# --- item 1 --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("launcher,command", [("console", "plot"), ("console", "fit"), ("module", "evaluate")])
def test_no_code_runs_from_the_working_directory(folder, launcher, command):
    """pandas.py / matplotlib.py in the working directory do not run; --model mymodel.py:make (a file of
    that directory) still works. Fails with the old sys.path.insert(0, os.getcwd()) in cli.main (and,
    for 'python -m', without drop_working_directory in cli/__main__.py)."""
    args = {"evaluate": ["evaluate", "--model-file", "m.npz", "--data", "d.csv"],
            "plot": ["plot", "--model-file", "m.npz", "--data", "d.csv", "--out-dir", f"figs_{launcher}"],
            "fit": ["fit", "--model", "mymodel.py:make", "--data", "d.csv", "--max-iters", "2", "--overwrite",
                    "--out", f"fit_{launcher}.npz", "-q"]}[command]
    proc = _run(folder, *args, launcher=launcher)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert not (folder / "RAN_pandas").exists() and not (folder / "RAN_matplotlib").exists()
    if command == "fit":
        assert abs(json.loads(proc.stdout)["theta"]["a"] - 0.8) < 0.1


def test_module_reference_of_the_working_directory_still_found(folder, monkeypatch):
    """'mymodel:make' (a module of the working directory, not on the path) is found with the directory
    put LAST on the path for that one import: installed modules keep precedence."""
    from ceem_casadi.model._source import load_factory

    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p and os.path.realpath(p) != str(folder.resolve())])
    before = list(sys.path)
    assert load_factory("mymodel:make")().nx == 1
    assert sys.path == before
    sys.modules.pop("mymodel", None)


# --- items 2, 3 ------------------------------------------------------------------------------------------
def test_plot_format_checked_before_any_work(folder, tmp_path, monkeypatch, capsys):
    """--plot cal.xyz is refused before the calibration runs (it used to fail after it, losing c.npz).
    Fails without figure_path in cmd_calibrate_noise."""
    import ceem_casadi.workflow._noise_calibration as nc

    monkeypatch.setattr(nc, "calibrate_noise", lambda *a, **k: pytest.fail("the calibration ran"))
    rc = main(["calibrate-noise", "--model-file", str(folder / "m.npz"), "--data", str(folder / "d.csv"),
               "--out", str(tmp_path / "c.npz"), "--plot", str(tmp_path / "cal.xyz")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--plot" in err[0] and ".png or .svg" in err[0]
    assert not (tmp_path / "c.npz").exists()


def test_results_written_before_the_optional_plot(folder, tmp_path, monkeypatch, capsys):
    """A plot that fails after the calibration: c.npz and the table are written, the failure is one
    warning line. Fails when the plot is saved before save_model (the old order)."""
    import ceem_casadi.cli._fit as cli_fit

    def broken(res, path):
        raise RuntimeError("the figure could not be drawn")

    monkeypatch.setattr(cli_fit, "_save_calibration_plot", broken)
    rc = main(["calibrate-noise", "--model-file", str(folder / "m.npz"), "--data", str(folder / "d.csv"),
               "--grid", "0.5,2", "--max-iters", "3", "--out", str(tmp_path / "c.npz"),
               "--table", str(tmp_path / "t.csv"), "--plot", str(tmp_path / "cal.png"), "-q"])
    err = capsys.readouterr().err
    assert rc in (0, 1)
    saved = cc.load_model(tmp_path / "c.npz")
    assert abs(saved.theta["a"] - 0.8) < 0.1
    assert len(pd.read_csv(tmp_path / "t.csv")) == 2
    assert "warning: --plot" in err and "the results were written" in err


def test_uncertainty_warning_reaches_the_user(tmp_path, caplog, capsys):
    """evaluate --uncertainty exact on a model file whose fit stopped at max_iters warns (logged: stderr
    under the CLI's logging set-up, and in the printed parameter block); the API warns for a
    CEEMResult, the CLI passed a bare theta. Fails without fit_outcome in cmd_evaluate."""
    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, np.array([[-6.0, -6.0, 24.0]]), 80, measurement_std=0.05, seed=1)
    pd.DataFrame({"y0": data.y[0][:, 0], "y1": data.y[0][:, 1]}).to_csv(tmp_path / "d.csv", index=False)
    save_model(tmp_path / "m.npz", model, {"sigma": 9.2, "rho": 26.5, "beta": 2.2},
               metadata={"status": "max_iters"})
    with caplog.at_level(logging.WARNING):
        rc = main(["evaluate", "--model-file", str(tmp_path / "m.npz"), "--data", str(tmp_path / "d.csv"),
                   "--uncertainty", "exact"])
    assert rc == 0
    assert any("'max_iters', not 'converged'" in r.getMessage() for r in caplog.records)
    assert "warning: the fit's status is 'max_iters'" in capsys.readouterr().out


# --- items 6, 7: exit 2 and one line naming the CLI option -------------------------------------------------
def _main_err(capsys, *args):
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err


def _deep_files(tmp_path):
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000
    (tmp_path / "deep.json").write_text(deep)
    (tmp_path / "deepx.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "deep.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    (tmp_path / "xl.toml").write_text("[smoother]\nx_lower = [0.0, 1.0]\n")


@pytest.mark.parametrize("flag,value", [("--theta0", "deep.json"), ("--model-kwargs", "deep.json"),
                                        ("--config", "deep.toml"), ("--config", "xl.toml")])
def test_fit_deep_or_wrong_length_inputs_exit_2_one_line(folder, tmp_path, capsys, flag, value):
    """100,000-deep JSON/TOML (RecursionError before) and an x_lower of the wrong length (a numpy
    broadcast traceback before) exit 2 with one line naming the option."""
    _deep_files(tmp_path)
    rc, err = _main_err(capsys, "fit", "--model", folder / "mymodel.py:make", "--data", folder / "d.csv",
                        "--out", tmp_path / "o.npz", "--max-iters", "2", flag, tmp_path / value)
    assert rc == 2 and len(err) == 1, err
    assert flag in err[0] and ("nested more than 64" in err[0] or "x_lower" in err[0])


def test_evaluate_deep_x0_exit_2(folder, tmp_path, capsys):
    _deep_files(tmp_path)
    rc, err = _main_err(capsys, "evaluate", "--model-file", folder / "m.npz", "--data", folder / "d.csv",
                        "--x0", tmp_path / "deepx.json")
    assert rc == 2 and len(err) == 1 and "--x0" in err[0] and "nested" in err[0]


def test_crafted_model_file_and_checkpoint_exit_2(folder, tmp_path, capsys):
    """A model file with history records lacking 'iteration' (KeyError in plot before) and a
    checkpoint missing a theta array (KeyError on --resume before)."""
    meta, arrays = read_archive(folder / "m.npz", expected_format=FORMAT, max_version=FORMAT_VERSION)
    meta.pop("sha256")
    meta["history"] = [{"J": 1.0}]
    write_archive(tmp_path / "bad.npz", meta, arrays)
    rc, err = _main_err(capsys, "plot", "--model-file", tmp_path / "bad.npz", "--out-dir", tmp_path / "f")
    assert rc == 2 and len(err) == 1 and "history[0].iteration" in err[0]
    ckpt = write_checkpoint(tmp_path / "o.npz.ckpt.npz", {"a": np.array(0.8)}, [], meta={"fingerprint": "x"})
    meta, arrays = read_archive(ckpt, expected_format="ceem_casadi.checkpoint", max_version=1)
    meta.pop("sha256")
    arrays.pop("theta/a")
    write_archive(ckpt, meta, arrays)
    rc, err = _main_err(capsys, "fit", "--model", folder / "mymodel.py:make", "--data", folder / "d.csv",
                        "--out", tmp_path / "o.npz", "--resume")
    assert rc == 2 and len(err) == 1 and "parameter 'a' is missing" in err[0]


def test_grid_overflow_names_the_cli_option(folder, tmp_path, capsys):
    """--grid 1e300: one line naming --grid, never 'x_init' or 'ceem()' (API advice) nor EKF levels.
    Fails without the grid overflow check in calibrate_noise and cli_message."""
    rc, err = _main_err(capsys, "calibrate-noise", "--model-file", folder / "m.npz", "--data", folder / "d.csv",
                        "--grid", "1e300", "--out", tmp_path / "c.npz")
    assert rc == 2 and len(err) == 1 and "--grid" in err[0]
    assert "x_init" not in err[0] and "ceem()" not in err[0] and "0.0001" not in err[0]


def test_model_beside_model_file_refused(folder, tmp_path, capsys):
    """--model was silently ignored beside --model-file; now the ambiguity is refused."""
    rc, err = _main_err(capsys, "evaluate", "--model-file", folder / "m.npz", "--model",
                        folder / "mymodel.py:make", "--data", folder / "d.csv")
    assert rc == 2 and len(err) == 1 and "--model-file" in err[0] and "--model" in err[0]


def test_trust_source_warns_before_importing(folder, tmp_path, caplog):
    """--trust-source warns, before the factory runs, that it imports and calls it (stderr under the CLI).
    Fails without the log.warning in load_model."""
    model_file = tmp_path / "t.npz"
    sys.path.insert(0, str(folder))
    try:
        import mymodel
        save_model(model_file, mymodel.make(), {"a": 0.8}, source=f"{folder / 'mymodel.py'}:make")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("mymodel", None)
    with caplog.at_level(logging.WARNING):
        rc = main(["evaluate", "--model-file", str(model_file), "--data", str(folder / "d.csv"), "--trust-source"])
    assert rc == 0
    assert any("importing and calling the model factory" in r.getMessage() and "mymodel.py:make" in r.getMessage()
               for r in caplog.records)
    sys.modules.pop("mymodel", None)


def test_states_format_checked_before_the_fit(folder, tmp_path, monkeypatch, capsys):
    """fit --states s.csv: refused before the fit (np.savez would silently write s.csv.npz after it)."""
    import ceem_casadi.em._checkpoint as ckpt

    monkeypatch.setattr(ckpt, "ceem_checkpointed", lambda *a, **k: pytest.fail("the fit ran"))
    rc, err = _main_err(capsys, "fit", "--model", folder / "mymodel.py:make", "--data", folder / "d.csv",
                        "--out", tmp_path / "o.npz", "--states", tmp_path / "s.csv")
    assert rc == 2 and len(err) == 1 and "--states" in err[0] and ".npz" in err[0]
