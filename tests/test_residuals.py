"""residual_analysis: correlations and Ljung-Box against independent numpy/scipy computations; the test's
decisions on a true and a wrong model; per-trajectory validation rows."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2, norm

import ceem_casadi as cc
from ceem_casadi.filtering import ekf


def _model():
    return cc.StateSpaceModel.from_discrete(
        lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
        params=cc.Parameters(cc.Param("a", 0.5), cc.Param("b", 1.0)), process_std=0.2, measurement_std=0.1)


@pytest.fixture(scope="module")
def case():
    model = _model()
    theta = {"a": 0.85, "b": 0.7}
    rng = np.random.default_rng(3)
    us = [rng.normal(size=(T, 1)) for T in (150, 120, 90)]
    data, _ = cc.simulate(model, theta, np.zeros((3, 1)), [150, 120, 90], u=us, process_std=0.2,
                          measurement_std=0.1, seed=4)
    ys = [y.copy() for y in data.y]
    ys[1][[5, 40, 41, 77]] = np.nan                      # missing outputs are masked
    return model, theta, cc.Trajectories(ys, us)


def _reference(e_list, u_list, lags):
    """Independent pooled correlations: np.correlate per trajectory on zero-filled centred series."""
    e_all = np.concatenate(e_list)
    ok = np.isfinite(e_all)
    mean = e_all[ok].mean()
    umean = np.concatenate(u_list).mean()
    ec = [np.where(np.isfinite(e), e - mean, 0.0) for e in e_list]
    uc = [u - umean for u in u_list]
    def full(a, c):   # sum_t a[t] c[t - tau] for tau = -(T-1) .. T-1
        return np.correlate(a, c, "full")
    Tm = [len(e) for e in ec]
    ee = sum(full(e, e)[T - 1:T + lags] for e, T in zip(ec, Tm))
    uu = sum(full(u, u)[T - 1:T + lags] for u, T in zip(uc, Tm))
    eu = sum(full(e, u)[T - 1 - lags:T + lags] for e, u, T in zip(ec, uc, Tm))
    return ee / ee[0], eu / np.sqrt(ee[0] * uu[0]), uu / uu[0], int(ok.sum())


@pytest.mark.parametrize("kind", ["one_step", "free_run"])
def test_correlations_match_an_independent_numpy_computation(case, kind):
    model, theta, data = case
    lags, skip = 12, 4
    res = cc.residual_analysis(model, data, theta, x0=np.zeros(1), lags=lags, skip=skip, kind=kind)
    vec = model.theta_vector(theta)
    es = []
    for b in range(len(data)):
        y, u = data.y[b], data.inputs(b)
        if kind == "free_run":
            pred = cc.simulate_output(model, theta, u, [0.0])
        else:
            pred = ekf(model, vec, y, u, x0=np.zeros(1), Sigma0=0.04, Q=0.04, R=0.01).y_pred
        es.append((y - pred)[skip:, 0])
    auto, cross, auto_u, n = _reference(es, [data.inputs(b)[skip:, 0] for b in range(len(data))], lags)
    c = res[kind]
    assert c.n[0] == n == sum(data.lengths) - 3 * skip - 4
    np.testing.assert_allclose(c.autocorr[0], auto, rtol=0, atol=1e-12)
    np.testing.assert_allclose(c.crosscorr[0, 0], cross, rtol=0, atol=1e-12)
    z = norm.ppf(0.995)
    assert c.auto_bound[0] == pytest.approx(z / np.sqrt(n), rel=1e-12)
    P = 1 + 2 * np.sum(auto[1:] * auto_u[1:])
    assert c.cross_bound[0, 0] == pytest.approx(z * np.sqrt(P / n), rel=1e-12)
    # Ljung-Box by hand
    Q = n * (n + 2) * sum(auto[t] ** 2 / (n - t) for t in range(1, lags + 1))
    assert c.ljung_box[0] == pytest.approx(Q, rel=1e-12)
    assert c.p_value[0] == pytest.approx(1 - chi2.cdf(Q, lags), rel=1e-9)


def test_ljung_box_dof_and_decisions():
    """The true model's one-step residuals pass, the wrong pole's fail; dof lowers the degrees of freedom."""
    model = _model()
    rng = np.random.default_rng(0)
    u = rng.normal(size=(600, 1))
    data, _ = cc.simulate(model, {"a": 0.9, "b": 1.0}, [0.0], 600, u=u, process_std=0.2, measurement_std=0.1, seed=2)
    good = cc.residual_analysis(model, data, {"a": 0.9, "b": 1.0}, x0=[0.0], kind="one_step")
    bad = cc.residual_analysis(model, data, {"a": 0.4, "b": 1.0}, x0=[0.0])
    assert good.white["one_step"][0] and not bad.white["one_step"][0] and not bad.white["free_run"][0]
    c = good["one_step"]
    two = cc.residual_analysis(model, data, {"a": 0.9, "b": 1.0}, x0=[0.0], kind="one_step", dof=2)["one_step"]
    assert two.p_value[0] == pytest.approx(chi2.sf(c.ljung_box[0], 23), rel=1e-12)
    df = bad.to_dataframe()
    assert list(df.index.get_level_values("kind")) == ["one_step", "free_run"]
    assert not df.loc[("free_run", "y0"), "independent"]          # a wrong pole: the residual follows the input
    assert set(bad.to_dict()["kinds"]) == {"one_step", "free_run"}
    assert "ResidualAnalysis(" in repr(bad)


def test_plot_writes_the_two_panel_figure(case, tmp_path):
    model, theta, data = case
    res = cc.residual_analysis(model, data, theta, x0=np.zeros(1), lags=10)
    path = res.plot(tmp_path / "resid.png")
    assert path.exists() and path.stat().st_size > 1000
    fig = res.plot(kind="free_run")
    assert len(fig.axes) == 2


def test_per_trajectory_rows_pool_to_the_pooled_row(case):
    model, theta, data = case
    rep = cc.validation_report(model, data, theta, x0=np.zeros(1), k=(1, 3), skip=2)
    for kind in ["simulation", 1, 3]:
        pooled = rep.simulation if kind == "simulation" else rep.prediction[kind]
        parts = [t["simulation"] if kind == "simulation" else t["prediction"][kind] for t in rep.trajectories]
        n = np.array([m.n[0] for m in parts])
        assert n.sum() == pooled.n[0]
        sse = sum(m.rmse[0] ** 2 * m.n[0] for m in parts)
        assert np.sqrt(sse / n.sum()) == pytest.approx(pooled.rmse[0], rel=1e-12)
    df = rep.to_dataframe(per_trajectory=True)
    assert df.loc[("simulation", "all", "y0"), "rmse"] == pytest.approx(rep.simulation.rmse[0])
    assert df.loc[("k=3", 2, "y0"), "n"] == rep.trajectories[2]["prediction"][3].n[0]
    assert len(rep.to_dict()["trajectories"]) == 3


def test_validation_report_starts_find_the_sign_of_a_sign_blind_output():
    """y = x^2 cannot tell x0 from -x0 on its own; a small input breaks the tie slowly. The default start (the
    EKF from x1_mean = +2) lands in the local minimum of the wrong sign (x0 ~ 1.43, free-run RMSE 0.69);
    starts=2 adds the mirror image and keeps the lower window cost."""
    model = cc.StateSpaceModel.from_discrete(
        lambda x, u, p: p.a * x + u, lambda x, u, p: x ** 2, nx=1, nu=1,
        params=cc.Parameters(cc.Param("a", 0.9)), process_std=0.01, measurement_std=0.01,
        x1_mean=[2.0], x1_std=[10.0])
    u = np.full((40, 1), 0.1)
    data, _ = cc.simulate(model, {"a": 0.9}, [-2.0], 40, u=u, measurement_std=0.01, seed=0)
    one = cc.validation_report(model, data, {"a": 0.9}, x0="estimate", k=(), window=10)
    two = cc.validation_report(model, data, {"a": 0.9}, x0="estimate", k=(), window=10, starts=2)
    assert one.x0[0, 0] > 0 and one.simulation.rmse[0] > 0.3
    assert two.x0[0, 0] == pytest.approx(-2.0, abs=0.05) and two.simulation.rmse[0] < 0.02
    given = cc.validation_report(model, data, {"a": 0.9}, x0="estimate", k=(), window=10, starts=[[-1.5]])
    assert given.x0[0, 0] == pytest.approx(-2.0, abs=0.05)
