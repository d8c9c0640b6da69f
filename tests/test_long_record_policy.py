"""The long-record policy (issue 23, item 7): every threshold lives in runtime/_policy.py; lowered
below the length of a small problem, every long-record path is taken (chunked smoother with the
banded Newton solver, piece learner, chunk-major learner layout, chunked joint Gauss-Newton step,
EKF candidates scored on a prefix) and the fit equals the plain path's."""
from __future__ import annotations

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.learning import learner_for
from ceem_casadi.learning._pieces import PieceLearner
from ceem_casadi.runtime import _policy as policy
from ceem_casadi.smoothing._smoother import chunk_length, solver_kind
from models import lorenz

T = 96
LOW = {"CHUNK_FROM": 40, "CHUNK_LENGTH": 16, "PIECE_FROM": 40, "PIECE_LENGTH": 24, "LEARN_CHUNK_FROM": 40,
       "LEARN_CHUNK": 16, "JOINT_CHUNK": 20, "SELECT_STEPS": 48}


@pytest.fixture(scope="module")
def problem():
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=7), T, measurement_std=0.05, seed=8)
    return model, data, lorenz.perturbed(lorenz.TRUE, 0.05, seed=9)


def _fit(model, data, theta0, acceleration):
    # plain EM: 6 iterations, where the learner sets theta; newton: to convergence, where the joint
    # Gauss-Newton steps (chunked) do
    options = (cc.CEEMOptions(max_iters=6, tol=0.0) if acceleration == "none"
               else cc.CEEMOptions(max_iters=40, tol=1e-10, acceleration="newton"))
    return cc.ceem(model, data, theta0, options=options)


def test_the_policy_names_every_threshold():
    assert set(policy.THRESHOLDS) <= set(LOW)
    assert all(isinstance(getattr(policy, k), int) and getattr(policy, k) > T for k in policy.THRESHOLDS)


@pytest.mark.parametrize("acceleration", ["none", "newton"])
def test_lowered_thresholds_take_the_long_record_paths_and_give_the_plain_fit(problem, monkeypatch, acceleration):
    model, data, theta0 = problem
    plain = _fit(model, data, theta0, acceleration)
    assert plain.status == ("max_iters" if acceleration == "none" else "converged"), plain.message
    for k, v in LOW.items():
        monkeypatch.setattr(policy, k, v)
    # the long-record forms are chosen at this length now
    assert chunk_length(None, T) == LOW["CHUNK_LENGTH"] and solver_kind(cc.SmootherOptions(), T) == "banded"
    assert isinstance(learner_for(model, data.lengths, cc.LearnerOptions()), PieceLearner)
    calls = []
    original = PieceLearner.solve
    monkeypatch.setattr(PieceLearner, "solve", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    long = _fit(model, data, theta0, acceleration)
    assert long.status == plain.status and long.iterations == plain.iterations, long.message
    assert calls, "the piece learner was not used"
    for k in plain.theta:
        np.testing.assert_allclose(long.theta[k], plain.theta[k], rtol=1e-6, err_msg=k)
    assert long.J == pytest.approx(plain.J, rel=1e-9)
    for a, b in zip(long.x, plain.x):
        np.testing.assert_allclose(a, b, atol=1e-5)
