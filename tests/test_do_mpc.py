"""The identified model in do-mpc (``[control]`` extra): the do-mpc controller of scripts/mpc_do_mpc.py makes the
same first moves as the Opti controller of scripts/mpc_cascaded_tanks.py; without do-mpc, a clear ImportError."""
from __future__ import annotations

import sys

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.deploy import to_do_mpc


def _tanks():
    from models.cascaded_tanks import cascaded_tanks, default_theta

    model = cascaded_tanks(default_theta())
    return model, model.params.initial()


def test_missing_do_mpc_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "do_mpc", None)          # import do_mpc now raises ImportError
    model, theta = _tanks()
    with pytest.raises(ImportError, match=r"ceem_casadi\[control\]"):
        to_do_mpc(model, theta)
    with pytest.raises(cc.OptionsError, match="parameters"):
        to_do_mpc(model, theta, parameters="fixed")


def test_do_mpc_model_steps_like_the_identified_model():
    pytest.importorskip("do_mpc")
    model, theta = _tanks()
    vec = model.theta_vector(theta)
    x, u = np.array([6.0, 4.0]), np.array([5.0])
    want = np.asarray(model.f(x, u, vec)).ravel()
    for kind in ("baked", "tvp", "uncertain"):
        m = to_do_mpc(model, theta, parameters=kind)
        args = {"baked": (x, u, [], [], [], []), "tvp": (x, u, [], vec, [], []), "uncertain": (x, u, [], [], vec, [])}
        got = np.asarray(m._rhs_fun(*args[kind])).ravel()
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_do_mpc_controller_agrees_with_the_opti_controller_on_the_first_moves():
    pytest.importorskip("do_mpc")
    from scripts.mpc_cascaded_tanks import MPC
    from scripts.mpc_do_mpc import DoMPC

    model, theta = _tanks()
    vec = model.theta_vector(theta)
    xs, us = ca.SX.sym("x", 2), ca.SX.sym("u", 1)
    F = ca.Function("F", [xs, us], [model.f(xs, us, vec)])
    G = ca.Function("G", [xs, us], [model.g(xs, us, vec)])
    N, lam = 10, 1.0
    opti, dompc = MPC(F, G, N, lam), DoMPC(model, theta, N, lam)
    x, u_prev, d = np.array([3.0, 3.0]), 3.0, 0.1
    moves = []
    for _ in range(6):                # closed loop on the model itself, reference step 3 -> 3.5 V (inside the bounds)
        r = np.full(N, 3.5)
        u_a, status_a, _ = opti.solve(x, d, r, u_prev)
        u_b, status_b, _ = dompc.solve(x, d, r, u_prev)
        assert status_a == "Solve_Succeeded" and status_b == "Solve_Succeeded"
        moves.append((u_a, u_b))
        x = np.asarray(F(x, u_a)).ravel()
        u_prev = u_a
    moves = np.array(moves)
    np.testing.assert_allclose(moves[:, 1], moves[:, 0], rtol=0, atol=1e-8)   # measured: 3e-12
    assert np.ptp(moves[:, 0]) > 0.4 and moves.max() < 9.0   # the moves change and stay off the bounds


@pytest.mark.slow
def test_mpc_do_mpc_smoke(tmp_path, monkeypatch):
    """scripts/mpc_do_mpc.py --smoke on the real data: tracks the 7 V step within 3x the sensor noise, inside the
    input bounds, every IPOPT solve converged (~2 min on a loaded machine: slow)."""
    pytest.importorskip("do_mpc")
    from ceem_casadi.io._datasets import DatasetNotFoundError, default_data_dir

    monkeypatch.setenv("MPLBACKEND", "Agg")
    try:
        default_data_dir()
    except DatasetNotFoundError:
        pytest.skip("Cascaded Tanks data not available")
    from scripts import mpc_do_mpc

    res = mpc_do_mpc.main(["--smoke", "--out", str(tmp_path)])
    assert res["input_bound_violations"] == 0 and res["solver_not_converged"] == 0
    assert res["final_error_rms_last20"] < 0.15
    assert (tmp_path / "mpc_do_mpc.png").is_file()
