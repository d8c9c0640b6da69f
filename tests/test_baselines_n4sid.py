"""N4SID against a known 4th-order MIMO LTI system: eigenvalues and Markov parameters (not A itself)."""
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.baselines._n4sid import n4sid

EIG = np.array([0.9, 0.7, -0.5, 0.3])
NX, NU, NY = 4, 2, 2


def _system(seed=0):
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((NX, NX))
    A = V @ np.diag(EIG) @ np.linalg.inv(V)
    B = rng.standard_normal((NX, NU))
    C = rng.standard_normal((NY, NX))
    D = 0.5 * rng.standard_normal((NY, NU))
    return A, B, C, D


def _simulate(sys, n_traj, T, noise=0.0, seed=1):
    A, B, C, D = sys
    rng = np.random.default_rng(seed)
    ys, us, x0s = [], [], []
    for _ in range(n_traj):
        u = rng.standard_normal((T, NU))
        x = rng.standard_normal(NX)
        x0s.append(x.copy())
        y = np.empty((T, NY))
        for t in range(T):
            y[t] = C @ x + D @ u[t] + noise * rng.standard_normal(NY)
            x = A @ x + B @ u[t] + noise * rng.standard_normal(NX)
        ys.append(y)
        us.append(u)
    return cc.Trajectories(ys, us), x0s


def _markov(A, B, C, D, K=20):
    """[D, CB, CAB, ..., C A^(K-1) B] stacked (K + 1, ny, nu): invariant under a change of basis."""
    out = [D]
    M = B
    for _ in range(K):
        out.append(C @ M)
        M = A @ M
    return np.stack(out)


def _errors(res, sys):
    eig = np.sort(np.linalg.eigvals(res.A).real)
    im = np.abs(np.linalg.eigvals(res.A).imag).max()
    e_eig = max(np.abs(eig - np.sort(EIG)).max(), im)
    true = _markov(*sys)
    e_mk = np.abs(_markov(res.A, res.B, res.C, res.D) - true).max() / np.abs(true).max()
    return e_eig, e_mk


@pytest.mark.parametrize("n_traj,T", [(1, 300), (5, 40)])
def test_noise_free_exact(n_traj, T):
    sys = _system()
    data, x0s = _simulate(sys, n_traj, T)
    res = n4sid(data)                                   # order from the singular values
    assert res.order == NX
    assert res.singular_values[NX] < 1e-10 * res.singular_values[0]
    e_eig, e_mk = _errors(res, sys)
    assert e_eig < 1e-6 and e_mk < 1e-6, (e_eig, e_mk)
    # one initial state per trajectory: free runs reproduce every trajectory
    assert len(res.x0) == n_traj
    for b in range(n_traj):
        assert np.abs(res.simulate(data.u[b], res.x0[b]) - data.y[b]).max() < 1e-8
    # the noise covariances of exact data vanish
    assert np.abs(res.Q).max() < 1e-12 and np.abs(res.R).max() < 1e-12


def test_trajectories_are_not_concatenated():
    """5 short trajectories: stacking per-trajectory Hankel columns is exact, concatenation is not."""
    sys = _system()
    data, _ = _simulate(sys, 5, 40)
    res = n4sid(data, 4, horizon=5)
    assert max(_errors(res, sys)) < 1e-6
    glued = cc.Trajectories([np.concatenate(data.y)], [np.concatenate(data.u)])
    res_glued = n4sid(glued, 4, horizon=5)
    assert max(_errors(res_glued, sys)) > 1e-3


@pytest.mark.parametrize("n_traj,T", [(1, 2000), (5, 400)])
def test_noisy_within_tolerance(n_traj, T):
    """Process and measurement noise of std 0.05 (SNR about 30 dB): eigenvalues within 0.03,
    Markov parameters within 5 % of their largest entry."""
    sys = _system()
    data, _ = _simulate(sys, n_traj, T, noise=0.05, seed=3)
    res = n4sid(data)
    assert res.order == NX
    e_eig, e_mk = _errors(res, sys)
    assert e_eig < 0.03 and e_mk < 0.05, (e_eig, e_mk)
    # R estimates the innovation covariance: at least the measurement noise, same order of magnitude
    assert np.all(np.diag(res.R) > 0.05 ** 2) and np.all(np.diag(res.R) < 100 * 0.05 ** 2)


def test_missing_outputs_and_list_input():
    sys = _system()
    data, _ = _simulate(sys, 3, 150)
    res = n4sid(data.with_missing(0.005, seed=0), 4)
    assert max(_errors(res, sys)) < 1e-6
    res_list = n4sid(list(zip(data.y, data.u)), 4)
    res_traj = n4sid(data, 4)
    np.testing.assert_allclose(_markov(res_list.A, res_list.B, res_list.C, res_list.D),
                               _markov(res_traj.A, res_traj.B, res_traj.C, res_traj.D), atol=1e-12)


def test_as_ceem_casadi_model():
    sys = _system()
    data, _ = _simulate(sys, 2, 60, noise=0.01)
    res = n4sid(data, 4)
    model, theta = res.to_model()
    assert model.params.names == ["A", "B", "C", "D"]
    assert (model.nx, model.nu, model.ny) == (4, 2, 2)
    np.testing.assert_allclose(model.noise.measurement_std, np.sqrt(np.diag(res.R)), rtol=1e-12)
    pv = model.theta_vector(theta)
    x, u = np.arange(4.0), np.array([0.5, -1.0])
    np.testing.assert_allclose(np.asarray(model.f(x, u, pv)).ravel(), res.A @ x + res.B @ u, atol=1e-12)
    np.testing.assert_allclose(np.asarray(model.g(x, u, pv)).ravel(), res.C @ x + res.D @ u, atol=1e-12)
    sim, _ = cc.simulate(model, theta, np.array(res.x0), 60, u=list(data.u))
    for b in range(2):
        np.testing.assert_allclose(sim.y[b], res.simulate(data.u[b], res.x0[b]), atol=1e-10)


def _output_spectrum(A, C, Q, R, omega):
    """Phi(w) = C (e^{iw} I - A)^{-1} Q (.)^H C^T + R (ny = 1): similarity-invariant."""
    n = A.shape[0]
    return np.array([(C @ np.linalg.inv(np.exp(1j * w) * np.eye(n) - A) @ Q
                      @ np.linalg.inv(np.exp(1j * w) * np.eye(n) - A).conj().T @ C.T + R).real[0, 0]
                     for w in omega])


def test_no_inputs_model():
    """Stochastic system without inputs (x' = A x + w, y = C x + v, sigma_w = 0.1, sigma_v = 0.01):
    the fitted innovation model (A, K, C, Re) has the true poles and the true output spectrum.
    Spectrum error (max |log ratio| over [0, pi]) for seeds 0-4 at this size: 0.09-0.23; the true
    spectrum spans a factor ~40 over the band."""
    rng = np.random.default_rng(0)
    A = np.array([[0.9, 0.3], [-0.3, 0.8]])
    C = np.array([[1.0, 0.5]])
    ys = []
    for _ in range(5):
        x = rng.standard_normal(2)
        y = np.empty((400, 1))
        for t in range(400):
            y[t] = C @ x + 0.01 * rng.standard_normal(1)
            x = A @ x + 0.1 * rng.standard_normal(2)
        ys.append(y)
    res = n4sid(cc.Trajectories(ys), 2)
    np.testing.assert_allclose(np.sort_complex(np.linalg.eigvals(res.A)),
                               np.sort_complex(np.linalg.eigvals(A)), atol=0.05)
    omega = np.linspace(0, np.pi, 64)
    true = _output_spectrum(A, C, 0.01 * np.eye(2), 1e-4 * np.eye(1), omega)
    assert true.max() > 20 * true.min()
    K, Re = res.kalman_gain()
    # innovation form: Phi = (I + C (zI - A)^{-1} K) Re (.)^H  =  spectrum of (A, C, K Re K^T, Re, S = K Re)
    est = np.array([((np.eye(1) + res.C @ np.linalg.inv(np.exp(1j * w) * np.eye(2) - res.A) @ K) @ Re
                     @ (np.eye(1) + res.C @ np.linalg.inv(np.exp(1j * w) * np.eye(2) - res.A) @ K).conj().T
                     ).real[0, 0] for w in omega])
    assert np.abs(np.log(est / true)).max() < 0.35
    model, theta = res.to_model()
    assert model.nu == 0
    # the free run of the fitted model is y_k = C A^k x0 (closed form, no recursion)
    sim = res.simulate(None, res.x0[0], steps=5)
    want = np.array([res.C @ np.linalg.matrix_power(res.A, k) @ res.x0[0] for k in range(5)])
    np.testing.assert_allclose(sim, want, rtol=1e-12, atol=1e-12)


def test_errors():
    sys = _system()
    data, _ = _simulate(sys, 1, 30)
    with pytest.raises(cc.ShapeError, match="too long"):
        n4sid(data, 4, horizon=20)
    with pytest.raises(cc.ShapeError, match="too short for order"):
        n4sid(data, 4, horizon=2)
    with pytest.raises(cc.ShapeError, match="positive integer"):
        n4sid(data, 0)
    res = n4sid(data, 4)
    with pytest.raises(cc.ShapeError, match="x0"):
        res.simulate(data.u[0], np.zeros(3))


def test_innovation_model_kalman_gain():
    """Data from an innovation model (A - K C stable): the Riccati gain from (Q, S, R) recovers the
    innovation covariance within 15 % and the noise Markov parameters C A^k K within 25 % of their size."""
    A, B, C, D = _system()
    K = 0.1 * np.random.default_rng(5).standard_normal((NX, NY))
    assert np.abs(np.linalg.eigvals(A - K @ C)).max() < 0.8
    rng = np.random.default_rng(11)
    ys, us = [], []
    for _ in range(5):
        u, x, y = rng.standard_normal((400, NU)), rng.standard_normal(NX), np.empty((400, NY))
        for t in range(400):
            e = 0.1 * rng.standard_normal(NY)
            y[t] = C @ x + D @ u[t] + e
            x = A @ x + B @ u[t] + K @ e
        ys.append(y)
        us.append(u)
    res = n4sid(cc.Trajectories(ys, us), 4)
    Kh, Re = res.kalman_gain()
    np.testing.assert_allclose(np.diag(Re), 0.01, rtol=0.15)
    true = _markov(A, K, C, np.eye(NY))[1:]
    assert np.abs(_markov(res.A, Kh, res.C, np.eye(NY))[1:] - true).max() < 0.25 * np.abs(true).max()


def test_no_feedthrough_and_fixed_parameters():
    A, B, C, _ = _system()
    sys = (A, B, C, np.zeros((NY, NU)))
    data, _ = _simulate(sys, 2, 80)
    res = n4sid(data, 4, feedthrough=False)
    assert np.all(res.D == 0) and max(_errors(res, sys)) < 1e-6
    model, theta = res.to_model(free={"D": False, "C": np.eye(NY, NX, dtype=bool)})
    assert model.params.free_mask.sum() == NX * NX + NX * NU + NY
    with pytest.raises(cc.ShapeError, match="unknown"):
        res.to_model(free={"E": False})
