"""Cascaded Tanks gray-box model and pipeline on the real benchmark data."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.baselines._n4sid import n4sid
from ceem_casadi.io import load_cascaded_tanks, simulation_rms
from models.cascaded_tanks import BOUNDS, cascaded_tanks, default_theta, steady_upper_level
from scripts import cascaded_tanks as script

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "SHA256SUMS").is_file(),
                                reason=f"real benchmark data not present at {DATA} (set up ../shared/data)")


def test_rhs_matches_hand_formula_away_from_overflow():
    """Far below the overflow levels the vector field is plain Torricelli (independent numpy formula)."""
    m = cascaded_tanks({"b1": 0.003, "b2": 0.002})
    th = m.params.initial()
    x, u = np.array([4.0, 2.5]), np.array([3.0])
    f = np.asarray(m.rhs(x, u, m.theta_vector(th))).ravel()
    q1 = th["a1"] * np.sqrt(4.0) + th["b1"] * 4.0
    expect = [th["kp"] * 3.0 - q1, q1 - th["a2"] * np.sqrt(2.5) - th["b2"] * 2.5]
    np.testing.assert_allclose(f, expect, rtol=1e-6, atol=1e-9)


def test_overflow_saturates_levels_under_strong_pump():
    """A full pump for a long time fills both tanks up to (about) their overflow levels, not beyond."""
    m = cascaded_tanks()
    th = m.params.initial()
    u = np.full((400, 1), 10.0)
    y, x = cc.simulate_output(m, th, u, [1.0, 1.0], return_states=True)
    assert np.all(np.isfinite(x))
    assert abs(x[-1, 0] - th["h1max"]) < 0.12 and abs(x[-1, 1] - th["h2max"]) < 0.12
    assert np.all(x <= np.array([th["h1max"], th["h2max"]]) + 0.101)


@needs_data
@pytest.mark.parametrize("split", ["estimation", "test"])
def test_simulation_on_official_input_finite_and_within_bounds(split):
    s = load_cascaded_tanks(DATA)[split]
    m = cascaded_tanks()
    for th in (m.params.initial(), {**m.params.initial(), "kp": 0.08, "a1": 0.02, "a2": 0.02}):
        y, x = cc.simulate_output(m, th, s.u, [steady_upper_level(th, 5.0), 5.0], return_states=True)
        assert np.all(np.isfinite(x)) and np.all(np.isfinite(y))
        assert np.all(x > -0.05)
        assert np.all(x[:, 0] <= th["h1max"] + 0.101) and np.all(x[:, 1] <= th["h2max"] + 0.101)
    for name, (lo, hi) in BOUNDS.items():
        assert lo <= default_theta()[name] <= hi


@needs_data
def test_the_map_state_estimator_recovers_the_hidden_level_better_and_is_chosen_on_estimation_windows():
    """A record simulated away from the steady upper level with 0.05 V sensor noise: from 5 samples per window,
    the MAP fit (prior learned from the record's states, `state_prior`) finds the hidden upper level with less
    than half the error of the local fit from the steady level, and `test_state` (given no test data) chooses it."""
    s = load_cascaded_tanks(DATA)["estimation"]
    m = cascaded_tanks()
    th = {**m.params.initial(), "kp": 0.08, "a1": 0.05, "a2": 0.05}
    x0, u = np.array([1.0, 5.0]), s.u[:400]
    y, x = cc.simulate_output(m, th, u, x0, return_states=True)
    y = y + 0.05 * np.random.default_rng(1).normal(size=(400, 1))
    est = cc.io.BenchmarkSplit("estimation", cc.Trajectories([y], [u], dt=s.data.dt), 5)
    coef, std = script.state_prior(m, th, est, x0)
    err = {"steady": [], "map": []}
    for t in range(0, 200, 10):
        prior = (np.r_[1.0, y[t, 0], u[t, 0]] @ coef, std)
        err["steady"].append(abs(script.window_state(m, th, y[t:], u[t:])[0] - x[t, 0]))
        err["map"].append(abs(script.window_state(m, th, y[t:], u[t:], prior)[0] - x[t, 0]))
    assert np.mean(err["map"]) < 0.5 * np.mean(err["steady"]), {k: np.mean(v) for k, v in err.items()}
    x0_test, how, scores = script.test_state(m, th, est, est, x0)
    assert how == "same" and scores["map"] < scores["steady"], scores
    np.testing.assert_allclose(x0_test, x0, atol=0.2)


@needs_data
def test_short_ceem_beats_n4sid_on_estimation_simulation():
    est = load_cascaded_tanks(DATA)["estimation"]
    lin = n4sid(est.data, order=2, horizon=10)
    rms_lin = simulation_rms(est.y, lin.simulate(est.u, lin.x0[0]))
    m = cascaded_tanks(script.initial_theta(est, lin), process_std=0.003, measurement_std=0.05)
    th0 = m.params.initial()
    res = cc.ceem(m, est.data, th0, options=cc.CEEMOptions(max_iters=8))
    rms_ce = simulation_rms(est.y, cc.simulate_output(m, res.theta, est.u, res.x[0][0]))
    rms_0 = simulation_rms(est.y, cc.simulate_output(m, th0, est.u, [steady_upper_level(th0, est.y[0, 0]),
                                                                     est.y[0, 0]]))
    assert np.isfinite(rms_ce)
    assert rms_ce < rms_lin, (rms_ce, rms_lin)
    assert rms_ce < 0.8 * rms_0, (rms_ce, rms_0)
    for name, (lo, hi) in BOUNDS.items():
        assert lo - 1e-9 <= res.theta[name] <= hi + 1e-9


@needs_data
def test_script_smoke(tmp_path):
    out = script.main(["--smoke", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["n_estimation"] == 256
    for key in ("n4sid", "ceem", "refined"):
        assert np.isfinite(saved[key]["test_rms"]) and saved[key]["test_rms"] == out[key]["test_rms"]
    assert (tmp_path / "test_simulation.png").stat().st_size > 10_000
    table = (tmp_path / "table.md").read_text()  # the table shows this run's measured values
    for key in ("n4sid", "ceem", "refined"):
        assert f"{saved[key]['test_rms']:.3f} |" in table


def test_structure_terms_match_hand_formulas_and_are_neutral_by_default():
    """Free outflow exponents, quadratic sensor term and water-jet term (independent numpy formulas);
    the default model has none of them (its 11 parameters, Torricelli outflows, affine sensor)."""
    th = {"b1": 0.003, "b2": 0.002, "e1": 0.7, "e2": 0.3, "c2": 0.05, "cj": -4.0}
    m = cascaded_tanks(th, free_exponents=True, sensor_curvature=True, jet=True)
    p = m.params.initial()
    x, u = np.array([4.0, 2.5]), np.array([3.0])
    q1 = p["a1"] * 4.0 ** 0.7 + p["b1"] * 4.0
    expect = [p["kp"] * 3.0 - q1, q1 - p["a2"] * 2.5 ** 0.3 - p["b2"] * 2.5]
    np.testing.assert_allclose(np.asarray(m.rhs(x, u, m.theta_vector(p))).ravel(), expect, rtol=1e-6, atol=1e-9)
    y = float(m.g(x, u, m.theta_vector(p)))
    np.testing.assert_allclose(y, p["c0"] + 2.5 + 0.05 * 2.5 ** 2 - 4.0 * q1, rtol=1e-9)
    assert {"e1", "e2", "c2", "cj"} <= {m.params.names[i] for i in m.params.free_index}
    default = cascaded_tanks(th)  # the extra entries of th are ignored
    assert set(default.params.names) == set(BOUNDS)
    q1 = p["a1"] * 2.0 + p["b1"] * 4.0
    np.testing.assert_allclose(np.asarray(default.rhs(x, u, default.theta_vector(default.params.initial()))).ravel(),
                               [p["kp"] * 3.0 - q1, q1 - p["a2"] * np.sqrt(2.5) - p["b2"] * 2.5], rtol=1e-6, atol=1e-9)
