"""The learning-step protocol and its one factory (issue 23, item 3)."""
from __future__ import annotations

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.learning import CurvatureLearningStep, LearningStep, learner_for
from ceem_casadi.learning._pieces import PieceLearner
from ceem_casadi.learning._remote import RemoteLearner
from ceem_casadi.runtime import _policy as policy
from models import lorenz


@pytest.fixture(scope="module")
def problem():
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.05)
    data, xs = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=3), 48, measurement_std=0.05, seed=4)
    return model, data, list(xs)


def test_every_learner_of_the_library_implements_the_protocol(problem):
    model, data, _ = problem
    plain = cc.learning.Learner(model, data.lengths)
    adam = cc.learning.AdamLearner(model)
    pieces = PieceLearner(model, cc.LearnerOptions(), piece=16)
    local = pieces.engine.learner  # the piece engine's local learner, a RemoteLearner
    assert isinstance(local, RemoteLearner)
    for learner in (plain, adam, pieces, local):
        assert isinstance(learner, LearningStep), type(learner).__name__
    for learner in (plain, pieces, local):
        assert isinstance(learner, CurvatureLearningStep), type(learner).__name__
    assert not isinstance(adam, CurvatureLearningStep)  # no hessian_matrix: the fit skips its curvature check
    assert not isinstance(object(), LearningStep)


def test_the_factory_follows_the_policy(problem, monkeypatch):
    model, data, _ = problem
    assert type(learner_for(model, data.lengths, cc.LearnerOptions())) is cc.learning.Learner
    monkeypatch.setattr(policy, "PIECE_FROM", 40)
    assert type(learner_for(model, data.lengths, cc.LearnerOptions())) is PieceLearner


class _Delegating:
    """A user's learning step without a library base class: it delegates and counts its calls."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def solve(self, theta_vec, data, xs, rho_theta=None, weights=None):
        self.calls += 1
        return self.inner.solve(theta_vec, data, xs, rho_theta, weights)


def test_a_user_learning_step_is_used_by_the_fit(problem):
    model, data, _ = problem
    theta0 = lorenz.perturbed(lorenz.TRUE, 0.05, seed=1)
    user = _Delegating(cc.learning.Learner(model, data.lengths))
    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=3, tol=0.0), learner=user)
    ref = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=3, tol=0.0))
    assert user.calls == 3 and res.iterations == 3
    for k in ref.theta:
        np.testing.assert_allclose(res.theta[k], ref.theta[k], rtol=1e-10)


def test_an_object_without_solve_is_refused(problem):
    model, data, _ = problem
    with pytest.raises(TypeError, match="LearningStep protocol"):
        cc.ceem(model, data, lorenz.TRUE, learner=object())


def test_a_learner_with_the_dask_engine_is_refused_not_silently_replaced(problem):
    distributed = pytest.importorskip("distributed", reason="dask.distributed not installed")
    model, data, _ = problem
    user = _Delegating(cc.learning.Learner(model, data.lengths))
    refused = pytest.raises(cc.OptionsError, match="learner=_Delegating cannot be used with executor=Client")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as \
            cluster, distributed.Client(cluster) as client, refused:
        cc.ceem(model, data, lorenz.TRUE, options=cc.CEEMOptions(executor=client, max_iters=2), learner=user)
    assert user.calls == 0
