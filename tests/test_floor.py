"""scripts/_floor.py: the floor of one iteration is ONE batched evaluation of all stage derivatives
plus ONE stacked banded factorisation per batch (smoothing), one mapped objective/gradient (and
Gauss-Newton Hessian) pass (learning); the ratios written beside each phase."""
from __future__ import annotations

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.objective import StageFunctions
from models import lorenz
from scripts import _floor


def _problem():
    model = lorenz.single_lorenz(process_std=0.1, measurement_std=0.5)
    data, xt = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(3, seed=1), [30, 30, 20], process_std=0.1,
                           measurement_std=0.5, seed=1)
    return model, model.theta_vector(lorenz.TRUE), data, list(xt)


def test_smoothing_floor_is_one_evaluation_and_one_factorisation_per_batch(monkeypatch):
    """Two lengths (30 x 2, 20 x 1): per timing, one newton_many over each length's trajectories
    and one stacked factorisation of all of them; repeats + 1 passes (one untimed)."""
    model, theta, data, xs = _problem()
    seen = []
    newton_many = _floor.BatchObjective.newton_many
    stacked = _floor.stacked_directions

    def counted(self, idx, x):
        seen.append(("eval", self.T, len(idx)))
        return newton_many(self, idx, x)

    def counted_stacked(reqs, nx, T):
        seen.append(("chol", T, len(reqs)))
        out = stacked(reqs, nx, T)
        assert all(d is not None for d in out)
        return out

    monkeypatch.setattr(_floor.BatchObjective, "newton_many", counted)
    monkeypatch.setattr(_floor, "stacked_directions", counted_stacked)
    f = _floor.smoothing_floor(StageFunctions(model, compile=False), theta, data, xs, rho=0.1, repeats=2)
    assert f > 0 and np.isfinite(f)
    one_pass = [("eval", 30, 2), ("chol", 30, 2), ("eval", 20, 1), ("chol", 20, 1)]
    assert seen == one_pass * 3


def test_learning_floor_evaluates_the_parameter_derivatives(monkeypatch):
    """The learning floor maps dyn_p_grad (cost and gradient summed) and, with hessian=True,
    dyn_p_jac over all dynamics stages (single Lorenz: the observation does not depend on theta),
    and forms J^T J of the right size."""
    model, theta, data, xs = _problem()
    grams = []
    gram = _floor.gram
    monkeypatch.setattr(_floor, "gram", lambda J: grams.append(J.shape) or gram(J))
    stages = StageFunctions(model, compile=False)
    assert _floor.learning_floor(stages, theta, data, xs, hessian=False, repeats=1) > 0 and not grams
    assert _floor.learning_floor(stages, theta, data, xs, hessian=True, repeats=1) > 0
    n_dyn = sum(T - 1 for T in data.lengths)
    assert grams == [(3 * n_dyn, 3)] * 2  # untimed pass + one timing; rows = 3 residuals per stage


def test_floor_row():
    row = _floor.floor_row(6.0, 1.5, iterations=2)
    assert row == {"phase_s": 6.0, "floor_s": 1.5, "ratio": 4.0, "iterations": 2.0, "ratio_per_iteration": 2.0}
    assert "ratio 4.00x" in _floor.format_floor("smoothing", row)
    assert np.isnan(_floor.floor_row(1.0, 0.0)["ratio"])
    with pytest.raises(TypeError):
        _floor.floor_row()
