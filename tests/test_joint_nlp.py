"""The joint (x, theta) IPOPT solve and acceleration="joint" (ceem_casadi/joint_nlp.py).

Oracles: plain CE-EM run to a tight tolerance (the fixed point), a dense CasADi SX objective of
all residuals built here from model.f / model.g (gradient, Gauss-Newton and exact Hessian), and
an arrowhead pattern derived here from the stage structure.
"""
import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.em._joint_nlp import JointSolver
from ceem_casadi.objective._stages import StageFunctions
from ceem_casadi.smoothing._initial_states import eks_states
from models import lorenz
from tests.oracles import weighted_residuals


@pytest.fixture(scope="module")
def problem():
    """Single Lorenz, two trajectories of unequal length, missing outputs, an x_1 prior and a
    Gaussian prior on beta."""
    base = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01, x1_prior=True)
    params = cc.Parameters(cc.Param("sigma", 9.0, lower=0.0), cc.Param("rho", 26.0, lower=0.0),
                           cc.Param("beta", 3.0, lower=0.0, prior_mean=2.7, prior_std=0.5))
    model = cc.StateSpaceModel.from_ode(lorenz.lorenz_rhs, lambda x, u, p: lorenz.C_SINGLE @ x, nx=3, dt=lorenz.DT,
                                        params=params, process_std=0.01, measurement_std=0.01,
                                        x1_mean=base.noise.x1_mean, x1_std=base.noise.x1_std)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=10), [40, 30], measurement_std=0.01,
                          seed=11)
    return model, data.with_missing(0.1, seed=3)


def dense_objective(model, data, use_prior=True):
    """-J - log p(theta) (up to constants) of all states and free parameters as one SX Function
    ``F(w) -> (f, grad, exact Hessian, residual Jacobian, residuals)``, w = [x rows of every
    trajectory; theta]."""
    nx = model.nx
    X = [ca.SX.sym(f"x{b}", nx, y.shape[0]) for b, y in enumerate(data.y)]
    p = ca.SX.sym("p", model.params.size)
    res = weighted_residuals(model, data, X, p)
    mean, w = model.params.prior
    if use_prior:
        res.append(w * (p - mean))
    r = ca.vertcat(*res)
    z = ca.vertcat(*[ca.vec(Xb) for Xb in X], p)
    f = 0.5 * ca.sumsqr(r)
    H, g = ca.hessian(f, z)
    return ca.Function("F", [z], [f, g, H, ca.jacobian(r, z), r]), z


def stacked(jr_xs, theta_vec):
    return np.concatenate([x.ravel() for x in jr_xs] + [theta_vec])


def test_joint_solve_reaches_the_plain_em_fixed_point(problem):
    model, data = problem
    theta0 = model.params.initial()
    plain = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=500, tol=1e-15))
    assert plain.status in ("converged", "stalled"), plain.message
    assert plain.iterations > 10  # plain EM needs many steps here; the joint solve needs one
    first = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=1))
    for hessian in ("gauss-newton", "exact", "auto"):
        solver = JointSolver(model, data, StageFunctions(model), hessian=hessian)
        jr = solver.solve(model.params.to_vector(first.theta), first.x)
        J = cc.objective.joint_log_density(cc.smoothing.Smoother(model), jr.theta_vec, data, jr.xs)
        assert abs(J - plain.J) < 1e-9 * abs(plain.J), hessian
        np.testing.assert_allclose(jr.theta_vec, model.params.to_vector(plain.theta), rtol=1e-6)
        for a, b in zip(jr.xs, plain.x):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_joint_optimum_satisfies_first_order_conditions(problem):
    """Gradient of the independent dense objective in x and theta vanishes at the joint optimum."""
    model, data = problem
    F, _ = dense_objective(model, data)
    first = cc.ceem(model, data, model.params.initial(), options=cc.CEEMOptions(max_iters=1))
    w_first = stacked(first.x, model.params.to_vector(first.theta))
    jr = JointSolver(model, data, StageFunctions(model)).solve(model.params.to_vector(first.theta), first.x)
    g0 = np.asarray(F(w_first)[1]).ravel()
    g = np.asarray(F(stacked(jr.xs, jr.theta_vec))[1]).ravel()
    n_x = sum(x.size for x in jr.xs)
    assert np.abs(g0).max() > 1.0  # the starting point is not stationary
    assert np.abs(g[:n_x]).max() < 1e-6 * np.abs(g0).max()
    assert np.abs(g[n_x:]).max() < 1e-6 * np.abs(g0).max()


def _derived_arrowhead(nx, lengths, nz):
    """Upper-triangle mask: states of the same trajectory at most one step apart, or a parameter."""
    traj = np.concatenate([np.full(nx * T, b) for b, T in enumerate(lengths)] + [np.full(nz, -1)])
    time = np.concatenate([np.repeat(np.arange(T), nx) for T in lengths] + [np.full(nz, -1)])
    is_p = traj < 0
    near = (traj[:, None] == traj[None, :]) & (np.abs(time[:, None] - time[None, :]) <= 1)
    mask = near | is_p[:, None] | is_p[None, :]
    return np.triu(mask)


@pytest.mark.parametrize("hessian", ["gauss-newton", "exact"])
def test_hessian_has_the_arrowhead_pattern_and_equals_the_dense_hessian(problem, hessian):
    model, data = problem
    solver = JointSolver(model, data, StageFunctions(model), hessian=hessian)
    nz = model.params.free_index.size
    sp = solver.solver.get_function("nlp_hess_l").sparsity_out(0)  # what IPOPT is given
    want = _derived_arrowhead(model.nx, data.lengths, nz)
    got = np.zeros(want.shape, bool)
    rows, cols = sp.get_triplet()
    got[rows, cols] = True
    np.testing.assert_array_equal(got, want)
    # values: the dense SX Hessian (exact) or J^T J (Gauss-Newton) at a non-stationary point
    F, _ = dense_objective(model, data)
    xs = eks_states(model, model.params.to_vector(model.params.initial()), data)
    w = stacked(xs, model.params.to_vector(model.params.initial()))
    _, g_ref, H_ref, Jr, _ = (np.asarray(a) for a in F(w))
    if hessian == "gauss-newton":
        H_ref = Jr.T @ Jr
    H_ref = np.triu(H_ref)
    assert np.all(H_ref[~want] == 0)  # the true Hessian lives inside the pattern
    cost, grad, vals = solver.evaluator.at(w, model.params.to_vector(model.params.initial()))
    H = np.asarray(ca.DM(sp, vals).full())
    np.testing.assert_allclose(H, H_ref, rtol=1e-8, atol=1e-6 * np.abs(H_ref).max())
    np.testing.assert_allclose(grad, g_ref.ravel(), rtol=1e-8, atol=1e-8 * np.abs(g_ref).max())


def test_parameter_bounds_are_respected(problem):
    """An upper bound below the unconstrained optimum: the joint solve ends on it, at the plain EM
    fixed point of the bounded problem."""
    model, data = problem
    params = cc.Parameters(cc.Param("sigma", 9.0, lower=0.0), cc.Param("rho", 26.0, lower=0.0, upper=27.0),
                           cc.Param("beta", 3.0, lower=0.0, prior_mean=2.7, prior_std=0.5))
    bounded = cc.StateSpaceModel.from_ode(lorenz.lorenz_rhs, lambda x, u, p: lorenz.C_SINGLE @ x, nx=3,
                                          dt=lorenz.DT, params=params, process_std=0.01, measurement_std=0.01,
                                          x1_mean=model.noise.x1_mean, x1_std=model.noise.x1_std)
    plain = cc.ceem(bounded, data, params.initial(), options=cc.CEEMOptions(max_iters=500, tol=1e-15))
    fast = cc.ceem(bounded, data, params.initial(), options=cc.CEEMOptions(max_iters=50, tol=1e-12,
                                                                            acceleration="joint"))
    assert float(fast.theta["rho"]) <= 27.0 and float(fast.theta["rho"]) > 27.0 - 1e-6
    assert abs(fast.J - plain.J) < 1e-8 * abs(plain.J)


def test_joint_acceleration_converges_in_few_iterations_to_the_same_point(problem):
    model, data = problem
    theta0 = model.params.initial()
    plain = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=500, tol=1e-12))
    fast = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=50, tol=1e-12, acceleration="joint"))
    assert fast.status == "converged", fast.message
    assert [r.kind for r in fast.history] == ["em", "joint", "em"]
    assert fast.iterations < plain.iterations / 3
    obj = [fast.init_J] + [r.objective for r in fast.history]
    assert np.all(np.diff(obj) >= -1e-9 * abs(obj[-1]))
    assert abs(fast.J - plain.J) < 1e-8 * abs(plain.J)


def test_joint_acceleration_honours_the_time_limit(problem, monkeypatch):
    """A joint solve that outlives the budget is stopped; the fit reports time_limit."""
    import time

    from ceem_casadi.em import _joint_nlp as jn

    model, data = problem
    slow_at = jn._Evaluator.at

    def slow(self, w, p):
        time.sleep(0.3)
        return slow_at(self, w, p)

    monkeypatch.setattr(jn._Evaluator, "at", slow)
    res = cc.ceem(model, data, model.params.initial(),
                  options=cc.CEEMOptions(max_iters=50, tol=1e-15, acceleration="joint", time_limit=2.0))
    assert res.status == "time_limit", res.message
    # IPOPT itself was stopped by the deadline (not only the loop after the solve); its iterate counts
    joint = [r for r in res.history if r.kind == "joint"]
    assert joint and "User_Requested_Stop" in joint[0].learn_status, [r.learn_status for r in res.history]


def test_auto_hessian_switches_to_exact_when_the_cost_stagnates(problem):
    """hessian="auto": Gauss-Newton values first; at a next iterate whose cost changed by less than
    AUTO_SWITCH (relative), the exact Hessian (both against the dense oracle)."""
    model, data = problem
    solver = JointSolver(model, data, StageFunctions(model), hessian="auto")
    F, _ = dense_objective(model, data)
    theta_vec = model.params.to_vector(model.params.initial())
    xs = eks_states(model, theta_vec, data)
    w = stacked(xs, theta_vec)
    sp = solver.sparsity
    _, _, H_exact, Jr, _ = (np.asarray(a) for a in F(w))
    first = np.asarray(ca.DM(sp, solver.evaluator.at(w, theta_vec)[2]).full())
    np.testing.assert_allclose(first, np.triu(Jr.T @ Jr), rtol=1e-8, atol=1e-6 * np.abs(H_exact).max())
    w2 = w.copy()
    w2[0] += 1e-9  # a new iterate with (nearly) the same cost
    second = np.asarray(ca.DM(sp, solver.evaluator.at(w2, theta_vec)[2]).full())
    _, _, H_exact2, _, _ = (np.asarray(a) for a in F(w2))
    np.testing.assert_allclose(second, np.triu(H_exact2), rtol=1e-8, atol=1e-6 * np.abs(H_exact2).max())
    assert np.abs(np.triu(H_exact) - np.triu(Jr.T @ Jr)).max() > 1e-3 * np.abs(H_exact).max()  # they differ
