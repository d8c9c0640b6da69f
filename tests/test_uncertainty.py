"""Parameter uncertainty (Laplace at the CE-EM fixed point) against independent truths.

* the reduced Hessian equals the Schur complement of CasADi's dense Hessian of the whole
  objective (exact and Gauss-Newton);
* linear-Gaussian model: the profile identity (the reduced Hessian is the Hessian of
  -max_x J(x, theta), evaluated with the Kalman/RTS smoother) and the Kalman likelihood (the
  covariance equals the inverse Hessian of the exact Kalman log-likelihood to a few percent,
  exactly when theta enters only the state means);
* single Lorenz: standardised errors over seeds have unit mean square (the test fails if the
  intervals are 2x too narrow or 2x too wide); a parametric bootstrap gives the same spreads;
* six coupled Lorenz with H's diagonal blocks free: exactly the 18 analytic non-identifiable
  directions are reported, none when the blocks are fixed; ceem() warns about them.
"""
from __future__ import annotations

import re
from types import SimpleNamespace

import casadi as ca
import numpy as np
import pytest
from scipy.linalg import subspace_angles

import ceem_casadi as cc
from ceem_casadi.filtering import kalman_filter
from ceem_casadi.objective._identifiability import combination, entry_names
from ceem_casadi.workflow.assessment._uncertainty import reduced_hessian
from models import lorenz

FAST = cc.CEEMOptions(acceleration="newton", max_iters=30)


# --- dense oracle -------------------------------------------------------------------------
def _dense_schur(model, data, theta_vec, xs, exact=True):
    """Schur complement of the dense SX Hessian (or J^T J) of -J over all states and theta."""
    nx, noise = model.nx, model.noise
    X = [ca.SX.sym(f"X{b}", nx, y.shape[0]) for b, y in enumerate(data.y)]
    p = ca.SX.sym("p", model.params.size)
    res = []
    for b, y in enumerate(data.y):
        for t in range(y.shape[0]):
            res.append((y[t] - model.g(X[b][:, t], ca.DM(0, 1), p)) / noise.measurement_std)
            if t + 1 < y.shape[0]:
                res.append((X[b][:, t + 1] - model.f(X[b][:, t], ca.DM(0, 1), p)) / noise.process_std)
        res.append((X[b][:, 0] - noise.x1_mean) / noise.x1_std)
    mean, wp = model.params.prior
    res.append(wp * (p - mean))  # the parameters' Gaussian priors (0 where none)
    r = ca.vertcat(*res)
    w = ca.vertcat(*[ca.vec(x) for x in X], p)
    if exact:
        H = ca.hessian(0.5 * ca.sumsqr(r), w)[0]
    else:
        Jr = ca.jacobian(r, w)
        H = Jr.T @ Jr
    wv = np.concatenate([x.ravel() for x in xs] + [theta_vec])
    Hd = np.asarray(ca.Function("H", [w], [H])(wv))
    n = Hd.shape[0] - theta_vec.size
    return Hd[n:, n:] - Hd[n:, :n] @ np.linalg.solve(Hd[:n, :n], Hd[:n, n:])


@pytest.mark.parametrize("hessian", ["exact", "gauss-newton"])
def test_reduced_hessian_equals_dense_schur_complement(hessian):
    params = cc.Parameters(cc.Param("sigma", 10.0, lower=0.0), cc.Param("rho", 28.0, prior_mean=28.0, prior_std=0.01),
                           cc.Param("beta", 8 / 3))   # a prior as informative as the data on rho
    model = cc.StateSpaceModel.from_ode(lorenz.lorenz_rhs, lambda x, u, p: lorenz.C_SINGLE @ x, nx=3, dt=lorenz.DT,
                                        params=params, process_std=0.01, measurement_std=0.01,
                                        x1_mean=lorenz.X1_MEAN, x1_std=lorenz.X1_STD)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=1), 20, process_std=0.01,
                          measurement_std=0.01, seed=3)
    fit = cc.ceem(model, data, lorenz.perturbed(lorenz.TRUE, 0.1, seed=1), options=FAST)
    pv = model.theta_vector(fit.theta)
    S = reduced_hessian(model, data, pv, fit.x, cc.UncertaintyOptions(hessian=hessian))
    D = _dense_schur(model, data, pv, fit.x, exact=hessian == "exact")
    np.testing.assert_allclose(S, D, rtol=1e-9, atol=1e-9 * np.abs(D).max())


# --- linear-Gaussian model: Kalman likelihood -----------------------------------------------
SW, SV = 0.05, 0.05
A_TRUE = np.array([[0.9, 0.2], [-0.2, 0.8]])
B_TRUE = np.array([0.5, 1.0])


def _linear(free_A=True):
    params = cc.Parameters(cc.Param("A", A_TRUE, free=free_A), cc.Param("B", B_TRUE))
    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.A @ x + p.B * u, lambda x, u, p: x, nx=2, nu=1,
                                            params=params, process_std=SW, measurement_std=SV,
                                            x1_mean=np.zeros(2), x1_std=np.ones(2), name="lin2")


def _linear_data(model, T=60, B=2, seed=0):
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((B, T, 1))
    return cc.simulate(model, {"A": A_TRUE, "B": B_TRUE}, rng.standard_normal((B, 2)), T, u=u,
                       process_std=SW, measurement_std=SV, seed=seed)[0]


def _kalman_nll(model, data, vec):
    th = model.params.from_vector(vec)
    return -sum(kalman_filter(th["A"], np.eye(2), SW ** 2, SV ** 2, y, data.u[b], B=th["B"][:, None],
                              x0=np.zeros(2), Sigma0=np.eye(2)).loglik for b, y in enumerate(data.y))


def _profile_cost(model, data, vec):
    """-max_x J(x, theta) (no constants): the RTS smoothed means are the MAP states here."""
    th = model.params.from_vector(vec)
    A, Bv, total = th["A"], th["B"], 0.0
    for b, y in enumerate(data.y):
        u = data.u[b][:, 0]
        k = kalman_filter(A, np.eye(2), SW ** 2, SV ** 2, y, data.u[b], B=Bv[:, None], x0=np.zeros(2),
                          Sigma0=np.eye(2), smooth=True)
        x = k.x_smooth
        total += 0.5 * np.sum((y - x) ** 2) / SV ** 2 + 0.5 * np.sum(x[0] ** 2)
        total += 0.5 * np.sum((x[1:] - x[:-1] @ A.T - u[:-1, None] * Bv) ** 2) / SW ** 2
    return total


def _num_hessian(f, z, idx, h):
    """Central second differences of f in the entries ``idx`` of z (steps h per entry)."""
    n = len(idx)
    H = np.zeros((n, n))
    def at(a, b, sa, sb):
        v = z.copy()
        v[idx[a]] += sa * h[a]
        v[idx[b]] += sb * h[b]
        return f(v)

    for a in range(n):
        for b in range(a, n):
            H[a, b] = H[b, a] = (at(a, b, 1, 1) - at(a, b, 1, -1) - at(a, b, -1, 1) + at(a, b, -1, -1)) / (4 * h[a] * h[b])
    return H


def test_linear_gaussian_profile_identity_and_kalman_likelihood():
    """The reduced Hessian is the Hessian of the profile -max_x J (exactly, at any theta). The
    Kalman log-likelihood is log p(y | theta) = max_x J(x, theta) - 0.5 log det H_xx(theta) + c
    (Laplace is exact for a linear-Gaussian model), so its Hessian differs from ours by the
    curvature of log det H_xx(theta): zero when theta enters only the means (B), small relative
    to the data term when the states are large compared with the noise (A here, ~1 %)."""
    model = _linear()
    data = _linear_data(model)
    fit = cc.ceem(model, data, model.params.initial(), options=FAST)
    assert fit.status == "converged"
    unc = cc.parameter_uncertainty(model, data, fit)
    pv = model.theta_vector(fit.theta)
    free = model.params.free_index
    h = 1e-2 * unc.std_error
    H_profile = _num_hessian(lambda v: _profile_cost(model, data, v), pv, free, h)
    np.testing.assert_allclose(unc.information, H_profile, rtol=1e-4, atol=1e-4 * np.abs(H_profile).max())
    # the covariance equals the inverse Hessian of the exact Kalman likelihood to a few percent
    cov_kf = np.linalg.inv(_num_hessian(lambda v: _kalman_nll(model, data, v), pv, free, h))
    se_kf = np.sqrt(np.diag(cov_kf))
    assert np.max(np.abs(unc.std_error / se_kf - 1)) < 0.01  # measured 2e-4
    assert np.linalg.norm(unc.covariance - cov_kf) < 0.01 * np.linalg.norm(cov_kf)
    # ... and exactly when theta enters the state means only (A fixed, B free): at the smoothed
    # states of a theta dict (the smoothing step's optimum)
    model_b = _linear(free_A=False)
    unc_b = cc.parameter_uncertainty(model_b, data, fit.theta)
    free_b = model_b.params.free_index
    H_kf = _num_hessian(lambda v: _kalman_nll(model_b, data, v), pv, free_b, 1e-2 * unc_b.std_error)
    np.testing.assert_allclose(unc_b.information, H_kf, rtol=1e-5)
    assert unc_b.names == ["B[0]", "B[1]"]


# --- single Lorenz: calibration over seeds, bootstrap --------------------------------------------
def _lorenz_fit(model, seed, smoother, learner, B=2, T=64):
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(B, seed=1000 + seed), T, process_std=0.01,
                          measurement_std=0.01, seed=seed)
    fit = cc.ceem(model, data, lorenz.perturbed(lorenz.TRUE, 0.05, seed=seed), options=FAST,
                  smoother=smoother, learner=learner)
    return data, fit


def _solvers(model, B=2, T=64):
    sm = cc.smoothing.Smoother(model, FAST.smoother)
    return sm, cc.learning.Learner(model, [T] * B, FAST.learner, sm.stages)


def test_lorenz_intervals_are_calibrated():
    """Standardised errors z = (theta_hat - theta_true) / se over 16 seeds x 3 parameters:
    mean(z^2) is 1 for correct standard errors, 4 for 2x too narrow, 0.25 for 2x too wide. The
    band [0.5, 2] excludes both (checked below on the same z), a chi^2_48 / 48 lies in it with
    probability > 0.999."""
    model = lorenz.single_lorenz(x1_prior=True)
    sm, le = _solvers(model)
    truth = model.theta_vector(lorenz.TRUE)
    z = []
    for seed in range(16):
        data, fit = _lorenz_fit(model, seed, sm, le)
        assert fit.status == "converged"
        u = cc.parameter_uncertainty(model, data, fit)
        z.append((u.estimate - truth) / u.std_error)
    z = np.array(z)
    ms = float(np.mean(z ** 2))
    print("mean z^2", ms, "coverage", np.mean(np.abs(z) < 1.96, axis=0))
    assert 0.5 < ms < 2.0, ms
    assert not 0.5 < np.mean((2 * z) ** 2) < 2.0 and not 0.5 < np.mean((z / 2) ** 2) < 2.0
    cover = np.mean(np.abs(z) < 1.96, axis=0)
    assert np.all(cover >= 12 / 16), cover


def test_parametric_bootstrap_agrees():
    """Re-simulate from the fit (its theta and initial states, same noise), refit: the spread of
    the refits matches the standard errors (30 refits: the ratio of standard deviations has a
    relative sampling error ~13 %; bound 1.45)."""
    model = lorenz.single_lorenz(x1_prior=True)
    sm, le = _solvers(model, B=1, T=64)
    data, fit = _lorenz_fit(model, 0, sm, le, B=1)
    u = cc.parameter_uncertainty(model, data, fit)
    x0 = np.array([x[0] for x in fit.x])
    refits = []
    for k in range(30):
        boot, _ = cc.simulate(model, fit.theta, x0, 64, process_std=0.01, measurement_std=0.01, seed=100 + k)
        r = cc.ceem(model, boot, fit.theta, options=FAST, smoother=sm, learner=le)
        refits.append(model.theta_vector(r.theta))
    sd = np.std(refits, axis=0, ddof=1)
    ratio = sd / u.std_error
    print("bootstrap sd / se", ratio)
    assert np.all((ratio > 1 / 1.45) & (ratio < 1.45)), ratio


# --- identifiability ----------------------------------------------------------------------------
def _coupled(K, truth, C, free_diag):
    mask = np.ones((3 * K, 3 * K), bool) if free_diag else lorenz.coupling_mask(K)
    params = cc.Parameters(cc.Param("sigma", truth["sigma"], lower=0.0), cc.Param("rho", truth["rho"], lower=0.0),
                           cc.Param("beta", truth["beta"], lower=0.0), cc.Param("H", truth["H"], free=mask))
    return cc.StateSpaceModel.from_ode(lorenz.coupled_rhs(K), lambda x, u, p: C @ x, nx=3 * K, dt=lorenz.DT,
                                       params=params, process_std=0.01, measurement_std=0.01, name=f"c{K}")


def _analytic_null(model, K):
    """rho_k and H[3k+1, 3k] multiply x_{3k}; sigma_k, H[3k,3k] (on x_{3k}: H - sigma) and
    H[3k,3k+1] (on x_{3k+1}: sigma + H) ; beta_k and H[3k+2,3k+2] multiply x_{3k+2}."""
    names = entry_names(model.params, model.params.free_index)
    col = {n: i for i, n in enumerate(names)}
    vecs = []
    for k in range(K):
        a = 3 * k
        for combo in ({f"sigma[{k}]": 1, f"H[{a},{a}]": 1, f"H[{a},{a + 1}]": -1},
                      {f"rho[{k}]": 1, f"H[{a + 1},{a}]": -1}, {f"beta[{k}]": 1, f"H[{a + 2},{a + 2}]": 1}):
            v = np.zeros(len(names))
            for n, c in combo.items():
                v[col[n]] = c
            vecs.append(v / np.linalg.norm(v))
    return np.array(vecs).T


def test_six_coupled_lorenz_reports_exactly_the_diagonal_block_directions():
    K = 6
    truth, C = lorenz.coupled_truth(K, seed=0, h_scale=0.1)
    opts = cc.UncertaintyOptions(hessian="gauss-newton", compile=False)
    for free_diag in (True, False):
        model = _coupled(K, truth, C, free_diag)
        data, xs = cc.simulate(model, truth, lorenz.initial_states(1, K, seed=2), 64, process_std=0.01,
                               measurement_std=0.01, seed=1)
        u = cc.parameter_uncertainty(model, data, SimpleNamespace(theta=truth, x=xs), options=opts)
        if free_diag:
            assert len(u.directions) == 3 * K
            N = np.array([d.vector for d in u.directions]).T
            assert np.max(subspace_angles(N, _analytic_null(model, K))) < 1e-6
            # one subsystem's combination per direction, e.g. "0.71 rho[2] - 0.71 H[7,6]"
            assert all(len(d.combination.split(" ")) in (5, 8) for d in u.directions)
            assert np.all(np.isinf(u.std_error[~u.identifiable])) and u.warnings
        else:
            assert u.directions == [] and np.all(np.isfinite(u.std_error)) and not u.warnings


def test_ceem_warns_about_a_singular_learning_hessian(caplog):
    """Single Lorenz plus a free 3x3 H: the learning step's Hessian is singular in the three
    directions of the one diagonal block; the fit says so in its result and its log."""
    K, C = 1, lorenz.C_SINGLE
    truth = {"sigma": np.full(1, 10.0), "rho": np.full(1, 28.0), "beta": np.full(1, 8 / 3), "H": np.zeros((3, 3))}
    params = cc.Parameters(cc.Param("sigma", truth["sigma"]), cc.Param("rho", truth["rho"]),
                           cc.Param("beta", truth["beta"]), cc.Param("H", truth["H"]))
    model = cc.StateSpaceModel.from_ode(lorenz.coupled_rhs(K), lambda x, u, p: C @ x, nx=3, dt=lorenz.DT,
                                        params=params, process_std=0.01, measurement_std=0.01)
    data, _ = cc.simulate(model, truth, lorenz.initial_states(2, seed=0), 48, process_std=0.01,
                          measurement_std=0.01, seed=0)
    with caplog.at_level("WARNING", logger="ceem_casadi.em._ceem"):
        fit = cc.ceem(model, data, truth, options=cc.CEEMOptions(max_iters=2))
    assert len(fit.warnings) == 1 and "3 direction(s)" in fit.warnings[0]
    chunks = fit.warnings[0].split("determine ")[1].split(";")[:3]
    named = {frozenset(re.findall(r"[a-zA-Z]+\[[\d,]+\]", c)) for c in chunks}
    assert named == {frozenset({"sigma[0]", "H[0,0]", "H[0,1]"}), frozenset({"rho[0]", "H[1,0]"}),
                     frozenset({"beta[0]", "H[2,2]"})}
    assert any("learning step's Hessian" in r.message for r in caplog.records)
    plain = lorenz.single_lorenz()
    data1, _ = cc.simulate(plain, lorenz.TRUE, lorenz.initial_states(1, seed=0), 48, measurement_std=0.01, seed=0)
    assert cc.ceem(plain, data1, lorenz.TRUE, options=cc.CEEMOptions(max_iters=2)).warnings == []


def test_bounds_names_and_options():
    model = lorenz.single_lorenz()
    data, xs = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(1, seed=0), 40, process_std=0.01,
                           measurement_std=0.01, seed=0)
    at_bound = {"sigma": 0.0, "rho": 28.0, "beta": 8 / 3}
    u = cc.parameter_uncertainty(model, data, SimpleNamespace(theta=at_bound, x=xs),
                                 options=cc.UncertaintyOptions(hessian="gauss-newton"))
    assert u.at_bound == ["sigma"] and np.isnan(u.std_error[0]) and np.all(np.isfinite(u.std_error[1:]))
    assert "at a bound" in u.warnings[0]
    u = cc.parameter_uncertainty(model, data, SimpleNamespace(theta=lorenz.TRUE, x=xs, status="max_iters"))
    assert len(u.warnings) == 1 and "not 'converged'" in u.warnings[0]
    assert combination(np.array([0.6, -0.8]), ["a", "b"]) == "0.80 b - 0.60 a"
    with pytest.raises(ValueError, match="level must be in"):
        cc.UncertaintyOptions(level=95)
    with pytest.raises(ValueError, match="hessian must be one of"):
        cc.UncertaintyOptions(hessian="bfgs")


def test_coverage_script_smoke(tmp_path):
    from scripts import lorenz_coverage

    result = lorenz_coverage.main(["--smoke", "--out", str(tmp_path)])
    assert result["summary"]["exact"]["n"] == 3 and (tmp_path / "coverage.json").exists()
    assert lorenz_coverage.wilson(190, 200)[0] < 0.95 < lorenz_coverage.wilson(190, 200)[1]


def test_learning_hessian_exact_equals_gauss_newton_at_zero_residuals():
    """With noise-free data and the true states every residual is zero, so the exact learning
    Hessian equals J^T J: the two Learner.hessian_matrix paths (SX Hessian, BLAS callback) agree."""
    model = lorenz.single_lorenz()
    data, xs = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=0), 30, seed=0)
    pv = model.theta_vector(lorenz.TRUE)
    H = [cc.learning.Learner(model, data.lengths, cc.LearnerOptions(hessian=k)).hessian_matrix(pv, data, xs)
         for k in ("exact", "gauss-newton")]
    np.testing.assert_allclose(H[0], H[1], rtol=1e-9)
    assert np.all(np.linalg.eigvalsh(H[1]) > 0)
    assert cc.learning.Learner(model, data.lengths, cc.LearnerOptions(hessian="limited-memory")).hessian_matrix(
        pv, data, xs) is None
