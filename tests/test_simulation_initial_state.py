"""Free-run simulation (cached rollout) and initial-state estimation (issue 14, item 1)."""
import casadi as ca
import numpy as np
import pytest
from scipy.optimize import lsq_linear

import ceem_casadi as cc
from models import lorenz


def _linear(measurement_std=(0.2, 0.5), T=60, seed=0):
    rng = np.random.default_rng(seed)
    A = np.array([[0.95, 0.2, 0.0], [-0.2, 0.9, 0.1], [0.0, 0.0, 0.7]])
    B, C, D = rng.standard_normal((3, 1)), rng.standard_normal((2, 3)), rng.standard_normal((2, 1))
    params = cc.Parameters(cc.Param("A", A), cc.Param("B", B), cc.Param("C", C), cc.Param("D", D))
    model = cc.StateSpaceModel.from_discrete(
        lambda x, u, p: ca.mtimes(p.A, x) + ca.mtimes(p.B, u), lambda x, u, p: ca.mtimes(p.C, x) + ca.mtimes(p.D, u),
        nx=3, nu=1, params=params, process_std=0.1, measurement_std=measurement_std)
    theta = {"A": A, "B": B, "C": C, "D": D}
    x0 = rng.standard_normal((2, 3))
    u = [rng.standard_normal((T, 1)) for _ in range(2)]
    data, _ = cc.simulate(model, theta, x0, T, u=u, process_std=0.1, measurement_std=0.2, seed=seed)
    return model, theta, data.with_missing(0.1, seed=1), x0


def _loop(model, theta, x0, u):
    """Oracle: the free run step by step through model.f and model.g."""
    pv = model.theta_vector(theta)
    x, ys = np.asarray(x0, float), []
    for t in range(len(u)):
        ys.append(np.asarray(model.g(x, u[t], pv)).ravel())
        x = np.asarray(model.f(x, u[t], pv)).ravel()
    return np.array(ys)


def test_simulate_output_equals_a_python_loop_and_reuses_its_rollout():
    model, theta, data, x0 = _linear()
    u = data.u[0]
    y = cc.simulate_output(model, theta, u, x0[0])
    np.testing.assert_allclose(y, _loop(model, theta, x0[0], u), rtol=1e-13, atol=1e-13)
    F = cc.model.rollout(model, len(u))
    assert cc.model.rollout(model, len(u)) is F  # built once per (model structure, T), not on the model
    assert not any(k.startswith("_") for k in vars(model))
    # batches: a list of different lengths -> list; an array (B, T, nu) -> array (B, T, ny)
    ys = cc.simulate_output(model, theta, [u, u[:17]], x0)
    np.testing.assert_allclose(ys[1], _loop(model, theta, x0[1], u[:17]), rtol=1e-13, atol=1e-13)
    arr, xs = cc.simulate_output(model, theta, np.stack(data.u), x0, return_states=True)
    assert arr.shape == (2, len(u), 2) and xs.shape == (2, len(u), 3)
    np.testing.assert_allclose(arr[1], _loop(model, theta, x0[1], data.u[1]), rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(xs[:, 0], x0)


def test_simulate_without_inputs_needs_a_horizon_and_shares_the_cache():
    model = lorenz.single_lorenz()
    x0 = lorenz.initial_states(2, seed=3)
    data, xs = cc.simulate(model, lorenz.TRUE, x0, 40)  # noise-free: goes through the cached rollout
    assert cc.model.rollout(lorenz.single_lorenz(), 40) is cc.model.rollout(model, 40)  # equal structures share
    y = cc.simulate_output(model, lorenz.TRUE, x0=x0, horizon=40)
    np.testing.assert_array_equal(y, np.stack(data.y))
    np.testing.assert_allclose(y[0], _loop(model, lorenz.TRUE, x0[0], np.zeros((40, 0))), rtol=1e-12, atol=1e-12)
    with pytest.raises(cc.ShapeError, match="horizon"):
        cc.simulate_output(model, lorenz.TRUE, x0=x0[0])
    with pytest.raises(cc.ShapeError, match="estimate_initial_state"):
        cc.simulate_output(model, lorenz.TRUE, horizon=5)
    with pytest.raises(cc.ShapeError, match="x0"):
        cc.simulate_output(model, lorenz.TRUE, x0=np.zeros(2), horizon=5)


def test_simulate_with_process_noise_equals_the_step_by_step_recursion():
    model = lorenz.single_lorenz()
    x0 = lorenz.initial_states(1, seed=3)
    data, xs = cc.simulate(model, lorenz.TRUE, x0, 30, process_std=0.05, measurement_std=0.01, seed=7)
    rng = np.random.default_rng(7)  # the same draws in the same order
    w = rng.standard_normal((29, 3)) * 0.05
    pv = model.theta_vector(lorenz.TRUE)
    x = [x0[0]]
    for t in range(29):
        x.append(np.asarray(model.f(x[-1], np.zeros(0), pv)).ravel() + w[t])
    np.testing.assert_allclose(xs[0], np.array(x), rtol=1e-13, atol=1e-12)


def _lstsq_x0(model, theta, y, u, k, prior=None):
    """Oracle: y[t] = C A^t x0 + (forced response), weighted by 1/measurement_std, NaN rows dropped."""
    A, C = theta["A"], theta["C"]
    forced = _loop(model, theta, np.zeros(3), u[:k])
    rows, rhs = [], []
    obs = C.copy()
    for t in range(k):
        rows.append(obs / model.noise.measurement_std[:, None])
        rhs.append((y[t] - forced[t]) / model.noise.measurement_std)
        obs = obs @ A
    G, r = np.vstack(rows), np.concatenate(rhs)
    ok = np.isfinite(r)
    G, r = G[ok], r[ok]
    if prior is not None:
        mean, std = prior
        G, r = np.vstack([G, np.diag(1 / std)]), np.concatenate([r, mean / std])
    return G, r


def test_linear_initial_state_equals_the_least_squares_solution():
    model, theta, data, _ = _linear()
    k = 12
    est = cc.estimate_initial_state(model, data, theta, window=k)
    assert est.shape == (2, 3)
    for b in range(2):
        G, r = _lstsq_x0(model, theta, data.y[b], data.u[b], k)
        np.testing.assert_allclose(est[b], np.linalg.lstsq(G, r, rcond=None)[0], atol=1e-8)
    # one trajectory -> (nx,); the solver is built once per (model, window)
    one = cc.estimate_initial_state(model, data.y[0], theta, u=data.u[0], window=k)
    np.testing.assert_allclose(one, est[0], atol=1e-10)
    from ceem_casadi.workflow._initial_state import solver_for
    assert solver_for(model, k) is solver_for(model.with_noise(measurement_std=1.0), k)  # built once, shared


def test_initial_state_with_prior_and_bounds_against_scipy():
    model, theta, data, _ = _linear()
    k = 8
    mean, std = np.array([0.5, -0.3, 0.2]), np.array([0.3, 1.0, 0.05])
    cc.estimate_initial_state(model, data.y[0], theta, u=data.u[0], window=k)  # solver cached on model ...
    with_prior = model.with_noise(x1_mean=mean, x1_std=std)  # ... and shared with this copy
    got = cc.estimate_initial_state(with_prior, data.y[0], theta, u=data.u[0], window=k)
    G, r = _lstsq_x0(model, theta, data.y[0], data.u[0], k, prior=(mean, std))
    np.testing.assert_allclose(got, np.linalg.lstsq(G, r, rcond=None)[0], atol=1e-8)
    # bounds: the unconstrained optimum violates them; scipy's bounded linear least squares is the oracle
    G, r = _lstsq_x0(model, theta, data.y[0], data.u[0], k)
    free = np.linalg.lstsq(G, r, rcond=None)[0]
    hi = free - 0.3
    got = cc.estimate_initial_state(model, data.y[0], theta, u=data.u[0], window=k, x_upper=hi)
    ref = lsq_linear(G, r, bounds=(-np.inf, hi), tol=1e-14).x
    assert np.all(got <= hi + 1e-9)
    np.testing.assert_allclose(got, ref, atol=1e-6)


def test_nonlinear_initial_state_recovers_the_truth_from_noise_free_data():
    model = lorenz.single_lorenz()
    x0 = lorenz.initial_states(3, seed=10)
    data, _ = cc.simulate(model, lorenz.TRUE, x0, 40)
    est = cc.estimate_initial_state(model, data, lorenz.TRUE, window=15, x_init=x0 + 2.0)
    np.testing.assert_allclose(est, x0, atol=1e-6)
    # candidate starts: the solve begins from the one with the lowest cost
    res = cc.estimate_initial_state(model, data.y[0], lorenz.TRUE, window=15, x_init=np.zeros(3),
                                    starts=[x0[0] + 0.5, x0[0] + 30.0], full_output=True)
    assert res.status == "converged" and np.allclose(res.x0, x0[0], atol=1e-6) and res.cost < 1e-12


def test_a_record_whose_first_samples_are_missing_gets_a_window_counted_from_its_first_observation():
    """Leading dropouts (the first 35 samples of trajectory 0 missing, more than the default 10 nx = 30): the
    default window counts from the first observed sample, so the estimate equals the least-squares x0 over the
    first 30 + 35 samples, and output error fits such a record (every start failed with "every output in the
    first 30 samples is missing"); so does validation_report. Fails without ``+ lead`` in `default_window` (or
    without ``data.y`` in `_predictions.resolve_initial_states`)."""
    model, theta, data, _ = _linear(T=80)
    y = [yb.copy() for yb in data.y]
    y[0][:35] = np.nan
    lead = max(int(np.argmax(np.any(np.isfinite(yb), axis=1))) for yb in y)
    assert lead >= 35
    holed = cc.Trajectories(y, data.u)
    est = cc.estimate_initial_state(model, holed, theta)
    for b in range(2):
        G, r = _lstsq_x0(model, theta, y[b], data.u[b], 30 + lead)
        np.testing.assert_allclose(est[b], np.linalg.lstsq(G, r, rcond=None)[0], atol=1e-8)
    assert cc.refine_output_error(model, holed, theta).status == "converged"
    assert cc.validation_report(model, holed, theta).skip == 30 + lead     # scored after the same window


def test_initial_state_errors():
    model, theta, data, _ = _linear()
    with pytest.raises(cc.ShapeError, match="window"):
        cc.estimate_initial_state(model, data, theta, window=1000)
    with pytest.raises(cc.ShapeError, match="u\\[0\\]"):
        cc.estimate_initial_state(model, data.y[0], theta, u=np.zeros((5, 1)))
    with pytest.raises(cc.ShapeError, match="x_upper"):
        cc.estimate_initial_state(model, data, theta, x_upper=np.zeros(2))


def test_readme_validation_call_works_for_a_model_without_x1_mean():
    # the model and data of README "Using it", exactly (no x1_mean)
    C = np.array([[1.0, 0, 0], [0, 0, 1.0]])
    params = cc.Parameters(cc.Param("sigma", 9.0, lower=0), cc.Param("rho", 26.0), cc.Param("beta", 3.0))

    def lorenz_rhs(x, u, p):
        return ca.vertcat(p.sigma * (x[1] - x[0]), x[0] * (p.rho - x[2]) - x[1], x[0] * x[1] - p.beta * x[2])
    model = cc.StateSpaceModel.from_ode(lorenz_rhs, lambda x, u, p: C @ x, nx=3, dt=0.04, params=params,
                                        process_std=0.01, measurement_std=0.01)
    truth = {"sigma": 10.0, "rho": 28.0, "beta": 8 / 3}
    data, x_true = cc.simulate(model, truth, x0=np.array([[-6.0, -6, 24]]), horizon=128,
                               measurement_std=0.01, seed=0)
    theta = truth
    report = cc.validation_report(model, data, theta, k=(1, 10))
    # x0 estimated from the first 30 = 10 nx samples, which are then left out of the metrics
    assert report.skip == 30 and report.simulation.n.tolist() == [98, 98]
    x0 = cc.estimate_initial_state(model, data, theta, window=30)
    np.testing.assert_allclose(report.x0, x0, atol=1e-9)
    assert np.abs(x0[0] - x_true[0][0]).max() < 0.05
    yhat = cc.simulate_output(model, theta, x0=x0, horizon=128)[0]
    np.testing.assert_allclose(report.simulation.rmse, cc.workflow.rmse(data.y[0][30:], yhat[30:]), rtol=1e-10)
    assert report.simulation.rmse_overall < 0.05  # measurement noise 0.01, x0 error amplified by chaos


def test_initial_state_time_limit_is_reported():
    model, theta, data, _ = _linear()
    res = cc.estimate_initial_state(model, data, theta, window=8, time_limit=1e-9, full_output=True)
    assert all(r.status == cc.Status.TIME_LIMIT and r.iterations <= 1 and np.all(np.isfinite(r.x0)) for r in res)


def test_the_removed_exact_hessian_is_refused_and_gauss_newton_warns():
    model, theta, data, _ = _linear()
    plain = cc.estimate_initial_state(model, data, theta, window=12)
    with pytest.warns(DeprecationWarning, match="always Gauss-Newton"):
        same = cc.estimate_initial_state(model, data, theta, window=12, hessian="gauss-newton")
    np.testing.assert_array_equal(same, plain)
    with pytest.raises(cc.OptionsError, match="hessian='exact' was removed.*docs/validation.md"):
        cc.estimate_initial_state(model, data, theta, window=12, hessian="exact")
