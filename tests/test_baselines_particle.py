"""Particle filter, FFBSi and particle EM (scripts.baselines) against Kalman oracles and the true Lorenz parameters;
the baselines that left ceem_casadi.baselines say where they went."""
import doctest
import importlib
import warnings

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.filtering import kalman_filter
from models.lorenz import TRUE, initial_states, perturbed, single_lorenz
from scripts.baselines._particle import ParticleFilter, ffbsi, particle_filter, systematic_resample
from scripts.baselines._saem import ParticleEMOptions, particle_em, saem_weights

LORENZ_X1 = dict(x1_mean=(-6.0, -6.0, 24.0), x1_std=(2.5, 2.5, 2.5))


def _kalman(sys, u, y):
    return kalman_filter(sys["A"], sys["C"], sys["Q"], sys["R"], y, u, B=sys["B"], D=sys["D"],
                         x0=sys["x0"], Sigma0=sys["Sigma0"], smooth=True)


def _pf_logliks(pf, pv, sys, u, y, runs):
    return np.array([pf.run(pv, y, u, x0_mean=sys["x0"], x0_cov=sys["Sigma0"], Q=sys["Q"], R=sys["R"],
                            rng=np.random.default_rng(seed)).loglik for seed in range(runs)])


@pytest.mark.parametrize("missing", [False, True])
def test_fully_adapted_loglik_within_3_mc_standard_errors_of_kalman(missing, lg):
    sys, u, y = lg.system(seed=5)
    if missing:
        y = lg.with_nans(y, seed=2)
    model, pv = lg.model(sys)
    pf = ParticleFilter(model, 1000)
    assert pf.proposal == "fully-adapted"
    ll = _pf_logliks(pf, pv, sys, u, y, runs=20)
    se = ll.std(ddof=1) / np.sqrt(ll.size)
    kf = _kalman(sys, u, y).loglik
    assert abs(ll.mean() - kf) < 3 * se, (ll.mean(), kf, se)
    assert se < 0.1  # the estimate is informative, not trivially within a huge error bar


def test_bootstrap_loglik_matches_kalman_after_lognormal_bias_correction(lg):
    """The bootstrap filter's likelihood estimate is unbiased, so its log is biased by about
    -var/2: the corrected mean lies within 3 Monte Carlo standard errors of the Kalman value."""
    sys, u, y = lg.system(seed=5)
    model, pv = lg.model(sys)
    pf = ParticleFilter(model, 1000, proposal="bootstrap")
    ll = _pf_logliks(pf, pv, sys, u, y, runs=20)
    se = ll.std(ddof=1) / np.sqrt(ll.size)
    kf = _kalman(sys, u, y).loglik
    assert abs(ll.mean() + 0.5 * ll.var(ddof=1) - kf) < 3 * se, (ll.mean(), ll.var(), kf, se)


def test_ffbsi_means_approach_rts_means_as_particles_grow(lg):
    sys, u, y = lg.system(seed=5)
    model, pv = lg.model(sys)
    kf = _kalman(sys, u, y)
    sd = np.sqrt(np.diagonal(kf.P_smooth, axis1=1, axis2=2))
    errs, spreads = {}, {}
    for n in (50, 1000):
        res = particle_filter(model, pv, y, u, n_particles=n, x0_mean=sys["x0"], x0_cov=sys["Sigma0"],
                              Q=sys["Q"], R=sys["R"], rng=np.random.default_rng(0))
        xs = ffbsi(res, 1000, rng=np.random.default_rng(1))
        assert xs.shape == (1000, y.shape[0], 4)
        errs[n] = np.sqrt(np.mean(((xs.mean(0) - kf.x_smooth) / sd) ** 2))  # in posterior std units
        spreads[n] = np.mean(xs.std(0) / sd)
    assert errs[1000] < 0.5 * errs[50], errs
    assert errs[1000] < 0.15, errs  # Ns = 1000 alone gives ~0.03
    assert abs(spreads[1000] - 1) < 0.05, spreads


def test_systematic_resampling_counts_are_floor_or_ceil():
    rng = np.random.default_rng(0)
    w = rng.random(37)
    w /= w.sum()
    for _ in range(20):
        counts = np.bincount(systematic_resample(w, rng), minlength=w.size)
        assert counts.sum() == w.size
        assert np.all((counts == np.floor(w.size * w)) | (counts == np.ceil(w.size * w)))


def test_nonlinear_observation_falls_back_to_bootstrap_with_warning():
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.9 * x, lambda x, u, p: x[0] ** 2,
                                             nx=1, process_std=0.1, measurement_std=0.3)
    with pytest.warns(UserWarning, match="bootstrap proposal"):
        pf = ParticleFilter(model, 50)
    assert pf.proposal == "bootstrap"
    y = np.abs(np.random.default_rng(0).standard_normal((20, 1)))
    res = pf.run(np.zeros(0), y, x0_mean=[1.0], x0_cov=0.1, rng=np.random.default_rng(0))
    assert np.isfinite(res.loglik) and res.particles.shape == (20, 50, 1)
    np.testing.assert_allclose(res.weights.sum(1), 1.0)
    # an affine observation with a u- and p-dependent offset is detected as linear: no warning
    params = cc.Parameters(cc.Param("c", 2.0))
    affine = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.9 * x, lambda x, u, p: p.c * x[0] + ca.sin(u[0]),
                                              nx=1, nu=1, params=params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ParticleFilter(affine, 10).proposal == "fully-adapted"


def test_affine_observation_offset_matches_kalman():
    """y = c x + sin(u) + v: the offset g(0, u, p) enters the fully adapted filter correctly."""
    params = cc.Parameters(cc.Param("c", 2.0))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.8 * x + u, lambda x, u, p: p.c * x[0] + ca.sin(u[0]),
                                             nx=1, nu=1, params=params, process_std=0.3, measurement_std=0.5)
    rng = np.random.default_rng(3)
    u = rng.standard_normal((25, 1))
    data, _ = cc.simulate(model, {"c": 2.0}, [[0.5]], 25, u=u[None], process_std=0.3, measurement_std=0.5, seed=3)
    y = data.y[0]
    kf = kalman_filter(0.8, 2.0, 0.09, 0.25, y - np.sin(u), u, B=[[1.0]], x0=[0.0], Sigma0=1.0)
    pf = ParticleFilter(model, 500)
    ll = np.array([pf.run(np.array([2.0]), y, u, x0_mean=[0.0], x0_cov=1.0, rng=np.random.default_rng(s)).loglik
                   for s in range(20)])
    assert abs(ll.mean() - kf.loglik) < 3 * ll.std(ddof=1) / np.sqrt(20) + 1e-3


def test_saem_weights_formula():
    g = [1.0, 1.0, 0.5, 0.25]
    # iteration weights gamma_i prod_{j>i} (1 - gamma_j): [0, 1*0.5*0.75, 0.5*0.75, 0.25]
    np.testing.assert_allclose(saem_weights(g, 4), np.array([0, 0.375, 0.375, 0.25]))
    np.testing.assert_allclose(saem_weights(g, 2), np.array([0.375, 0.25]) / 0.625)
    np.testing.assert_allclose(saem_weights([1.0], 3), [0, 0, 1])  # slots not yet filled: 0
    opts = ParticleEMOptions(saem_k0=2, saem_alpha=0.7)
    assert [opts.gamma(k) for k in (1, 2, 3, 4)] == [1.0, 1.0, 1.0, 2.0 ** -0.7]


def test_options_validate_and_prior_required():
    with pytest.raises(ValueError, match="n_particles must be >= 2"):
        ParticleEMOptions(n_particles=1)
    with pytest.raises(ValueError, match=r"saem_alpha must be in \(0.5, 1\]"):
        ParticleEMOptions(saem_alpha=0.5)
    with pytest.raises(ValueError, match=r"model.with_noise\(x1_mean="), pytest.warns(DeprecationWarning):
        ParticleEMOptions(x0_mean=(0.0, 0.0, 0.0))
    model = single_lorenz(process_std=0.1, measurement_std=0.5)
    data, _ = cc.simulate(model, TRUE, initial_states(1), 8, seed=0)
    with pytest.raises(ValueError, match="needs a prior on the first state"):
        particle_em(model, data, TRUE, options=ParticleEMOptions(max_iters=1))


def _lorenz_problem(seed, T=128, batch=4):
    model = single_lorenz(process_std=0.1, measurement_std=0.5)
    data, _ = cc.simulate(model, TRUE, initial_states(batch, 1, seed), T, process_std=0.1,
                          measurement_std=0.5, seed=seed)
    return model, data, perturbed(TRUE, 0.1, seed)


def _max_rel_err(theta):
    return max(abs(float(theta[k]) - v) / v for k, v in TRUE.items())


def test_particle_em_saem_averaging_and_callback_stop():
    model, data, theta0 = _lorenz_problem(seed=1, T=32, batch=1)
    seen = []
    opts = ParticleEMOptions(n_particles=50, n_smooth=4, max_iters=10, saem_k0=1, memory=3)
    model = model.with_noise(**LORENZ_X1)
    res = particle_em(model, data, theta0, options=opts, seed=0,
                      callback=lambda r: seen.append(r.gamma) or r.iteration == 4)
    assert res.status == "stopped" and len(res.history) == 4
    np.testing.assert_allclose(seen, [1.0, 1.0, 2.0 ** -0.7, 3.0 ** -0.7])
    assert all(np.isfinite([r.loglik, r.wall_s]).all() for r in res.history)
    assert res.theta == res.history[-1].theta
    # same seed, same result
    res2 = particle_em(model, data, theta0, options=opts, seed=0, callback=lambda r: r.iteration == 4)
    assert all(np.array_equal(res.theta[k], res2.theta[k]) for k in res.theta)


def test_particle_em_moves_lorenz_parameters_toward_truth():
    """Paper section 4.1.2 setting: sigma_w = 0.1, sigma_v = 0.5, 4 trajectories of T = 128,
    Np = 100, Ns = 10, initial guess within 10 %: 20 iterations at least halve the error.
    (memory=1: the first 20 iterations are Monte Carlo EM steps with gamma = 1 either way.)"""
    model, data, theta0 = _lorenz_problem(seed=0)
    opts = ParticleEMOptions(n_particles=100, n_smooth=10, max_iters=20, memory=1)
    res = particle_em(model.with_noise(**LORENZ_X1), data, theta0, options=opts, seed=0)
    assert res.status == "max_iters", res.message
    e0, e1 = _max_rel_err(theta0), _max_rel_err(res.theta)
    assert e0 > 0.05
    assert e1 <= 0.5 * e0, (e0, e1, res.theta)
    ll = [r.loglik for r in res.history]
    assert ll[-1] > ll[0] + 100  # the likelihood estimate rises by far more than its MC noise


MOVED = ("particle_filter", "ffbsi", "particle_em", "ParticleEMOptions", "ParticleEMRecord", "ParticleEMResult",
         "ParticleFilterResult", "LSTM", "sequence_loss_factory", "windows")


@pytest.mark.parametrize("name", MOVED)
def test_a_moved_baseline_says_where_it_went_and_why(name):
    """Reading the name on ceem_casadi.baselines, and importing it from there, raise an ImportError naming its
    new place and the measured reason. Fails without ``__getattr__`` in ceem_casadi/baselines/__init__.py."""
    import scripts.baselines
    why = "slower per epoch" if "article" in name or name in ("ffbsi", "particle_em") else "LSTM's test RMSE"
    with pytest.raises(ImportError, match=f"now scripts.baselines.{name} .*{why}"):
        getattr(cc.baselines, name)
    with pytest.raises(ImportError, match=f"now scripts.baselines.{name} .*{why}"):
        exec(f"from ceem_casadi.baselines import {name}", {})
    assert name in scripts.baselines.__all__ and getattr(scripts.baselines, name) is not None
    assert not hasattr(cc.baselines, "not_a_baseline") and cc.baselines.n4sid is cc.n4sid  # N4SID stays


@pytest.mark.parametrize("module", ["_particle", "_saem", "_lstm"])
def test_the_moved_baselines_examples_pass(module):
    """Their docstring examples (test_doctests.py runs the library's only)."""
    mod = importlib.import_module(f"scripts.baselines.{module}")
    out = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in doctest.DocTestFinder(exclude_empty=True).find(mod, mod.__name__) if t.examples]
    for test in tests:
        runner.run(test, out=out.append)
    assert tests and runner.failures == 0, "".join(out)
