"""simulation_bands: the linear band is exact where the output is linear in theta (sampling agrees), close on a
mildly nonlinear one, and equals an independent finite-difference propagation; k-step bands; plots."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

import ceem_casadi as cc


def _model():
    return cc.StateSpaceModel.from_discrete(
        lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
        params=cc.Parameters(cc.Param("a", 0.5), cc.Param("b", 1.0)), process_std=0.05, measurement_std=0.1)


@pytest.fixture(scope="module")
def case():
    model = _model()
    u = np.sin(np.arange(60) / 5.0)[:, None]
    data, _ = cc.simulate(model, {"a": 0.8, "b": 1.0}, [0.0], 60, u=u, process_std=0.05, measurement_std=0.1,
                          seed=0)
    return model, data


def test_linear_band_is_exact_when_the_output_is_linear_in_theta(case):
    """Only b uncertain: the free run is linear in b, so the linear band is exact and sampling converges to it."""
    model, data = case
    unc = {"index": [1], "covariance": [[0.01]]}
    lin = cc.simulation_bands(model, data, {"a": 0.8, "b": 1.0}, unc, x0=[0.0])
    mc = cc.simulation_bands(model, data, {"a": 0.8, "b": 1.0}, unc, x0=[0.0], method="sampling", samples=4000,
                             seed=1)
    # exact: the free run is b * s(t), s the run with b = 1; std = 0.1 |s|
    s = cc.simulate_output(model, {"a": 0.8, "b": 1.0}, data.u[0], [0.0])
    np.testing.assert_allclose(lin.simulation.std[0], 0.1 * np.abs(s), rtol=1e-10, atol=1e-14)
    hw_lin = lin.simulation.upper[0] - lin.simulation.lower[0]
    hw_mc = mc.simulation.upper[0] - mc.simulation.lower[0]
    big = np.abs(s[:, 0]) > 0.3
    np.testing.assert_allclose(hw_mc[big], hw_lin[big], rtol=0.05)
    assert lin.simulation.coverage([s]).item() == 1.0


def test_linear_band_agrees_with_sampling_on_a_mildly_nonlinear_model(case):
    model, data = case
    unc = {"index": [0, 1], "covariance": [[1e-4, 2e-5], [2e-5, 4e-4]]}
    theta = {"a": 0.8, "b": 1.0}
    lin = cc.simulation_bands(model, data, theta, unc, x0=[0.0], measurement_noise=True)
    mc = cc.simulation_bands(model, data, theta, unc, x0=[0.0], method="sampling", samples=3000, seed=2,
                             measurement_noise=True)
    np.testing.assert_allclose(mc.simulation.half_width(5), lin.simulation.half_width(5), rtol=0.04)
    # independent first-order propagation by central differences
    vec = model.theta_vector(theta)
    cov = np.asarray(unc["covariance"])
    J = []
    for i in range(2):
        h = np.zeros(2)
        h[i] = 1e-6
        up = cc.simulate_output(model, vec + h, data.u[0], [0.0])
        dn = cc.simulate_output(model, vec - h, data.u[0], [0.0])
        J.append(((up - dn) / 2e-6)[:, 0])
    J = np.array(J).T
    sd = np.sqrt(np.einsum("ti,ij,tj->t", J, cov, J) + 0.01)
    np.testing.assert_allclose(lin.simulation.std[0][:, 0], sd, rtol=1e-6)
    z = norm.ppf(0.975)
    np.testing.assert_allclose(lin.simulation.upper[0][:, 0], lin.simulation.y_hat[0][:, 0] + z * sd, rtol=1e-6)


def test_k_step_bands_linear_and_sampling_agree(case, tmp_path):
    model, data = case
    unc = {"index": [0, 1], "covariance": [[1e-4, 0.0], [0.0, 4e-4]]}
    theta = {"a": 0.8, "b": 1.0}
    lin = cc.simulation_bands(model, data, theta, unc, x0=[0.0], k=2)
    mc = cc.simulation_bands(model, data, theta, unc, x0=[0.0], k=2, method="sampling", samples=1000, seed=3)
    rep = cc.validation_report(model, data, theta, x0=[0.0], k=2)
    np.testing.assert_allclose(lin.prediction[2].y_hat[0], rep.y_pred[2][0], rtol=1e-12)
    np.testing.assert_allclose(mc.prediction[2].half_width(5), lin.prediction[2].half_width(5), rtol=0.1)
    # a k-step prediction is less uncertain than the free run
    assert lin.prediction[2].half_width(5)[0] < lin.simulation.half_width(5)[0]
    assert lin.plot(tmp_path / "band.png").exists()
    assert lin.plot(tmp_path / "band2.svg", k=2).exists()
    df = lin.to_dataframe()
    assert list(df.index.get_level_values("kind")) == ["simulation", "k=2"]
    assert set(lin.to_dict()["bands"]) == {"simulation", "k=2"}


def test_parameters_without_interval_are_held_fixed_and_said(case):
    model, data = case
    unc = {"index": [0, 1], "covariance": [[1e-4, 0.0], [0.0, 1.0]], "std_error": [0.01, np.inf],
           "names": ["a", "b"]}
    res = cc.simulation_bands(model, data, {"a": 0.8, "b": 1.0}, unc, x0=[0.0])
    only_a = cc.simulation_bands(model, data, {"a": 0.8, "b": 1.0}, {"index": [0], "covariance": [[1e-4]]}, x0=[0.0])
    np.testing.assert_allclose(res.simulation.std[0], only_a.simulation.std[0], rtol=1e-12)
    assert "['b']" in res.warnings[0]
    with pytest.raises(cc.ShapeError, match="covariance"):
        cc.simulation_bands(model, data, {"a": 0.8, "b": 1.0}, {"index": [0, 1], "covariance": [[1.0]]}, x0=[0.0])


def test_a_model_files_uncertainty_gives_the_same_band(case, tmp_path):
    """The dict a model file stores (entries by name, no index) gives the band of the ParameterUncertainty."""
    model, data = case
    theta = {"a": 0.8, "b": 1.0}
    unc = cc.parameter_uncertainty(model, data, theta)
    cc.save_model(tmp_path / "m.npz", model, theta, uncertainty=unc)
    saved = cc.load_model(tmp_path / "m.npz").uncertainty
    assert "index" not in saved
    a = cc.simulation_bands(model, data, theta, unc, x0=[0.0]).simulation.std[0]
    b = cc.simulation_bands(model, data, theta, saved, x0=[0.0]).simulation.std[0]
    np.testing.assert_allclose(b, a, rtol=1e-12)
    assert a.max() > 0.01
