"""The learning step near its optimum: plain Newton steps (`ceem_casadi.learning._newton`) instead of
IPOPT, the same optimum; and the long record's piece vectors rewritten in place equal fresh ones."""
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.learning import Learner
from ceem_casadi.learning import _learner as learner_module
from ceem_casadi.learning._pieces import PieceLearner
from ceem_casadi.smoothing._initial_states import eks_states
from models import lorenz


@pytest.fixture(scope="module")
def problem():
    model = lorenz.single_lorenz(process_std=0.05, measurement_std=0.1)
    data, xt = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=1), [61, 30], measurement_std=0.1,
                           process_std=0.05, seed=2)
    return model, data, list(xt)


def test_newton_steps_replace_ipopt_near_the_optimum(problem, monkeypatch):
    """Started 1 % off the optimum of the learning problem: Newton steps alone (IPOPT never called,
    at most 4 steps) reach IPOPT's optimum (solved from 10 % off) to 1e-8 relative."""
    model, data, xs = problem
    opts = cc.LearnerOptions(compile=False)
    ref = Learner(model, data.lengths, opts).solve(model.theta_vector(lorenz.perturbed(lorenz.TRUE, 0.1, seed=3)),
                                                   data, xs, rho_theta=0.0)
    assert ref.success
    learner = Learner(model, data.lengths, opts)

    def no_ipopt(*args, **kwargs):
        raise AssertionError("IPOPT was called")

    monkeypatch.setattr(learner_module, "solve", no_ipopt)
    res = learner.solve(ref.theta_vec * 1.01, data, xs, rho_theta=0.0)
    assert res.status == "Solve_Succeeded" and 1 <= res.iterations <= 4
    np.testing.assert_allclose(res.theta_vec, ref.theta_vec, rtol=1e-8)


def test_piece_vectors_rewritten_in_place_equal_fresh_ones(problem):
    """A second learning session (new states and parameters) rewrites the pieces' NLP vectors in place;
    they equal those of a fresh engine entry by entry."""
    model, data, xs = problem
    theta = model.theta_vector(lorenz.TRUE)
    pieces = PieceLearner(model, cc.LearnerOptions(compile=False), piece=7).engine
    pieces.data = data
    first = pieces.learning_session(theta, xs)
    kept = [P for _, P, *_ in first]
    xs2 = eks_states(model, theta * 1.02, data)
    again = pieces.learning_session(theta * 1.02, xs2)
    assert all(P is Q for (_, P, *_), Q in zip(again, kept))  # the same arrays, rewritten
    fresh = PieceLearner(model, cc.LearnerOptions(compile=False), piece=7).engine
    fresh.data = data
    for (_, P, *_), (_, Q, *_) in zip(again, fresh.learning_session(theta * 1.02, xs2)):
        np.testing.assert_array_equal(P, Q)
