"""The learning step (M-step) on a model linear in its parameters, against a dense least-squares
solve of the same trust-region problem."""
import numpy as np
import pytest

import ceem_casadi as cc


def _linear_in_theta(rng, nx=2, nu=1, ny=1):
    """x+ = A x + B u (A, B free), y = C x (C fixed): the learning objective is quadratic in (A, B)."""
    A = np.array([[0.8, 0.2], [-0.1, 0.7]])
    B, C = rng.standard_normal((nx, nu)), rng.standard_normal((ny, nx))
    params = cc.Parameters(cc.Param("A", A), cc.Param("B", B), cc.Param("C", C, free=False))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.A @ x + p.B @ u, lambda x, u, p: p.C @ x,
                                             nx=nx, nu=nu, params=params, process_std=[0.1, 0.2],
                                             measurement_std=0.05)
    return model, {"A": A, "B": B, "C": C}


def _dense_learn(model, data, xs, theta_prev, rho, weights):
    """argmin_z 0.5 sum_b w_b ||r_b(z)||^2 + rho ||z - z_prev||^2 over the free entries z, by the
    normal equations (r is affine in z; its Jacobian is taken column by column)."""
    params = model.params
    free = params.free_index
    iw = 1 / model.noise.process_std

    def residual(z):
        vec = theta_prev.copy()
        vec[free] = z
        th = params.from_vector(vec)
        return np.concatenate([np.sqrt(w) * (iw * (x[1:] - x[:-1] @ th["A"].T - data.u[b][:-1] @ th["B"].T)).ravel()
                               for b, (x, w) in enumerate(zip(xs, weights))])

    r0 = residual(np.zeros(free.size))
    J = np.column_stack([residual(e) - r0 for e in np.eye(free.size)])
    z_prev = theta_prev[free]
    z = np.linalg.solve(J.T @ J + 2 * rho * np.eye(free.size), -J.T @ r0 + 2 * rho * z_prev)
    out = theta_prev.copy()
    out[free] = z
    return out


@pytest.mark.parametrize("hessian", ["exact", "gauss-newton", "limited-memory"])
def test_learner_trust_region_and_weights_equal_dense_solve(hessian):
    rng = np.random.default_rng(0)
    model, truth = _linear_in_theta(rng)
    us = [rng.standard_normal((40, 1)), rng.standard_normal((30, 1))]
    data, xs = cc.simulate(model, truth, rng.standard_normal((2, 2)), [40, 30], u=us,
                           process_std=model.noise.process_std, measurement_std=0.05, seed=1)
    prev = model.theta_vector({**truth, "A": truth["A"] + 0.3, "B": truth["B"] - 0.5})
    rho, weights = 50.0, np.array([0.3, 2.0])
    want = _dense_learn(model, data, xs, prev, rho, weights)
    plain = _dense_learn(model, data, xs, prev, 0.0, np.ones(2))
    assert np.abs(want - plain).max() > 0.05  # the trust region and the weights matter here
    tol = 1e-5 if hessian == "limited-memory" else 1e-7
    via_options = cc.learning.Learner(model, data.lengths, cc.LearnerOptions(rho_theta=rho, hessian=hessian))
    res = via_options.solve(prev, data, xs, weights=weights)
    assert res.success, res.status
    if hessian != "limited-memory":  # a quadratic with its exact Hessian: one Newton step
        assert res.iterations == 1, res.iterations
    else:  # quasi-Newton: more than one step (an exact Hessian would take one)
        assert res.iterations > 1, res.iterations
    np.testing.assert_allclose(res.theta_vec, want, atol=tol)
    learner = cc.learning.Learner(model, data.lengths, cc.LearnerOptions(hessian=hessian))
    np.testing.assert_allclose(learner.solve(prev, data, xs, rho_theta=rho, weights=weights).theta_vec, want, atol=tol)
    np.testing.assert_allclose(via_options.solve(prev, data, xs, rho_theta=0.0).theta_vec, plain, atol=tol)
    # warm-started at its optimum, the solve stops at once
    at_optimum = via_options.solve(plain, data, xs, rho_theta=0.0)
    assert at_optimum.success and at_optimum.iterations == 0, at_optimum.iterations
    # the fixed C is never touched
    np.testing.assert_array_equal(model.params.from_vector(res.theta_vec)["C"], truth["C"])


def test_learner_with_a_free_observation_matrix_equals_dense_solve():
    """y = C x + B_0 u with C free: the observation stages enter the learning objective (they are
    left out when g does not depend on theta), and B_0 is weighted by both 1/sigma_w and 1/sigma_v;
    dense normal equations over (A, B, C), 10 % missing outputs."""
    rng = np.random.default_rng(2)
    _, truth = _linear_in_theta(rng, ny=2)
    params = cc.Parameters(cc.Param("A", truth["A"]), cc.Param("B", truth["B"]), cc.Param("C", truth["C"]))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.A @ x + p.B @ u,
                                             lambda x, u, p: p.C @ x + p.B[0] * u[0],
                                             nx=2, nu=1, params=params, process_std=[0.1, 0.2],
                                             measurement_std=[0.05, 0.5])
    us = [rng.standard_normal((30, 1))]
    data, xs = cc.simulate(model, truth, rng.standard_normal((1, 2)), [30], u=us,
                           process_std=model.noise.process_std, measurement_std=model.noise.measurement_std, seed=3)
    data = data.with_missing(0.1, seed=4)
    iw, iv = 1 / model.noise.process_std, 1 / model.noise.measurement_std
    prev = model.theta_vector({"A": truth["A"] + 0.2, "B": truth["B"] - 0.3, "C": truth["C"] + 0.4})
    x, y, u = xs[0], data.y[0], data.u[0]
    obs = np.isfinite(y)

    def residual(z):
        th = model.params.from_vector(z)
        r_dyn = iw * (x[1:] - x[:-1] @ th["A"].T - u[:-1] @ th["B"].T)
        r_obs = (iv * (np.where(obs, y, 0.0) - x @ th["C"].T - th["B"][0, 0] * u))[obs]
        return np.concatenate([r_dyn.ravel(), r_obs])

    r0 = residual(np.zeros(prev.size))
    J = np.column_stack([residual(e) - r0 for e in np.eye(prev.size)])
    want = np.linalg.solve(J.T @ J, -J.T @ r0)
    res = cc.learning.Learner(model, data.lengths, cc.LearnerOptions(hessian="gauss-newton")).solve(prev, data, xs)
    assert res.success, res.status
    np.testing.assert_allclose(res.theta_vec, want, atol=1e-7)
    assert np.abs(model.params.from_vector(want)["C"] - model.params.from_vector(prev)["C"]).max() > 0.1


def test_learner_refuses_bad_weights_and_takes_an_integer_start():
    rng = np.random.default_rng(1)
    model, truth = _linear_in_theta(rng)
    truth = {k: np.round(v) for k, v in truth.items()}  # integer-valued parameters
    us = [rng.standard_normal((20, 1)), rng.standard_normal((15, 1))]
    data, xs = cc.simulate(model, truth, rng.standard_normal((2, 2)), [20, 15], u=us,
                           process_std=model.noise.process_std, measurement_std=0.05, seed=2)
    learner = cc.learning.Learner(model, data.lengths)
    start = model.theta_vector(truth)
    for bad in ([1.0, -0.5], [1.0, np.nan], [1.0, 1.0, 1.0]):
        with pytest.raises(ValueError, match="weights: expected 2 finite non-negative values"):
            learner.solve(start, data, xs, weights=np.array(bad))
    # an integer start vector gives the same (non-integer) parameters as its float copy
    as_int = learner.solve(start.astype(int), data, xs).theta_vec
    np.testing.assert_array_equal(as_int, learner.solve(start, data, xs).theta_vec)
    assert np.abs(as_int - np.round(as_int)).max() > 1e-3
