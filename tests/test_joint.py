"""Joint Gauss-Newton steps on (x, theta) and the "newton" acceleration of CE-EM."""
import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.initialise import eks_states
from ceem_casadi.joint_gauss_newton import JointGaussNewton
from ceem_casadi.stages import StageFunctions
from models import lorenz


@pytest.fixture(scope="module")
def problem():
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01, theta0=lorenz.perturbed(lorenz.TRUE, 0.1, 3))
    model = model.with_noise(x1_mean=[-6.0, -6.0, 24.0], x1_std=2.5)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=4), [20, 15], measurement_std=0.01,
                          seed=5)
    data = data.with_missing(0.1, seed=6)
    return model, data


def dense_step(model, data, theta_vec, xs, mu):
    """The same Levenberg-Marquardt step from one dense CasADi Jacobian of all residuals."""
    nx = model.nx
    X = [ca.SX.sym(f"x{b}", nx, x.shape[0]) for b, x in enumerate(xs)]
    p = ca.SX.sym("p", model.params.size)
    iv, iw = 1 / model.noise.measurement_std, 1 / model.noise.process_std
    res = []
    for b, Xb in enumerate(X):
        y = data.y[b]
        for t in range(y.shape[0]):
            m = np.isfinite(y[t])
            res.append(m * iv * (np.where(m, y[t], 0) - model.g(Xb[:, t], [], p)))
            if t + 1 < y.shape[0]:
                res.append(iw * (Xb[:, t + 1] - model.f(Xb[:, t], [], p)))
        res.append((Xb[:, 0] - model.noise.x1_mean) / model.noise.x1_std)
    free = model.params.free_index
    z = ca.vertcat(*[ca.vec(Xb) for Xb in X], p[free.tolist()])
    r = ca.vertcat(*res)
    F = ca.Function("F", [z], [r, ca.jacobian(r, z)])
    z0 = np.concatenate([x.T.ravel(order="F") for x in xs] + [theta_vec[free]])
    r0, J = (np.asarray(a) for a in F(z0))
    H, g = J.T @ J, J.T @ r0.ravel()
    d = np.diag(H).copy()
    step = -np.linalg.solve(H + mu * np.diag(np.maximum(d, 1e-12 * max(1.0, d.max()))), g)
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
        # the Marquardt scaling of the Schur form uses diag(Hxx) and diag(Hpp): the same as the dense diag(H)
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-8)


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
