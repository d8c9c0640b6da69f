"""Where parameter uncertainty surfaces: model files (covariance array + JSON, no pickle), the
validation report, the CLI's evaluate (estimate ± standard error, JSON), the interval plot."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import ceem_casadi as cc
from ceem_casadi.cli import main
from ceem_casadi.plots import plot_parameter_intervals
from models import lorenz

KW = {"measurement_std": 0.05}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A single-Lorenz fit (2 x 80 samples), its uncertainty, a CSV of the data and a model file."""
    tmp = tmp_path_factory.mktemp("unc")
    model = lorenz.single_lorenz(**KW)
    data, _ = cc.simulate(model, lorenz.TRUE, np.array([[-6.0, -6.0, 24.0], [-4.0, -7.0, 22.0]]), 80,
                          measurement_std=0.05, seed=1)
    fit = cc.ceem(model, data, lorenz.perturbed(lorenz.TRUE, 0.05, seed=0),
                  options=cc.CEEMOptions(acceleration="newton"))
    unc = cc.parameter_uncertainty(model, data, fit)
    csv = tmp / "data.csv"
    pd.concat([pd.DataFrame({"traj": b, "y0": y[:, 0], "y1": y[:, 1]}) for b, y in enumerate(data.y)]).to_csv(
        csv, index=False)
    path = cc.save_model(tmp / "m.npz", model, fit.theta, source="models.lorenz:single_lorenz", kwargs=KW,
                         extra={"x0": np.array([x[0] for x in fit.x])}, uncertainty=unc)
    return model, data, fit, unc, csv, path


def test_model_file_stores_the_covariance(fitted):
    model, data, fit, unc, csv, path = fitted
    saved = cc.load_model(path)
    np.testing.assert_array_equal(saved.uncertainty["covariance"], unc.covariance)
    assert saved.uncertainty["names"] == ["sigma", "rho", "beta"]
    np.testing.assert_allclose(saved.uncertainty["std_error"], unc.std_error, rtol=1e-15)
    plain = cc.save_model(path.with_name("plain.npz"), model, fit.theta)
    assert cc.load_model(plain).uncertainty is None


def test_validation_report_and_cli_evaluate(fitted, tmp_path, capsys):
    model, data, fit, unc, csv, path = fitted
    report = cc.validation_report(model, data, fit.theta, x0=[x[0] for x in fit.x], uncertainty=unc)
    assert report.to_dict()["parameters"]["std_error"] == unc.std_error.tolist()
    assert "parameters" not in cc.validation_report(model, data, fit.theta, x0=[x[0] for x in fit.x]).to_dict()

    out = tmp_path / "r.json"
    assert main(["evaluate", "--model-file", str(path), "--data", str(csv), "--trajectory-column", "traj",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for n, e, s in zip(unc.names, unc.estimate, unc.std_error):
        assert f"{n} = {e:.6g} ± {s:.3g}" in text
    stored = json.loads(out.read_text())["parameters"]
    np.testing.assert_allclose(stored["std_error"], unc.std_error, rtol=1e-12)
    np.testing.assert_allclose(stored["covariance"], unc.covariance, rtol=1e-12)
    # recomputed from the (same) data at the saved theta: the same standard errors
    assert main(["evaluate", "--model-file", str(path), "--data", str(csv), "--trajectory-column", "traj",
                 "--uncertainty", "gauss-newton", "--json", str(out)]) == 0
    recomputed = json.loads(out.read_text())["parameters"]
    assert recomputed["hessian"] == "gauss-newton"
    np.testing.assert_allclose(recomputed["std_error"], unc.std_error, rtol=0.02)


def test_plot_parameter_intervals(fitted, tmp_path):
    unc = fitted[3]
    p = plot_parameter_intervals(unc, tmp_path / "iv.png", truth=lorenz.TRUE)
    assert p.stat().st_size > 5000
    p = plot_parameter_intervals(cc.load_model(fitted[5]).uncertainty, tmp_path / "iv.svg")
    assert p.read_text().count("<svg") == 1
    with pytest.raises(ValueError, match="must end in"):
        plot_parameter_intervals(unc, tmp_path / "iv.jpg")
