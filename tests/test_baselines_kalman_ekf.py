"""EKF/EKS against the linear Kalman filter/RTS smoother, and both against dense Gaussian algebra."""
import casadi as ca
import numpy as np
import pytest
from scipy.stats import multivariate_normal

import ceem_casadi as cc
from ceem_casadi.filtering import EKF, kalman_filter
from tests.oracles import dense_moments


@pytest.mark.parametrize("missing", [False, True])
def test_ekf_equals_kalman_on_linear_model(missing, lg):
    sys, u, y = lg.system()
    if missing:
        y = lg.with_nans(y)
    model, pv = lg.model(sys)
    kf = kalman_filter(sys["A"], sys["C"], sys["Q"], sys["R"], y, u, B=sys["B"], D=sys["D"],
                       x0=sys["x0"], Sigma0=sys["Sigma0"], smooth=True)
    ek = EKF(model).run(pv, y, u, x0=sys["x0"], Sigma0=sys["Sigma0"], Q=sys["Q"], R=sys["R"], smooth=True)
    for name in ("y_pred", "S", "x_pred", "P_pred", "x_filt", "P_filt", "x_smooth", "P_smooth"):
        np.testing.assert_allclose(getattr(ek, name), getattr(kf, name), rtol=0, atol=1e-10, err_msg=name)
    assert abs(ek.loglik - kf.loglik) < 1e-10
    np.testing.assert_allclose(ek.A, np.broadcast_to(sys["A"], ek.A.shape), atol=1e-12)
    # the predicted observation is made before the correction: it does not depend on y[t]
    y2 = y.copy()
    y2[7] += 100.0
    ek2 = EKF(model).run(pv, y2, u, x0=sys["x0"], Sigma0=sys["Sigma0"], Q=sys["Q"], R=sys["R"])
    np.testing.assert_allclose(ek2.y_pred[:8], ek.y_pred[:8], atol=1e-12)
    assert np.all(np.abs(ek2.y_pred[8] - ek.y_pred[8]) > 1e-6) or missing


@pytest.mark.parametrize("missing", [False, True])
def test_kalman_loglik_and_rts_equal_dense_gaussian(missing, lg):
    sys, u, y = lg.system(seed=3)
    if missing:
        y = lg.with_nans(y, seed=4)
    kf = kalman_filter(sys["A"], sys["C"], sys["Q"], sys["R"], y, u, B=sys["B"], D=sys["D"],
                       x0=sys["x0"], Sigma0=sys["Sigma0"], smooth=True)
    my, Pyy, mx, Pxx = dense_moments(sys["A"], sys["C"], sys["Q"], sys["R"], lg.T, u, B=sys["B"], D=sys["D"],
                                      x0=sys["x0"], Sigma0=sys["Sigma0"])
    obs = np.isfinite(y.ravel())
    dense = multivariate_normal(my[obs], Pyy[np.ix_(obs, obs)]).logpdf(y.ravel()[obs])
    assert abs(kf.loglik - dense) < 1e-8 * max(1.0, abs(dense))
    # smoothed moments = Gaussian conditioning of the stacked states on the observed entries
    Cb = np.kron(np.eye(lg.T), sys["C"])[obs]
    Pxy = Pxx @ Cb.T
    gain = np.linalg.solve(Pyy[np.ix_(obs, obs)], Pxy.T).T
    post_mean = mx + gain @ (y.ravel()[obs] - my[obs])
    post_cov = Pxx - gain @ Pxy.T
    np.testing.assert_allclose(kf.x_smooth.ravel(), post_mean, atol=1e-9)
    blocks = np.array([post_cov[t * lg.NX:(t + 1) * lg.NX, t * lg.NX:(t + 1) * lg.NX] for t in range(lg.T)])
    np.testing.assert_allclose(kf.P_smooth, blocks, atol=1e-9)
    # the last filtered moments equal the last smoothed ones
    np.testing.assert_allclose(kf.x_filt[-1], kf.x_smooth[-1], atol=0)


def test_ekf_nonlinear_covariances_symmetric_positive_definite():
    """On a nonlinear model the EKF log-likelihood is finite and every covariance is exactly
    symmetric and positive definite (Joseph form, symmetrised)."""
    params = cc.Parameters(cc.Param("a", 0.9))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: ca.vertcat(p.a * ca.sin(x[0]) + 0.1 * x[1], x[0]),
                                             lambda x, u, p: x[0] ** 2 + x[1], nx=2, params=params)
    rng = np.random.default_rng(0)
    y = rng.standard_normal((40, 1))
    res = EKF(model).run(np.array([0.9]), y, None, x0=np.ones(2), Sigma0=1.0, Q=0.01, R=0.1, smooth=True)
    assert np.isfinite(res.loglik)
    for P in (res.P_filt, res.P_smooth, res.P_pred):
        np.testing.assert_allclose(P, np.swapaxes(P, 1, 2), atol=0)
        assert np.all(np.linalg.eigvalsh(P) > 0)


def test_kalman_shape_errors(lg):
    sys, u, y = lg.system()
    with pytest.raises(cc.ShapeError, match=r"y: expected shape \(T, 2\)"):
        kalman_filter(sys["A"], sys["C"], sys["Q"], sys["R"], y[:, :1], u, x0=sys["x0"], Sigma0=1.0)
    with pytest.raises(cc.ShapeError, match="Q: expected a scalar"):
        kalman_filter(sys["A"], sys["C"], np.eye(3), sys["R"], y, u, B=sys["B"], x0=sys["x0"], Sigma0=1.0)
    with pytest.raises(cc.ShapeError, match=r"B: expected shape \(4, 1\)"):
        kalman_filter(sys["A"], sys["C"], 1.0, 1.0, y, u, B=np.ones((4, 2)), x0=sys["x0"], Sigma0=1.0)


@pytest.mark.parametrize("missing", [False, True])
def test_ekf_casadi_engine_equals_python_engine(missing, lg):
    sys, u, y = lg.system(seed=7)
    if missing:
        y = lg.with_nans(y, seed=8)
    model, pv = lg.model(sys)
    ekf = EKF(model)
    kw = dict(x0=sys["x0"], Sigma0=sys["Sigma0"], Q=sys["Q"], R=sys["R"], smooth=True)
    a, b = ekf.run(pv, y, u, **kw), ekf.run(pv, y, u, engine="casadi", **kw)
    for name in ("y_pred", "S", "x_pred", "P_pred", "x_filt", "P_filt", "A", "x_smooth", "P_smooth"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=0, atol=1e-10, err_msg=name)
    assert abs(a.loglik - b.loglik) < 1e-10
    # nonlinear model (Lorenz, RK4): same numbers from both engines
    from models.lorenz import TRUE, initial_states, single_lorenz
    lz = single_lorenz(process_std=0.1, measurement_std=0.5)
    data, _ = cc.simulate(lz, TRUE, initial_states(1), 64, process_std=0.1, measurement_std=0.5, seed=0)
    yl = lg.with_nans(data.y[0], seed=9) if missing else data.y[0]
    kw = dict(x0=[-6.0, -6.0, 24.0], Sigma0=6.25, Q=0.01, R=0.25, smooth=True)
    el = EKF(lz)
    a, b = el.run(lz.theta_vector(TRUE), yl, **kw), el.run(lz.theta_vector(TRUE), yl, engine="casadi", **kw)
    for name in ("y_pred", "x_filt", "P_filt", "x_smooth", "P_smooth"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-9, atol=1e-9, err_msg=name)
    assert abs(a.loglik - b.loglik) < 1e-8 * abs(a.loglik)
    with pytest.raises(ValueError, match="engine must be"):
        el.run(lz.theta_vector(TRUE), yl, engine="numba", **kw)


@pytest.mark.parametrize("engine", ["python", "casadi"])
def test_ekf_covariance_shape_errors_name_the_argument(lg, engine):
    sys, u, y = lg.system()
    model, pv = lg.model(sys)
    good = dict(x0=sys["x0"], Sigma0=sys["Sigma0"], Q=sys["Q"], R=sys["R"])
    for name, bad in (("Q", np.eye(3)), ("R", np.eye(3)), ("Sigma0", np.ones(2))):
        with pytest.raises(cc.ShapeError, match=f"^{name}: expected a scalar"):
            EKF(model).run(pv, y, u, engine=engine, **{**good, name: bad})


def test_ekf_casadi_engine_with_two_inputs_equals_kalman():
    """Two inputs, input feedthrough, both engines against the linear Kalman filter/RTS smoother."""
    rng = np.random.default_rng(12)
    nx, nu, ny, T = 3, 2, 2, 25
    A = 0.8 * np.linalg.qr(rng.standard_normal((nx, nx)))[0]
    B, C, D = rng.standard_normal((nx, nu)), rng.standard_normal((ny, nx)), rng.standard_normal((ny, nu))
    params = cc.Parameters(cc.Param("A", A), cc.Param("B", B), cc.Param("C", C), cc.Param("D", D))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.A @ x + p.B @ u, lambda x, u, p: p.C @ x + p.D @ u,
                                             nx=nx, nu=nu, params=params)
    pv = model.theta_vector({"A": A, "B": B, "C": C, "D": D})
    u, y = rng.standard_normal((T, nu)), rng.standard_normal((T, ny))
    kw = dict(x0=np.zeros(nx), Sigma0=1.0, smooth=True)
    kf = kalman_filter(A, C, 0.1, 0.2, y, u, B=B, D=D, **kw)
    for engine in ("python", "casadi"):
        ek = EKF(model).run(pv, y, u, engine=engine, Q=0.1, R=0.2, **kw)
        np.testing.assert_allclose(ek.x_smooth, kf.x_smooth, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(ek.loglik, kf.loglik, rtol=1e-10)


def test_ekf_covariance_forms_function_form_and_single_step(lg):
    """Q, R, Sigma0 as scalars, (n,) diagonals or matrices give the same filter; the module-level
    ekf() equals EKF.run; a one-step trajectory has no dynamics Jacobian and equals the Kalman update."""
    from ceem_casadi.filtering import ekf
    sys, u, y = lg.system(seed=2)
    model, pv = lg.model(sys)
    q, r, s0 = 0.3, np.array([0.2, 0.5]), np.array([1.0, 2.0, 0.5, 1.5])
    ref = kalman_filter(sys["A"], sys["C"], q * np.eye(lg.NX), np.diag(r), y, u, B=sys["B"], D=sys["D"],
                        x0=sys["x0"], Sigma0=np.diag(s0))
    for engine in ("python", "casadi"):
        for Q, R, S in ((q, r, s0), (np.full(lg.NX, q), np.diag(r), np.diag(s0))):
            res = EKF(model).run(pv, y, u, x0=sys["x0"], Sigma0=S, Q=Q, R=R, engine=engine)
            np.testing.assert_allclose(res.x_filt, ref.x_filt, rtol=1e-10, atol=1e-10)
    fn = ekf(model, pv, y, u, x0=sys["x0"], Sigma0=s0, Q=q, R=r, smooth=True)
    np.testing.assert_allclose(fn.x_filt, ref.x_filt, rtol=1e-10, atol=1e-10)
    one = EKF(model).run(pv, y[:1], u[:1], x0=sys["x0"], Sigma0=s0, Q=q, R=r)
    assert one.A.shape == (0, lg.NX, lg.NX)
    np.testing.assert_allclose(one.x_filt[0], ref.x_filt[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("engine", ["python", "casadi"])
def test_ekf_smooths_only_on_request(lg, engine):
    """run() filters only (x_smooth, P_smooth None) unless smooth=True; the filtered moments are
    the same either way."""
    sys, u, y = lg.system(seed=5)
    model, pv = lg.model(sys)
    kw = dict(x0=sys["x0"], Sigma0=sys["Sigma0"], Q=sys["Q"], R=sys["R"], engine=engine)
    ekf = cc.filtering.EKF(model)
    filtered, smoothed = ekf.run(pv, y, u, **kw), ekf.run(pv, y, u, smooth=True, **kw)
    assert filtered.x_smooth is None and filtered.P_smooth is None
    assert smoothed.x_smooth is not None and np.abs(smoothed.x_smooth - smoothed.x_filt).max() > 1e-3
    np.testing.assert_array_equal(filtered.x_filt, smoothed.x_filt)


@pytest.mark.parametrize("compile", [False, True])
def test_ekf_run_many_equals_one_by_one(lg, monkeypatch, compile):
    """EKF.run_many: trajectories of a length filtered by one mapped call of up to CALL_COLUMNS
    // T of them (here 3 per call: 7 trajectories of 40 steps = calls of 3, 3 and a padded 1,
    plus 2 of another length and one longer than the chunk, one by one), missing outputs:
    every result equals `run(engine="casadi")` on its own to 1e-12 (means, covariances,
    log-likelihood, smoothed means). Compiled and virtual-machine steps alike."""
    from ceem_casadi.runtime import _policy as policy
    from models.lorenz import TRUE, initial_states, single_lorenz

    if compile and cc.runtime._compile.compiler() is None:
        pytest.skip("no C compiler")
    lz = single_lorenz(process_std=0.1, measurement_std=0.5)
    lengths = [40] * 7 + [25, 25, 70]
    ys = []
    for b, T in enumerate(lengths):
        d, _ = cc.simulate(lz, TRUE, initial_states(1, seed=b), T, process_std=0.1, measurement_std=0.5, seed=b)
        ys.append(lg.with_nans(d.y[0], seed=b))
    monkeypatch.setattr(policy, "CALL_COLUMNS", 3 * 40)
    ekf = EKF(lz, compile=compile)
    ekf.chunk = 64                                           # the 70-step trajectory: chunked, alone
    kw = dict(x0=[-6.0, -6.0, 24.0], Sigma0=6.25, Q=0.01, R=0.25)
    th = lz.theta_vector(TRUE)
    many = ekf.run_many(th, ys, None, smooth=True, **kw)
    assert any(key[0] == "many" and key[2] == 3 for key in ekf._accum)      # the mapped call was used
    for y, got in zip(ys, many):
        want = ekf.run(th, y, engine="casadi", smooth=True, **kw)
        for name in ("x_pred", "P_pred", "y_pred", "S", "x_filt", "P_filt", "A", "x_smooth"):
            np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-12, atol=1e-12, err_msg=name)
        assert got.loglik == pytest.approx(want.loglik, rel=1e-12)
