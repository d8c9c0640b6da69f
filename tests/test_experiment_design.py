"""Optimal experiment design (ceem_casadi.experiment_design) and the CLI command design-input."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.errors import OptionsError, ShapeError
from ceem_casadi.workflow import DesignOptions, design_input, fisher_information

ROOT = Path(__file__).resolve().parents[1]
SIGMA = 0.1
A, B, C = 0.7, 1.0, 2.0


def linear(free=("a", "b"), **noise):
    """x+ = a x + b u, y = c x (c fixed): a tiny linear model with a closed-form information."""
    params = cc.Parameters(cc.Param("a", A, free="a" in free), cc.Param("b", B, free="b" in free),
                           cc.Param("c", C, free=False))
    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: p.c * x, nx=1, nu=1,
                                            params=params, measurement_std=SIGMA, **noise)


THETA = {"a": A, "b": B, "c": C}


def fd_information(model, theta, u, x0):
    """Independent oracle: S = d yhat / d theta_free by central differences of the free run, I = S^T S / sigma^2."""
    vec = model.theta_vector(theta)
    cols = []
    for k in model.params.free_index:
        h = 1e-6 * max(1.0, abs(vec[k]))
        up, dn = vec.copy(), vec.copy()
        up[k] += h
        dn[k] -= h
        cols.append((cc.simulate_output(model, up, u, x0) - cc.simulate_output(model, dn, u, x0)).ravel() / (2 * h))
    S = np.column_stack(cols)
    return S.T @ S / SIGMA ** 2


def closed_form_b(u, x0=0.0):
    """I_bb = sum_t (c dx_t/db)^2 / sigma^2, dx_t/db = sum_{k<t} a^(t-1-k) u_k (x0 known)."""
    T = len(u)
    s = np.array([sum(A ** (t - 1 - k) * u[k, 0] for k in range(t)) for t in range(T)])
    return float(np.sum((C * s) ** 2) / SIGMA ** 2)


def test_fisher_information_equals_finite_difference_and_closed_form():
    model = linear()
    u = np.random.default_rng(1).uniform(-1, 1, (25, 1))
    x0 = np.array([0.3])
    info = fisher_information(model, THETA, u, x0=x0)
    np.testing.assert_allclose(info, fd_information(model, THETA, u, x0), rtol=1e-6)
    info_b = fisher_information(linear(free=("b",)), THETA, u, x0=np.zeros(1))
    assert info_b.shape == (1, 1)
    np.testing.assert_allclose(info_b[0, 0], closed_form_b(u), rtol=1e-12)


def test_process_noise_information_tends_to_output_error_information():
    """With negligible process noise and a tight x1 prior at x0, the CE-EM reduced Hessian (uncertainty.py)
    equals the output-error Fisher information with x0 known."""
    x0 = np.array([0.3])
    model = linear(process_std=1e-5, x1_mean=x0, x1_std=1e-7)
    u = np.random.default_rng(2).uniform(-1, 1, (20, 1))
    oe = fisher_information(model, THETA, u, x0=x0)
    ce = fisher_information(model, THETA, u, x0=x0, process_noise=True)
    np.testing.assert_allclose(ce, oe, rtol=1e-4)
    # with large process noise the information drops (the states absorb part of the signal)
    ce_noisy = fisher_information(model.with_noise(process_std=0.1), THETA, u, x0=x0, process_noise=True)
    assert np.linalg.det(ce_noisy) < 0.5 * np.linalg.det(oe)


def test_design_maximises_closed_form_information_within_bounds():
    """b alone free: I_bb is a convex quadratic in u, maximised on the box |u| <= 1 by a constant +-1 input."""
    model = linear(free=("b",))
    T = 15
    res = design_input(model, THETA, T, u_bounds=(-1, 1), starts=3, seed=4)
    best = closed_form_b(np.ones((T, 1)))
    assert res.status == "converged"
    np.testing.assert_allclose(res.information[0, 0], best, rtol=1e-6)
    np.testing.assert_allclose(np.abs(res.u[:-1]), 1.0, atol=1e-6)  # u_{T-1} reaches no output
    np.testing.assert_allclose(res.value, np.log(res.information[0, 0] * B ** 2), rtol=1e-6)  # relative scale b=1


def test_design_increases_log_det_and_respects_rate_bounds():
    model = linear()
    T, rate = 30, 0.25
    x0 = np.array([0.0])
    res = design_input(model, THETA, T, u_bounds=(-1, 1), rate_bounds=rate, starts=3, seed=0, x0=x0)
    u = res.u
    assert np.all(u >= -1 - 1e-8) and np.all(u <= 1 + 1e-8)
    assert np.max(np.abs(np.diff(u[:, 0]))) <= rate + 1e-7
    # every start improved, and the result beats a constant and a random input that respect the same bounds,
    # judged by the independent finite-difference information
    assert all(s["final"] > s["initial"] for s in res.starts)
    logdet = np.linalg.slogdet(fd_information(model, THETA, u, x0))[1]
    const = np.full((T, 1), 1.0)
    rng = np.random.default_rng(5)
    walk = np.clip(np.cumsum(rng.uniform(-rate, rate, (T, 1)), axis=0), -1, 1)
    for other in (const, walk):
        assert logdet > np.linalg.slogdet(fd_information(model, THETA, other, x0))[1] + 0.5
    np.testing.assert_allclose(res.information, fd_information(model, THETA, u, x0), rtol=1e-6)
    d = res.to_dict()
    assert json.loads(json.dumps(d))["criterion"] == "D" and len(d["starts"]) == 3
    assert "start" in res.table() and "InputDesign(" in repr(res)


def test_a_criterion_and_hold():
    model = linear()
    res = design_input(model, THETA, 20, u_bounds=(-1, 1), criterion="A", starts=2,
                       options=DesignOptions(hold=4))
    assert np.all(res.u.reshape(5, 4)[:, :1] == res.u.reshape(5, 4))  # held over blocks of 4 samples
    scale = np.array([A, B])
    np.testing.assert_allclose(res.value, np.trace(np.linalg.inv(res.information * np.outer(scale, scale))),
                               rtol=1e-5)
    assert all(s["final"] <= s["initial"] + 1e-9 for s in res.starts)


def test_design_errors():
    model = linear()
    with pytest.raises(OptionsError, match="criterion"):
        design_input(model, THETA, 10, u_bounds=(-1, 1), criterion="E")
    with pytest.raises(ShapeError, match="u_bounds"):
        design_input(model, THETA, 10, u_bounds=(1, -1))
    with pytest.raises(ShapeError, match="rate_bounds"):
        design_input(model, THETA, 10, u_bounds=(-1, 1), rate_bounds=-1)
    with pytest.raises(OptionsError, match="hold"):
        DesignOptions(hold=0)


MODEL_PY = textwrap.dedent('''
    import ceem_casadi as cc

    def make():
        params = cc.Parameters(cc.Param("a", 0.7), cc.Param("b", 1.0))
        return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: 2.0 * x,
                                                nx=1, nu=1, params=params, measurement_std=0.1)
''')


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "ceem_casadi.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=180, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


def test_cli_design_input_happy_path_and_bad_input(tmp_path):
    (tmp_path / "lin.py").write_text(MODEL_PY)
    out = tmp_path / "u.npz"
    proc = _cli("design-input", "--model", "lin.py:make", "--horizon", "20", "--u-bounds=-1,1",
                "--rate-bound", "0.5", "--starts", "2", "--out", str(out), "--json", str(tmp_path / "d.json"),
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    z = np.load(out)
    assert z["u"].shape == (20, 1) and np.all(np.abs(z["u"]) <= 1 + 1e-8)
    assert np.max(np.abs(np.diff(z["u"][:, 0]))) <= 0.5 + 1e-7
    model = linear(free=("a", "b"))
    np.testing.assert_allclose(z["information"], fd_information(model, THETA, z["u"], np.zeros(1)), rtol=1e-6)
    csv = tmp_path / "u.csv"
    proc = _cli("design-input", "--model", "lin.py:make", "--horizon", "10", "--u-bounds", "0,2", "--starts", "1",
                "--out", str(csv), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert csv.read_text().splitlines()[0] == "t,u0"
    bad = _cli("design-input", "--model", "lin.py:make", "--horizon", "20", "--u-bounds", "1", "--out",
               str(out), cwd=tmp_path)
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "--u-bounds" in lines[0] and "2 comma-separated" in lines[0]


def test_a_free_parameter_at_zero_that_moves_the_output_is_designed_for():
    """A free entry whose value is 0 (a linear outflow term started at 0, the identified Cascaded Tanks' b2) has
    information like any other: before, its relative scale was floored at 1e-8, its relative information fell
    16 decades and design_input refused it as 'zero information'. The D-criterion is the log det of the
    closed-form information (scale 1 for the entry at 0)."""
    model, theta = linear(), {"a": A, "b": 0.0, "c": C}
    d = design_input(model, theta, 30, u_bounds=(-1.0, 1.0), x0=[1.0], starts=1, seed=0,
                     options=DesignOptions(max_iters=50))
    info = fisher_information(model, theta, d.u, x0=[1.0])
    assert info[1, 1] > 1.0 and np.isfinite(d.information).all()
    scaled = info * np.outer([A, 1.0], [A, 1.0])     # relative a, absolute b
    assert d.value == pytest.approx(float(np.linalg.slogdet(scaled)[1]), rel=1e-6)
