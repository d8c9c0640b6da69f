"""Silverbox gray-box model and script (real data; skipped when ../shared/data is absent)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import ceem_casadi as cc
from models.silverbox import NAMES, initial_theta, silverbox
from scripts import silverbox as script

try:
    SPLITS = cc.load_silverbox()
except cc.io.DatasetNotFoundError as exc:  # pragma: no cover - depends on the machine
    SPLITS, REASON = None, str(exc)
else:
    REASON = ""
needs_data = pytest.mark.skipif(SPLITS is None, reason=f"Silverbox data not available: {REASON}")


@needs_data
def test_simulation_on_official_input_is_finite():
    u = SPLITS["test_arrow_full"].data.u[0]
    model = silverbox()
    p = model.theta_vector({"w0_100": 4.3, "zeta": 0.05, "k3": 4.0, "g": 1.0, "y0": 0.0, "c_v": 0.3, "d_u": 0.0})
    y = cc.simulate_output(model, p, u, np.zeros(2))
    assert y.shape == (len(u), 1) and np.all(np.isfinite(y))
    assert np.max(np.abs(y)) < 1.0  # volts: the oscillator stays in its physical range


def test_initial_theta_reproduces_the_linear_poles():
    # a discretised continuous oscillator with known w0, zeta: initial_theta recovers them
    w0, zeta, dt = 400.0, 0.05, 2 ** 14 / 1e7
    from scipy.linalg import expm
    Ac = np.array([[0.0, 1.0], [-w0 ** 2, -2 * zeta * w0]])
    A = expm(Ac * dt)
    th = initial_theta(A, np.array([[0.0], [1.0]]), np.array([[1.0, 0.0]]), np.zeros((1, 1)), 0.0, 0.0, dt)
    assert abs(100 * th["w0_100"] - w0) < 1e-6 * w0 and abs(th["zeta"] - zeta) < 1e-9
    assert set(th) == set(NAMES)


@needs_data
def test_short_ceem_fit_beats_n4sid_and_script_smoke(tmp_path):
    result = script.main(["--smoke", "--no-refine", "--out", str(tmp_path)])
    # the gray-box CE-EM fit (3 iterations on 4,000 samples) simulates better than N4SID
    assert result["ceem_rms_mV"]["test_multisine"] < result["n4sid_rms_mV"]["test_multisine"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert np.isfinite(saved["ceem_rms_mV"]["test_arrow_full"])


def test_mlp_correction_starts_as_the_plain_gray_box():
    th = {"w0_100": 4.3, "zeta": 0.05, "k3": 4.0, "g": 1.0, "y0": 0.0, "c_v": 0.3, "d_u": 0.05}
    plain, corrected = silverbox(th), silverbox(th, mlp_hidden=8)
    assert corrected.params.size == plain.params.size + 3 * 8 + 8 + 8 + 1
    u = np.sin(np.linspace(0, 20, 400))[:, None] * 0.05
    y0 = cc.simulate_output(plain, plain.params.initial(), u, np.zeros(2))
    y1 = cc.simulate_output(corrected, corrected.params.initial(), u, np.zeros(2))
    assert np.array_equal(y0, y1)


def test_quadratic_terms_match_hand_formula_and_are_fixed_by_default():
    """The quadratic stiffness k2 and output term c_y2 (independent numpy formula); the plain model
    does not have them."""
    th = {"w0_100": 4.3, "zeta": 0.05, "k3": 4.0, "g": 1.0, "y0": 0.01, "c_v": 0.3, "d_u": 0.05,
          "k2": -0.2, "c_y2": 0.5}
    m = silverbox(th, quadratic=True)
    p = m.theta_vector(th)
    x, u = np.array([0.05, -0.02]), np.array([0.1])
    e = 0.05 - 0.01
    force = -e - 2 * 0.05 * (-0.02) + 0.2 * e ** 2 - 4.0 * e ** 3 + 1.0 * 0.1
    np.testing.assert_allclose(np.asarray(m.rhs(x, u, p)).ravel(), [430.0 * -0.02, 430.0 * force], rtol=1e-9)
    np.testing.assert_allclose(float(m.g(x, u, p)), 0.05 + 0.3 * -0.02 + 0.05 * 0.1 + 0.5 * e ** 2, rtol=1e-9)
    free = {m.params.names[i] for i in m.params.free_index}
    plain = silverbox(th)
    assert {"k2", "c_y2"} <= free
    assert set(plain.params.names) == set(NAMES)
