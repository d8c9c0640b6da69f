"""Block-oriented models (ceem_casadi/model/_block_oriented.py) and their BLA initialisation (ceem_casadi/workflow/initialisation/_bla.py):
simulations against a numpy loop of the blocks' (A, B, C, D), the chosen pole split against the true blocks'
poles, output-error refinement against the truth (poles, Markov parameters, f on a grid: invariants of the
realisation), and the fixed gain ambiguity (a full-rank output-error Jacobian at the truth)."""
import logging

import numpy as np
import pytest
import scipy.signal as ss

import ceem_casadi as cc
from ceem_casadi.model._block_oriented import (
    block_markov,
    block_poles,
    block_system,
    hammerstein,
    nonlinearity,
    wiener,
    wiener_hammerstein,
)
from ceem_casadi.workflow.initialisation._bla import _block_theta, _den_from_poles, bla_initialise
from scripts.block_oriented_demo import simulate  # the demo's record generator, one copy

T = 1000
NOISE = 0.01          # output noise: this fraction of the noise-free output's standard deviation

# Wiener-Hammerstein truth: G1 a complex pair (relative degree 1), G2 two real poles (feedthrough)
WH_TRUE = {"g1_den": _den_from_poles(np.array([0.8 * np.exp(0.5j), 0.8 * np.exp(-0.5j)]), 2),
           "g1_num": np.array([1.0, -0.5]),
           "g2_den": _den_from_poles(np.array([0.6, -0.3]), 2), "g2_num": np.array([0.4, 0.3]),
           "f_coef": np.array([0.1, 1.0, 0.3, -0.1])}
WH_SCALE = 1.5        # std of the intermediate signal v: f acts on v / 1.5
# the blocks' pole types swapped (the split search must not depend on the order of the BLA's poles)
WH_SWAPPED = {"g1_den": _den_from_poles(np.array([0.6, -0.3]), 2), "g1_num": np.array([1.0, -0.5]),
              "g2_den": _den_from_poles(np.array([0.8 * np.exp(0.5j), 0.8 * np.exp(-0.5j)]), 2),
              "g2_num": np.array([0.4, 0.3]), "f_coef": np.array([0.1, 1.0, 0.3, -0.1])}
# one-block truth: a complex pair and a real pole
G_TRUE = {"g_den": _den_from_poles(np.array([0.85 * np.exp(0.6j), 0.85 * np.exp(-0.6j), 0.5]), 3),
          "g_num": np.array([1.0, -0.3, 0.2]), "f_coef": np.array([0.0, 1.0, 0.2, -0.15])}



def _rms(a, b):
    return float(np.sqrt(np.mean((np.asarray(a) - np.asarray(b)) ** 2)))


def _hausdorff(a, b):
    """Largest distance from a pole of one set to the nearest pole of the other."""
    a, b = np.asarray(a), np.asarray(b)
    d = np.abs(a[:, None] - b[None, :])
    return max(d.min(axis=1).max(), d.min(axis=0).max())


def _data(model, theta, seed=1):
    u = np.random.default_rng(0).standard_normal(T)
    sd = float(np.std(simulate(model, theta, u).y[0]))
    return simulate(model, theta, u, noise_std=NOISE * sd, seed=seed), NOISE * sd


def _numpy_wh(theta, u, scale, f1=False, f2=True):
    A1, B1, C1, D1 = block_system(theta["g1_den"], theta["g1_num"], float(f1))
    A2, B2, C2, D2 = block_system(theta["g2_den"], theta["g2_num"], float(f2))
    x1, x2, y = np.zeros(A1.shape[0]), np.zeros(A2.shape[0]), []
    for ut in u:
        w = nonlinearity(theta, C1 @ x1 + D1 * ut, scale=scale)
        y.append(C2 @ x2 + D2 * w)
        x1, x2 = A1 @ x1 + B1 * ut, A2 @ x2 + B2 * w
    return np.array(y)


# --------------------------------------------------------------------------------------------------
def test_models_match_a_numpy_loop_of_the_blocks():
    u = np.random.default_rng(3).standard_normal(300)
    model = wiener_hammerstein(2, 2, theta0=WH_TRUE, scale=WH_SCALE)
    y = simulate(model, WH_TRUE, u).y[0][:, 0]
    assert np.abs(y - _numpy_wh(WH_TRUE, u, WH_SCALE)).max() < 1e-10
    A, B, C, D = block_system(G_TRUE["g_den"], G_TRUE["g_num"], 0.0)
    lin = ss.dlsim((A, B[:, None], C[None, :], np.zeros((1, 1)), 1.0), u)[1][:, 0]
    w = simulate(wiener(3, theta0=G_TRUE, scale=2.0), G_TRUE, u).y[0][:, 0]
    assert np.abs(w - nonlinearity(G_TRUE, lin, scale=2.0)).max() < 1e-10
    fu = nonlinearity(G_TRUE, u)
    h = simulate(hammerstein(3, theta0=G_TRUE), G_TRUE, u).y[0][:, 0]
    assert np.abs(h - ss.dlsim((A, B[:, None], C[None, :], np.zeros((1, 1)), 1.0), fu)[1][:, 0]).max() < 1e-10
    # the MLP nonlinearity: CasADi model against the numpy MLP through nonlinearity()
    mw = wiener(3, nonlinearity="mlp", hidden=4, theta0=G_TRUE | {}, seed=2)
    th = mw.params.initial()
    assert np.abs(simulate(mw, th, u).y[0][:, 0] - nonlinearity(th, lin)).max() < 1e-10


def test_block_realises_the_requested_transfer_function_with_unit_leading_markov():
    poles = np.array([0.9 * np.exp(0.3j), 0.9 * np.exp(-0.3j), 0.5, -0.4, 0.2])
    zeros = np.array([0.3 + 0.6j, 0.3 - 0.6j, -0.7, 1.5])               # includes a non-minimum-phase zero
    for feedthrough, z in ((False, zeros), (True, np.append(zeros, 0.1))):
        theta = _block_theta("g", poles, z, feedthrough)
        assert _hausdorff(block_poles(theta), poles) < 1e-10
        b = np.real(np.poly(z))
        b = b if feedthrough else np.concatenate([[0.0], b])
        impulse = np.zeros(31)
        impulse[0] = 1.0
        expected = ss.lfilter(b, np.real(np.poly(poles)), impulse)
        got = block_markov(theta, "g", feedthrough, K=30)
        assert np.abs(got - expected).max() < 1e-8 * np.abs(expected).max()
        assert got[0 if feedthrough else 1] == 1.0                     # the gain convention


@pytest.mark.parametrize("truth,scale", [(WH_TRUE, WH_SCALE), (WH_SWAPPED, 1.2)])
def test_wiener_hammerstein_bla_split_and_refinement_recover_the_truth(truth, scale, caplog):
    model = wiener_hammerstein(2, 2, theta0=truth, scale=scale)
    data, noise = _data(model, truth)
    with caplog.at_level(logging.ERROR):
        init = bla_initialise("wiener_hammerstein", data, 2, 2)
    # (a) the chosen split: G1's poles are the true G1's (not G2's), and it simulates best
    best = init.best
    true1, true2 = block_poles(truth, "g1"), block_poles(truth, "g2")
    assert _hausdorff(best.g1_poles, true1) < 0.15 < 0.3 < _hausdorff(best.g1_poles, true2)    # 0.06, 0.08
    assert len(init.table) >= 2 and best.rms < 0.8 * init.table[1].rms
    assert best.rms < 0.2 * np.std(data.y[0])
    # the returned theta realises the split: its CasADi free run from rest has the least-squares RMS
    skip = min(40, T // 4)
    y0 = cc.simulate_output(init.model, init.theta, data.inputs(0), np.zeros(4))
    assert abs(_rms(y0[skip:], data.y[0][skip:]) - best.rms) < 1e-6 * best.rms
    # (b) refinement: simulation RMS at the noise level, poles, block impulse responses and f recovered
    res = cc.refine_output_error(init.model, data, init.theta, x0=init.x0)
    assert res.status == "converged"
    y1 = cc.simulate_output(init.model, res.theta, data.inputs(0), res.x0[0])
    assert _rms(y1, data.y[0]) < 1.1 * noise
    assert _hausdorff(block_poles(res.theta, "g1"), true1) < 0.01
    assert _hausdorff(block_poles(res.theta, "g2"), true2) < 0.02
    for blk, ft in (("g1", False), ("g2", True)):
        assert np.abs(block_markov(res.theta, blk, ft) - block_markov(truth, blk, ft)).max() < 0.01
    v = np.linspace(-3, 3, 13)
    f_true = nonlinearity(truth, v, scale=scale)
    assert np.abs(nonlinearity(res.theta, v, scale=init.best.scale) - f_true).max() < 0.02 * np.abs(f_true).max()


@pytest.mark.parametrize("kind,factory,scale", [("wiener", wiener, 2.0), ("hammerstein", hammerstein, 1.0)])
def test_one_block_bla_and_refinement_recover_the_truth(kind, factory, scale, caplog):
    model = factory(3, theta0=G_TRUE, scale=scale)
    data, noise = _data(model, G_TRUE)
    with caplog.at_level(logging.ERROR):
        init = bla_initialise(kind, data, 3)
    assert len(init.table) == 1 and init.best.rms < 0.4 * np.std(data.y[0])        # 0.34 (W), 0.21 (H)
    assert _hausdorff(block_poles(init.theta), block_poles(G_TRUE)) < 0.5           # a rough BLA
    res = cc.refine_output_error(init.model, data, init.theta, x0=init.x0)
    y1 = cc.simulate_output(init.model, res.theta, data.inputs(0), res.x0[0])
    assert res.status == "converged" and _rms(y1, data.y[0]) < 1.1 * noise
    assert _hausdorff(block_poles(res.theta), block_poles(G_TRUE)) < 0.01
    assert np.abs(block_markov(res.theta) - block_markov(G_TRUE)).max() < 0.01


def test_mlp_initialisation_is_a_least_squares_fit_realised_by_the_model(caplog):
    model = wiener(3, theta0=G_TRUE, scale=2.0)
    data, _ = _data(model, G_TRUE)
    with caplog.at_level(logging.ERROR):
        init = bla_initialise("wiener", data, 3, nonlinearity="mlp", hidden=6)
        poly = bla_initialise("wiener", data, 3)
    y0 = cc.simulate_output(init.model, init.theta, data.inputs(0), np.zeros(3))
    assert abs(_rms(y0[30:], data.y[0][30:]) - init.best.rms) < 1e-6 * init.best.rms
    assert init.best.rms < 1.5 * poly.best.rms                    # 6 tanh units vs the true cubic's basis


def test_gain_ambiguity_is_fixed_full_rank_output_error_jacobian():
    """At the truth, the output-error Hessian J^T J in the free parameters is nonsingular; freeing the
    fixed leading Markov coefficients makes it singular (the two scalings G1 -> a G1, G2 -> G2 / b)."""
    model = wiener_hammerstein(2, 2, theta0=WH_TRUE, scale=WH_SCALE)
    u = np.random.default_rng(0).standard_normal(400)

    def jacobian(m):
        pv = m.params.to_vector(WH_TRUE)
        cols = []
        for i in m.params.free_index:
            e = np.zeros_like(pv)
            e[i] = 1e-6
            plus = cc.simulate_output(m, pv + e, u[:, None], np.zeros(4))
            minus = cc.simulate_output(m, pv - e, u[:, None], np.zeros(4))
            cols.append((plus - minus).ravel() / 2e-6)
        J = np.column_stack(cols)
        J = J / np.linalg.norm(J, axis=0)                            # unit columns: scale invariant
        s = np.linalg.svd(J, compute_uv=False)
        return s[-1] / s[0]

    assert jacobian(model) > 1e-3
    # with G1's leading Markov coefficient free: one more parameter and a null direction
    free_all = cc.Parameters(*(cc.Param(p.name, p.array("value"), lower=p.array("lower"), upper=p.array("upper"))
                               for p in model.params))
    loose = cc.StateSpaceModel.from_functions(model.f, model.g, params=free_all)
    assert loose.params.free_mask.sum() == model.params.free_mask.sum() + 1
    assert jacobian(loose) < 1e-6


def test_inputs_are_validated():
    model = wiener(2, theta0={"g_den": [-1.0, 0.25], "g_num": [1.0, 0.0]})
    data = simulate(model, model.params.initial(), np.random.default_rng(0).standard_normal(200))
    with pytest.raises(cc.OptionsError, match="kind"):
        bla_initialise("hammer", data, 2)
    with pytest.raises(cc.ShapeError, match="n1, n2"):
        bla_initialise("wiener_hammerstein", data, 2)
    with pytest.raises(cc.ParameterError, match="leading Markov"):
        wiener(2, theta0={"g_num": [2.0, 0.0]})
    with pytest.raises(cc.OptionsError, match="nonlinearity"):
        hammerstein(2, nonlinearity="spline")
    with pytest.raises(cc.ShapeError, match="order"):
        wiener(0)


def test_odd_block_order_without_a_real_bla_pole_falls_back_to_a_double_real_pole(caplog):
    """WH 3 + 3 on 600 samples: the BLA has three complex pairs (the true real poles 0.5 and -0.4 are
    estimated as a pair), so no split gives G1 three poles until a pair is taken as a double real pole."""
    from scripts.block_oriented_demo import TRUTH
    model = wiener_hammerstein(3, 3, theta0=TRUTH, scale=2.0)
    u = np.random.default_rng(0).standard_normal(600)
    data = simulate(model, TRUTH, u, noise_std=0.014, seed=1)
    with caplog.at_level(logging.ERROR):
        init = bla_initialise("wiener_hammerstein", data, 3, 3)
    bla_poles = np.linalg.eigvals(init.bla.A)
    assert np.all(np.abs(bla_poles.imag) > 1e-3)                        # the case: no real BLA pole
    for split in init.table:
        assert len(split.g1_poles) == 3 and len(split.g2_poles) == 3
        assert np.sum(np.abs(split.g1_poles.imag) < 1e-12) % 2 == 1     # G1 (odd order) got a real pole
    assert np.all(np.isfinite(cc.simulate_output(init.model, init.theta, u[:, None], np.zeros(6))))


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="a known limitation: with More's scaling from the first step the engine ends "
                   "in another basin (3.95x the noise); the isotropic start that fixes it slowed the 100,000-sample "
                   "fit (docs/output_error.md, 'Tried and not kept: the scaling's isotropic start')")
def test_mlp_refinement_reaches_the_noise_level(caplog):
    """Wiener truth (cubic f), MLP with 6 units: BLA initialisation then refine_output_error (Gauss-Newton)
    to the noise level and the true poles (17 s; stalls at the initial RMS without the weights' prior)."""
    model = wiener(3, theta0=G_TRUE, scale=2.0)
    data, noise = _data(model, G_TRUE)
    with caplog.at_level(logging.ERROR):
        init = bla_initialise("wiener", data, 3, nonlinearity="mlp", hidden=6)
    res = cc.refine_output_error(init.model, data, init.theta, x0=init.x0)
    y1 = cc.simulate_output(init.model, res.theta, data.inputs(0), res.x0[0])
    assert res.status == "converged" and _rms(y1, data.y[0]) < 1.1 * noise
    assert _hausdorff(block_poles(res.theta), block_poles(G_TRUE)) < 0.01


def test_bla_inputs_are_validated():
    model = wiener_hammerstein(2, 2, theta0=WH_TRUE, scale=WH_SCALE)
    data = simulate(model, WH_TRUE, np.random.default_rng(0).standard_normal(200))
    with pytest.raises(cc.ShapeError, match="pair"):
        bla_initialise("wiener_hammerstein", data, 2, 2, feedthrough=True)
    with pytest.raises(cc.ShapeError, match="orders"):
        bla_initialise("wiener", data, 0)
    with pytest.raises(cc.OptionsError, match="max_splits"):
        bla_initialise("wiener_hammerstein", data, 2, 2, max_splits=1)
