"""The CE-EM smoothing step against independent computations."""
import time

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.objective import StageFunctions
from ceem_casadi.smoothing._smoother import TrajectorySmoother
from models import lorenz


def random_linear_model(rng, nx=3, nu=2, ny=2, *, x1_prior=True):
    A = rng.standard_normal((nx, nx))
    A *= 0.9 / max(abs(np.linalg.eigvals(A)))
    B, C, D = rng.standard_normal((nx, nu)), rng.standard_normal((ny, nx)), rng.standard_normal((ny, nu))
    params = cc.Parameters(cc.Param("A", A), cc.Param("B", B), cc.Param("C", C), cc.Param("D", D))
    sw, sv = rng.uniform(0.1, 0.5, nx), rng.uniform(0.05, 0.3, ny)
    kw = dict(x1_mean=rng.standard_normal(nx), x1_std=rng.uniform(0.5, 2, nx)) if x1_prior else {}
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.A @ x + p.B @ u, lambda x, u, p: p.C @ x + p.D @ u,
                                             nx=nx, nu=nu, params=params, process_std=sw, measurement_std=sv, **kw)
    return model, {"A": A, "B": B, "C": C, "D": D}


def dense_map_states(model, theta, y, u, x_prev=None, rho=0.0):
    """MAP states of a linear-Gaussian model by one dense weighted least-squares solve; with
    ``rho > 0`` the trust-region problem min -J + rho ||x - x_prev||^2 (rows sqrt(2 rho) (x - x_prev))."""
    A, B, C, D = (theta[k] for k in "ABCD")
    T, nx = y.shape[0], model.nx
    iw, iv = 1 / model.noise.process_std, 1 / model.noise.measurement_std
    rows, rhs = [], []
    for t in range(T):  # observation rows: iv * (C x_t) = iv * (y_t - D u_t), observed entries only
        obs = np.isfinite(y[t])
        R = np.zeros((obs.sum(), nx * T))
        R[:, t * nx:(t + 1) * nx] = (iv[:, None] * C)[obs]
        rows.append(R), rhs.append((iv * (y[t] - D @ u[t]))[obs])
    for t in range(T - 1):  # dynamics rows: iw * (x_{t+1} - A x_t) = iw * B u_t
        R = np.zeros((nx, nx * T))
        R[:, t * nx:(t + 1) * nx] = -iw[:, None] * A
        R[:, (t + 1) * nx:(t + 2) * nx] = np.diag(iw)
        rows.append(R), rhs.append(iw * (B @ u[t]))
    R = np.zeros((nx, nx * T))
    R[:, :nx] = np.diag(1 / model.noise.x1_std)
    rows.append(R), rhs.append(model.noise.x1_mean / model.noise.x1_std)
    if rho > 0:
        rows.append(np.sqrt(2 * rho) * np.eye(nx * T)), rhs.append(np.sqrt(2 * rho) * x_prev.ravel())
    sol, *_ = np.linalg.lstsq(np.vstack(rows), np.concatenate(rhs), rcond=None)
    return sol.reshape(T, nx)


@pytest.mark.parametrize("hessian", ["gauss-newton", "exact"])
def test_linear_gaussian_smoother_equals_dense_solve_and_rts(hessian):
    rng = np.random.default_rng(0)
    model, theta = random_linear_model(rng)
    T = 40
    u = rng.standard_normal((T, model.nu))
    data, _ = cc.simulate(model, theta, rng.standard_normal((1, model.nx)), T, u=[u],
                          process_std=model.noise.process_std, measurement_std=model.noise.measurement_std, seed=1)
    y = data.y[0].copy()
    y[rng.random(y.shape) < 0.1] = np.nan  # some missing entries
    data = cc.Trajectories([y], [u])
    sm = cc.smoothing.Smoother(model, cc.SmootherOptions(hessian=hessian))
    pv = model.theta_vector(theta)
    res = sm.solve(pv, data, [np.zeros((T, model.nx))])[0]
    assert res.success, res.status
    x_dense = dense_map_states(model, theta, y, u)
    np.testing.assert_allclose(res.x, x_dense, atol=1e-6)
    # the RTS smoother means (EKF on a linear model is the Kalman filter) agree too
    from ceem_casadi.filtering import EKF
    ks = EKF(model).run(pv, y, u, x0=model.noise.x1_mean, Sigma0=model.noise.x1_std ** 2,
                        Q=model.noise.process_std ** 2, R=model.noise.measurement_std ** 2, smooth=True)
    np.testing.assert_allclose(res.x, ks.x_smooth, atol=1e-6)


def test_trust_region_rho_x_equals_dense_trust_region_solve():
    """With rho_x > 0 the smoother solves min -J + rho_x ||x - x_prev||^2 (x_prev = the warm start):
    equal to the dense least-squares solution of that problem, and far from the rho_x = 0 one."""
    rng = np.random.default_rng(4)
    model, theta = random_linear_model(rng)
    T, rho = 25, 30.0
    u = rng.standard_normal((T, model.nu))
    data, _ = cc.simulate(model, theta, rng.standard_normal((1, model.nx)), T, u=[u],
                          process_std=model.noise.process_std, measurement_std=model.noise.measurement_std, seed=2)
    x_prev = 2.0 * rng.standard_normal((T, model.nx))
    pv = model.theta_vector(theta)
    want = dense_map_states(model, theta, data.y[0], u, x_prev, rho)
    far = np.abs(want - dense_map_states(model, theta, data.y[0], u)).max()
    assert far > 0.1  # the trust region matters at this rho
    # through the options (the EM loop's path) and through the per-call argument
    via_options = cc.smoothing.Smoother(model, cc.SmootherOptions(rho_x=rho)).solve(pv, data, [x_prev])[0]
    ts = cc.smoothing.Smoother(model).for_length(T)
    via_argument = ts.solve(model, pv, data.y[0], u, x_prev, rho_x=rho)
    for res in (via_options, via_argument):
        assert res.success, res.status
        np.testing.assert_allclose(res.x, want, atol=1e-6 * far)
    # rho_x=0 given explicitly overrides a positive option
    plain = cc.smoothing.Smoother(model, cc.SmootherOptions(rho_x=rho)).for_length(T).solve(model, pv, data.y[0], u, x_prev,
                                                                                  rho_x=0.0)
    np.testing.assert_allclose(plain.x, dense_map_states(model, theta, data.y[0], u), atol=1e-6)


def test_smoother_derivatives_equal_casadi_ad():
    """Gradient and (exact) Hessian assembled from stages equal CasADi AD of the whole cost."""
    model = lorenz.single_lorenz(process_std=0.1, measurement_std=0.5).with_noise(x1_mean=[0, 0, 20], x1_std=5)
    T, rng = 7, np.random.default_rng(3)
    ts = TrajectorySmoother(StageFunctions(model, "exact"), T, cc.SmootherOptions(hessian="exact"))
    y = rng.standard_normal((T, 2))
    y[2, 1] = np.nan
    x = 3 * rng.standard_normal((T, 3))
    P = ts.parameter_vector(model, model.theta_vector(lorenz.TRUE), y, np.zeros((T, 0)), x + 1, 0.3)
    xs, ps = ca.MX.sym("x", 3 * T), ca.MX.sym("p", P.size)
    c = ts.cost_function(xs, ps)
    H_ad, g_ad = ca.Function("h", [xs, ps], [ca.triu(ca.hessian(c, xs)[0]), ca.gradient(c, xs)])(x.ravel(), P)
    _, g = ts.solver.get_function("nlp_grad_f")(x.ravel(), P)
    H = ts.solver.get_function("nlp_hess_l")(x.ravel(), P, 1.0, [])
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ad), rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(np.asarray(ca.densify(H)), np.asarray(ca.densify(H_ad)), rtol=1e-10, atol=1e-9)


def test_smoother_sparsity_is_block_tridiagonal():
    model = lorenz.single_lorenz()
    T = 50
    ts = TrajectorySmoother(StageFunctions(model), T)
    sp = ts.solver.get_function("nlp_hess_l").sparsity_out(0)
    n = 3
    assert sp.nnz() == T * n * (n + 1) // 2 + (T - 1) * n * n  # upper triangle of the band
    rows, cols = np.array(sp.get_triplet())
    assert np.all(rows <= cols) and np.all(cols // n - rows // n <= 1)


def test_smoother_respects_state_bounds():
    """Both bounds active (x3 of this trajectory spans 22.9-31.0 unbounded): the solution
    stays inside and touches both, where the unbounded solution leaves the box."""
    model = lorenz.single_lorenz()
    data, xs = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(1, seed=0), 30, measurement_std=0.01, seed=1)
    pv = model.theta_vector(lorenz.TRUE)
    lo, hi = [-100, -100, 24], [100, 100, 30]
    free = cc.smoothing.Smoother(model).solve(pv, data, [xs[0]])[0]
    assert free.x[:, 2].min() < 24 - 0.5 and free.x[:, 2].max() > 30 + 0.5
    sm = cc.smoothing.Smoother(model, cc.SmootherOptions(x_lower=lo, x_upper=hi))
    res = sm.solve(pv, data, [np.clip(xs[0], lo, hi)])[0]
    assert res.success, res.status
    assert res.x[:, 2].min() >= 24 - 1e-8 and res.x[:, 2].max() <= 30 + 1e-8
    assert abs(res.x[:, 2].min() - 24) < 1e-6 and abs(res.x[:, 2].max() - 30) < 1e-6


def test_smoother_reports_cost_iterations_failure_and_build_time():
    """SmoothResult fields against independent values: the cost is the dense trust-region
    objective at the solution; a warm start at the optimum needs fewer iterations than a
    cold start; an iteration limit is a failure (success False) with finite states;
    build and solve times lie inside the interval measured around the calls."""
    rng = np.random.default_rng(5)
    model, theta = random_linear_model(rng)
    T, rho = 12, 3.0
    u = rng.standard_normal((T, model.nu))
    data, _ = cc.simulate(model, theta, rng.standard_normal((1, model.nx)), T, u=[u],
                          process_std=model.noise.process_std, measurement_std=model.noise.measurement_std, seed=3)
    x_prev = rng.standard_normal((T, model.nx))
    t0 = time.perf_counter()
    sm = cc.smoothing.Smoother(model, cc.SmootherOptions(rho_x=rho))
    ts = sm.for_length(T)
    sm.for_length(T + 1)
    outer = time.perf_counter() - t0
    assert 0 < ts.build_s and sm.build_s == ts.build_s + sm.for_length(T + 1).build_s <= outer
    t0 = time.perf_counter()
    res = sm.solve(model.theta_vector(theta), data, [x_prev])[0]
    assert 0 <= res.wall_s <= time.perf_counter() - t0
    x = res.x
    # cost = -J without constants + rho ||x - x_prev||^2, evaluated by hand
    A, B, C, D = (theta[k] for k in "ABCD")
    iw, iv = 1 / model.noise.process_std, 1 / model.noise.measurement_std
    want = (0.5 * np.sum((iv * (data.y[0] - x @ C.T - u @ D.T)) ** 2)
            + 0.5 * np.sum((iw * (x[1:] - x[:-1] @ A.T - u[:-1] @ B.T)) ** 2)
            + 0.5 * np.sum(((x[0] - model.noise.x1_mean) / model.noise.x1_std) ** 2) + rho * np.sum((x - x_prev) ** 2))
    assert abs(res.cost - want) < 1e-9 * want
    # Lorenz (nonlinear): warm start at the optimum vs a cold start
    lz = lorenz.single_lorenz()
    d2, xs = cc.simulate(lz, lorenz.TRUE, lorenz.initial_states(1, seed=0), 30, measurement_std=0.01, seed=1)
    pv = lz.theta_vector(lorenz.TRUE)
    lsm = cc.smoothing.Smoother(lz)
    cold = lsm.solve(pv, d2, [np.zeros_like(xs[0])])[0]  # measured: 6 iterations
    again = lsm.solve(pv, d2, [cold.x])[0]                # measured: 0-3 (round-off stagnation)
    assert cold.success and again.success and again.iterations < cold.iterations
    np.testing.assert_allclose(again.x, cold.x, atol=1e-6)
    capped = cc.smoothing.Smoother(lz, cc.SmootherOptions(max_iters=1)).solve(pv, d2, [xs[0] + 1.0])[0]
    assert capped.status == "Maximum_Iterations_Exceeded" and np.all(np.isfinite(capped.x)) and not capped.success


def test_smoother_reuses_given_stages_and_passes_the_compile_option():
    """A Smoother shares prebuilt StageFunctions (the learner and joint steps reuse the smoother's)
    and hands SmootherOptions.compile to the stages it builds itself."""
    model = lorenz.single_lorenz()
    stages = StageFunctions(model)
    assert cc.smoothing.Smoother(model, stages=stages).stages is stages
    for compile in (False, True):
        assert cc.smoothing.Smoother(model, cc.SmootherOptions(compile=compile)).stages.compile is compile
