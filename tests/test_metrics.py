"""Validation metrics against hand computations, and the k-step predictor against the EKF."""
import json

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.filtering import EKF
from ceem_casadi.workflow.assessment._metrics import Metrics, fit_percent, nrmse, rmse, validation_report


def test_array_helpers_by_hand():
    y = np.array([[1.0, 2.0], [2.0, np.nan], [3.0, 6.0], [4.0, 0.0]])
    yhat = np.array([[1.5, 2.0], [2.0, 1.0], [np.nan, 5.0], [3.0, 0.0]])
    # output 0 uses rows 0, 1, 3 (yhat NaN at row 2); output 1 uses rows 0, 2, 3 (y NaN at row 1)
    e0, e1 = np.array([-0.5, 0.0, 1.0]), np.array([0.0, 1.0, 0.0])
    r = np.array([np.sqrt(np.mean(e0 ** 2)), np.sqrt(np.mean(e1 ** 2))])
    sd = np.array([np.std([1.0, 2.0, 4.0]), np.std([2.0, 6.0, 0.0])])
    np.testing.assert_allclose(rmse(y, yhat), r, rtol=1e-14)
    np.testing.assert_allclose(nrmse(y, yhat), r / sd, rtol=1e-14)
    np.testing.assert_allclose(fit_percent(y, yhat), 100 * (1 - r / sd), rtol=1e-14)
    # 1-D input gives floats; (B, T, ny) pools over trajectories
    assert isinstance(rmse(y[:, 0], yhat[:, 0]), float)
    assert rmse(y[:, 0], yhat[:, 0]) == pytest.approx(r[0], rel=1e-14)
    np.testing.assert_allclose(rmse(np.stack([y, y]), np.stack([yhat, yhat])), r, rtol=1e-14)
    assert np.isnan(rmse(np.array([np.nan, 1.0]), np.array([1.0, np.nan])))
    m = Metrics.of(y, yhat)
    assert m.rmse_overall == pytest.approx(np.sqrt((np.sum(e0 ** 2) + np.sum(e1 ** 2)) / 6), rel=1e-14)
    assert m.fit_overall == pytest.approx(np.mean(100 * (1 - r / sd)), rel=1e-14)
    np.testing.assert_array_equal(m.n, [3, 3])
    with pytest.raises(cc.ShapeError, match="same shape"):
        rmse(y, yhat[:3])


def _linear(seed=0, T=80):
    rng = np.random.default_rng(seed)
    A = np.array([[0.95, 0.2, 0.0], [-0.2, 0.9, 0.1], [0.0, 0.0, 0.7]])
    B = rng.standard_normal((3, 1))
    C = rng.standard_normal((2, 3))
    params = cc.Parameters(cc.Param("A", A), cc.Param("B", B), cc.Param("C", C))
    model = cc.StateSpaceModel.from_discrete(
        lambda x, u, p: ca.mtimes(p.A, x) + ca.mtimes(p.B, u), lambda x, u, p: ca.mtimes(p.C, x),
        nx=3, nu=1, params=params, process_std=0.1, measurement_std=0.2)
    theta = {"A": A, "B": B, "C": C}
    x0 = rng.standard_normal((2, 3))
    u = [rng.standard_normal((T, 1)) for _ in range(2)]
    data, _ = cc.simulate(model, theta, x0, T, u=u, process_std=0.1, measurement_std=0.2, seed=seed)
    data = data.with_missing(0.05, seed=1)
    return model, theta, data, x0, (A, B, C)


def test_report_free_run_and_k_step_by_hand():
    model, theta, data, x0, (A, B, C) = _linear()
    rep = validation_report(model, data, theta, x0=x0, k=(1, 3), skip=2, output_names=["p", "q"])
    ekf = EKF(model)
    pv = model.theta_vector(theta)
    Q, R, S0 = 0.01 * np.eye(3), 0.04 * np.eye(2), 0.01 * np.eye(3)
    sims, p1, p3 = [], [], []
    for b in range(2):
        u, T = data.u[b], data.lengths[b]
        # free run by hand
        x, ys = x0[b].copy(), []
        for t in range(T):
            ys.append(C @ x)
            x = A @ x + B @ u[t]
        sims.append(np.array(ys))
        # EKF with the documented default covariances; k = 1 is its one-step predicted observation
        res = ekf.run(pv, data.y[b], u, x0=x0[b], Sigma0=S0, Q=Q, R=R)
        p1.append(res.y_pred)
        # k = 3 by hand: filtered mean at t-3 propagated 3 steps (the prior x0 for t < 3)
        y3 = np.empty((T, 2))
        for t in range(T):
            z, start = (res.x_filt[t - 3], t - 3) if t >= 3 else (x0[b], 0)
            for s in range(start, t):
                z = A @ z + B @ u[s]
            y3[t] = C @ z
        p3.append(y3)
    for b in range(2):
        np.testing.assert_allclose(rep.y_sim[b], sims[b], atol=1e-12)
        np.testing.assert_allclose(rep.y_pred[1][b], p1[b], atol=1e-12)
        np.testing.assert_allclose(rep.y_pred[3][b], p3[b], atol=1e-12)
    y = np.concatenate([a[2:] for a in data.y])
    for m, pred in [(rep.simulation, sims), (rep.prediction[1], p1), (rep.prediction[3], p3)]:
        yhat = np.concatenate([a[2:] for a in pred])
        np.testing.assert_allclose(m.rmse, rmse(y, yhat), rtol=1e-12)
        np.testing.assert_allclose(m.nrmse, nrmse(y, yhat), rtol=1e-12)
        np.testing.assert_allclose(m.fit_percent, fit_percent(y, yhat), rtol=1e-12)
    # filtering helps: the 1-step predictor beats the 3-step one, which beats the free run
    assert rep.prediction[1].rmse_overall < rep.prediction[3].rmse_overall < rep.simulation.rmse_overall
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["prediction"]["3"]["outputs"] == ["p", "q"] and d["skip"] == 2
    df = rep.to_dataframe()
    assert df.loc[("k=1", "q"), "rmse"] == pytest.approx(rep.prediction[1].rmse[1])
    assert df.loc[("simulation", "overall"), "fit_percent"] == pytest.approx(rep.simulation.fit_overall)


def test_exact_model_noise_free_fit_100_and_divergence_inf():
    model, theta, _, x0, _ = _linear()
    u = [np.ones((30, 1)), np.zeros((30, 1))]
    data, _ = cc.simulate(model, theta, x0, 30, u=u)
    rep = validation_report(model, data, theta, x0=x0, k=2)
    np.testing.assert_allclose(rep.simulation.fit_percent, 100.0, atol=1e-9)
    assert rep.prediction[2].rmse_overall < 1e-10
    bad = dict(theta, A=3.0 * theta["A"])            # unstable: the free run blows up to inf in 200 steps
    long, _ = cc.simulate(model, theta, x0, 800, u=[np.ones((800, 1))] * 2)
    rep = validation_report(model, long, bad, x0=x0, k=())
    assert rep.simulation.rmse_overall == np.inf and rep.prediction == {}


def test_report_errors():
    model, theta, data, x0, _ = _linear()
    with pytest.raises(cc.ShapeError, match="x0"):
        validation_report(model, data, theta, x0=np.zeros((3, 3)))
    with pytest.raises(cc.ShapeError, match="x0"):
        validation_report(model, data, theta, x0="guess")  # neither an array nor "estimate"
    with pytest.raises(cc.ShapeError, match="positive integer"):
        validation_report(model, data, theta, x0=x0, k=0)
    with pytest.raises(cc.ShapeError, match="skip"):
        validation_report(model, data, theta, x0=x0, skip=80)
    with pytest.raises(cc.ShapeError, match="ny"):
        validation_report(model, cc.Trajectories([y[:, :1] for y in data.y], list(data.u)), theta, x0=x0)
