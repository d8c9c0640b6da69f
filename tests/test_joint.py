"""Joint Gauss-Newton steps on (x, theta) and the "newton" acceleration of CE-EM."""
import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.em._joint_gauss_newton import JointGaussNewton
from ceem_casadi.objective._stages import StageFunctions
from ceem_casadi.smoothing._initial_states import eks_states
from models import lorenz
from tests.oracles import weighted_residuals


@pytest.fixture(scope="module")
def problem():
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01, theta0=lorenz.perturbed(lorenz.TRUE, 0.1, 3))
    model = model.with_noise(x1_mean=[-6.0, -6.0, 24.0], x1_std=2.5)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=4), [20, 15], measurement_std=0.01,
                          seed=5)
    data = data.with_missing(0.1, seed=6)
    return model, data


def damped(H, n_states, mu):
    """The Levenberg-Marquardt matrix of `JointGaussNewton.step` from the dense H: the states' block damped
    by STATE_DAMPING mu diag(Hxx), the parameters' by mu diag(S), S = Hpp - Hxp^T (Hxx + damping)^-1 Hxp (the
    Schur complement: Marquardt's scaling of the reduced problem)."""
    from ceem_casadi.em._joint_gauss_newton import STATE_DAMPING

    K = H.copy()
    dx = np.diag(H)[:n_states]
    K[np.arange(n_states), np.arange(n_states)] += STATE_DAMPING * mu * np.maximum(dx, 1e-12 * max(1.0, dx.max()))
    Hxp = H[:n_states, n_states:]
    S = H[n_states:, n_states:] - Hxp.T @ np.linalg.solve(K[:n_states, :n_states], Hxp)
    dp = np.maximum(np.diag(S), 1e-12 * max(1.0, np.abs(np.diag(H)[n_states:]).max(initial=0.0)))
    idx = np.arange(n_states, H.shape[0])
    K[idx, idx] += mu * dp
    return K


def dense_step(model, data, theta_vec, xs, mu):
    """The same Levenberg-Marquardt step from one dense CasADi Jacobian of all residuals."""
    nx = model.nx
    X = [ca.SX.sym(f"x{b}", nx, x.shape[0]) for b, x in enumerate(xs)]
    p = ca.SX.sym("p", model.params.size)
    res = weighted_residuals(model, data, X, p)
    free = model.params.free_index
    z = ca.vertcat(*[ca.vec(Xb) for Xb in X], p[free.tolist()])
    r = ca.vertcat(*res)
    F = ca.Function("F", [z], [r, ca.jacobian(r, z)])
    z0 = np.concatenate([x.T.ravel(order="F") for x in xs] + [theta_vec[free]])
    r0, J = (np.asarray(a) for a in F(z0))
    H, g = J.T @ J, J.T @ r0.ravel()
    step = -np.linalg.solve(damped(H, z0.size - free.size, mu), g)
    return z0 + step


def test_joint_step_equals_dense_levenberg_marquardt_solve(problem):
    """Schur complement + banded Cholesky = one dense solve of the damped normal equations."""
    model, data = problem
    theta_vec = model.theta_vector(model.params.initial())
    xs = eks_states(model, theta_vec, data)
    jg = JointGaussNewton(model, data.lengths, StageFunctions(model))
    for mu in (1e-3, 0.5):
        st = jg.step(theta_vec, data, xs, mu=mu)
        got = np.concatenate([x.ravel() for x in st.xs] + [st.theta_vec])
        want = dense_step(model, data, theta_vec, xs, mu)
        # the reduced problem's Marquardt scaling, the states damped STATE_DAMPING times less (`damped`)
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("chunk", [20_000, 6])
@pytest.mark.parametrize("check", ["plain", "observed parameters"])
def test_joint_step_with_parameter_products_by_blas_equals_dense_solve(problem, monkeypatch, check, chunk):
    """With many parameters (six coupled Lorenz: 288) the joint step forms Jp'Jp, Jj'r and Jj'Jp from the residual
    Jacobians by BLAS over the stages, and in chunks of 6 stages Hxp dz too: the same dense solve."""
    from ceem_casadi.objective import _stages
    from ceem_casadi.runtime import _policy as policy

    monkeypatch.setattr(_stages, "GRAM_BY_BLAS", 0)
    monkeypatch.setattr(policy, "JOINT_CHUNK", chunk)
    if check == "plain":
        test_joint_step_equals_dense_levenberg_marquardt_solve(problem)
    else:
        test_joint_step_with_observed_parameters_priors_and_bounds_equals_dense_solve()


def test_newton_acceleration_reaches_the_plain_em_fixed_point_faster():
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(4, seed=10), 128, measurement_std=0.01,
                          seed=11)
    theta0 = lorenz.perturbed(lorenz.TRUE, 0.1, seed=1)
    plain = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=100, tol=1e-12))
    fast = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=100, tol=1e-12, acceleration="newton"))
    assert fast.status == "converged", fast.message
    assert fast.iterations < plain.iterations / 2
    assert "newton" in {r.kind for r in fast.history} and fast.history[0].kind == "em"
    obj = [fast.init_J] + [r.objective for r in fast.history if r.accepted]
    assert np.all(np.diff(obj) >= -1e-9 * abs(obj[-1]))  # never decreases
    assert fast.J >= plain.J - 1e-7 * abs(plain.J)
    for k, v in lorenz.TRUE.items():
        assert abs(float(fast.theta[k]) - float(plain.theta[k])) < 1e-4 * v
        assert abs(float(fast.theta[k]) - v) < 5e-3 * v


def _observed_parameter_model(c_upper=np.inf, c_lower=-np.inf, fixed=False):
    """x+ = A x, y = C x + c (nx = ny = 2, no input): the observation depends on theta; a Gaussian
    prior on A, bounds on c, an x_1 prior, a fixed entry of C."""
    A, C = np.array([[0.9, 0.2], [-0.1, 0.8]]), np.array([[1.0, 0.5], [0.0, 1.0]])
    free = not fixed
    params = cc.Parameters(cc.Param("A", A, prior_mean=A + 0.05, prior_std=0.1, free=free),
                           cc.Param("C", C, free=np.array([[True, True], [False, True]]) & free),
                           cc.Param("c", np.array([0.3, -0.2]), lower=np.array([-np.inf, c_lower]),
                                    upper=np.array([c_upper, np.inf]), free=free))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.A @ x, lambda x, u, p: p.C @ x + p.c, nx=2,
                                             params=params, process_std=[0.05, 0.1], measurement_std=[0.1, 0.2],
                                             x1_mean=[1.0, 0.0], x1_std=[0.5, 2.0])
    truth = {"A": A, "C": C, "c": np.array([0.3, -0.2])}
    return model, truth


def _dense_damped_system(model, data, theta_vec, xs, mu):
    """(z0, H, g, K = H + mu D, number of state entries) of the dense Levenberg-Marquardt system over
    (states, free parameters), from one CasADi Jacobian of every residual and prior row."""
    free = model.params.free_index
    mean, w = model.params.prior
    X = [ca.SX.sym(f"x{b}", 2, x.shape[0]) for b, x in enumerate(xs)]
    zp = ca.SX.sym("zp", free.size)
    p = ca.SX(ca.DM(theta_vec))  # fixed entries at their values, free entries symbolic
    for k, i in enumerate(free):
        p[int(i)] = zp[k]
    res = weighted_residuals(model, data, X, p)
    res.append(w[free] * (zp - mean[free]))
    z = ca.vertcat(*[ca.vec(Xb) for Xb in X], zp)
    F = ca.Function("F", [z], [ca.vertcat(*res), ca.jacobian(ca.vertcat(*res), z)])
    z0 = np.concatenate([x.T.ravel(order="F") for x in xs] + [theta_vec[free]])
    r0, J = (np.asarray(a) for a in F(z0))
    H, g = J.T @ J, J.T @ r0.ravel()
    return z0, H, g, damped(H, z0.size - free.size, mu), z0.size - free.size


def _observed_parameter_data(truth):
    """Three trajectories of 12, 9 and 2 steps (T = 2: one off-diagonal block), 10 % of outputs missing."""
    model = _observed_parameter_model()[0]
    data, _ = cc.simulate(model, truth, np.array([[1.0, 0.0], [0.5, -1.0], [0.0, 1.0]]), [12, 9, 2], seed=7,
                          process_std=model.noise.process_std, measurement_std=model.noise.measurement_std)
    return data.with_missing(0.1, seed=8)


def test_joint_step_with_observed_parameters_priors_and_bounds_equals_dense_solve():
    """The observation residuals depend on theta (their parameter Jacobian enters H_pp, g_p and
    H_xp), the Gaussian prior on A adds rows w (theta - mean), and both bounds on c are active:
    the step equals the dense damped solve for theta clipped to the bound and, for that clipped
    theta step, the states' dense solve  dx = -(H_xx + mu_x D_xx)^-1 (g_x + H_xp dtheta)."""
    model, truth = _observed_parameter_model(c_upper=0.21, c_lower=0.29)
    data = _observed_parameter_data(truth)
    # c = (0.3, -0.2) in the data
    theta_vec = model.theta_vector({"A": truth["A"] - 0.1, "C": truth["C"] + 0.1, "c": np.array([0.2, 0.3])})
    xs = eks_states(model, theta_vec, data)
    free, params = model.params.free_index, model.params
    mu = 2.0  # a step that crosses both bounds of c
    z0, H, g, K, nxs = _dense_damped_system(model, data, theta_vec, xs, mu)
    assert np.abs(H[:nxs, nxs:][:, -1]).max() > 0  # c couples to the states through the observations
    unclipped = -np.linalg.solve(K, g)
    jg = JointGaussNewton(model, data.lengths, StageFunctions(model))
    st = jg.step(theta_vec, data, xs, mu=mu)
    want_theta = theta_vec.copy()
    want_theta[free] = np.clip(theta_vec[free] + unclipped[nxs:], params.lower[free], params.upper[free])
    assert want_theta[-2] == 0.21 and theta_vec[-2] + unclipped[-2] > 0.215  # both bounds on c are active
    assert want_theta[-1] == 0.29 and theta_vec[-1] + unclipped[-1] < 0.25
    np.testing.assert_allclose(st.theta_vec, want_theta, rtol=1e-9, atol=1e-10)
    dtheta = want_theta[free] - theta_vec[free]
    dx = -np.linalg.solve(K[:nxs, :nxs], g[:nxs] + H[:nxs, nxs:] @ dtheta)
    np.testing.assert_allclose(np.concatenate([x.ravel() for x in st.xs]), z0[:nxs] + dx, rtol=1e-9, atol=1e-10)


def test_joint_step_without_free_parameters_is_a_damped_state_step():
    """Every parameter fixed: theta stays, the states take the dense damped Gauss-Newton step."""
    model, truth = _observed_parameter_model(fixed=True)
    data = _observed_parameter_data(truth)
    theta_vec = model.theta_vector(truth)
    xs = eks_states(model, theta_vec, data)
    z0, H, g, K, nxs = _dense_damped_system(model, data, theta_vec, xs, 0.01)
    assert nxs == z0.size
    st = JointGaussNewton(model, data.lengths, StageFunctions(model)).step(theta_vec, data, xs, mu=0.01)
    np.testing.assert_array_equal(st.theta_vec, theta_vec)
    np.testing.assert_allclose(np.concatenate([x.ravel() for x in st.xs]), z0 - np.linalg.solve(K, g),
                               rtol=1e-9, atol=1e-10)
