"""``evaluate --residuals --bands --plot``: the tables, the JSON and the figures (in-process ``main``)."""
from __future__ import annotations

import contextlib
import json

import pytest
from test_cli_inputs import write_inputs

from ceem_casadi.cli import main


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("assess")
    write_inputs(d)
    return d


def test_evaluate_residuals_and_bands(folder, capsys):
    with contextlib.chdir(folder):
        rc = main(["evaluate", "--model-file", "m.npz", "--data", "good.csv", "--residuals", "--bands",
                   "--uncertainty", "exact", "--k", "1,2", "--plot", "figs", "--json", "r.json"])
        out = capsys.readouterr().out
        assert rc == 0, out
        assert "Ljung-Box" in out and "one_step" in out and "free_run" in out and "half_width" in out
        rep = json.loads((folder / "r.json").read_text())
        assert set(rep["bands"]["bands"]) == {"simulation", "k=1", "k=2"}
        assert rep["residuals"]["kinds"]["one_step"]["autocorr"][0][0] == pytest.approx(1.0)
        assert {p.name for p in (folder / "figs").iterdir()} == {"residuals_one_step.png", "residuals_free_run.png",
                                                                 "band_simulation_0.png"}


def test_plot_alone_is_a_usage_error(folder, capsys):
    with contextlib.chdir(folder):
        assert main(["evaluate", "--model-file", "m.npz", "--data", "good.csv", "--plot", "figs2"]) == 2
    assert "--residuals" in capsys.readouterr().err
