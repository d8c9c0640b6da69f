"""The distributed learner's sums do not depend on the sharding (issue 17): the map-reduced
learning step gives bit-identical iterates, and the same number of rounds, with 1, 2 or 3 shards."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.distributed import _tasks as tasks
from ceem_casadi.distributed._shards import model_spec, shard_index
from ceem_casadi.learning._remote import RemoteLearner
from ceem_casadi.objective._exact_sum import SplitSum, combine, split_sums
from models import lorenz


class InProcessShards:
    """The engine interface of `RemoteLearner`, with the shards' tasks run in this process."""

    def __init__(self, model, data, options, n_shards):
        self.data, self.index = data, shard_index(data.lengths, n_shards)
        self.spec = model_spec(model, options.smoother, options.learner)
        self.rounds = 0

    def learning_session(self, theta_vec, xs):
        self._session_sent = 0
        session = [tasks.ShardActor(self.spec, self.data[idx]) for idx in self.index]
        for shard, idx in zip(session, self.index):
            shard.put(0, [xs[b] for b in idx])
        self._setup = (theta_vec, 0)
        return session

    def reduce(self, session, z, what):
        setup, self._setup = self._setup, None
        return [shard.terms(z, what, setup) for shard in session], 0

    def record(self, kind, t0, shard_s, sent, received, calls, **extra):
        self.rounds = calls


@pytest.fixture(scope="module")
def problem():
    """Single Lorenz, 7 trajectories of unequal length, states = truth + noise (fixed)."""
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
    lengths = [120, 80, 100, 90, 120, 60, 110]
    data, x = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(len(lengths), seed=3), lengths,
                          measurement_std=0.01, seed=4)
    rng = np.random.default_rng(5)
    xs = [np.asarray(xb) + 0.01 * rng.standard_normal(np.shape(xb)) for xb in x]
    theta = model.params.to_vector(lorenz.perturbed(lorenz.TRUE, 0.1, seed=6))
    return model, data, xs, theta


@pytest.mark.parametrize("hessian", ["exact", "limited-memory"])
def test_learner_iterates_do_not_depend_on_the_sharding(problem, hessian):
    """Fails when the shards' sums are plain floating-point sums (``split_sums``/``combine`` in
    ``ShardActor.terms`` and ``remote_learner._total``): the iterates then differ in the
    last bits between 1, 2 and 3 shards. "limited-memory" also runs the cost-only trial rounds
    (``RemoteLearner._fetch``)."""
    model, data, xs, theta = problem
    options = cc.CEEMOptions(learner=cc.LearnerOptions(hessian=hessian))
    results, rounds = [], []
    for n in (1, 2, 3):
        engine = InProcessShards(model, data, options, n)
        learner = RemoteLearner(engine, model, options.learner, hessian)
        results.append(learner.solve(theta, data, xs))
        rounds.append(engine.rounds)
    assert all(r.success for r in results)
    for r in results[1:]:
        np.testing.assert_array_equal(r.theta_vec, results[0].theta_vec)
        assert r.cost == results[0].cost and r.iterations == results[0].iterations
    assert rounds[0] > 1 and rounds == [rounds[0]] * 3
    # and it is the sequential learner's optimum (summed by CasADi in one map), up to round-off
    seq = cc.learning.Learner(model, data.lengths, options.learner).solve(theta, data, xs)
    np.testing.assert_allclose(results[0].theta_vec, seq.theta_vec, rtol=1e-10 if hessian == "exact" else 1e-8)


def test_split_sums_are_exact_for_any_split():
    """Oracle: math.fsum over all terms at once (correctly rounded); terms of mixed sign and
    magnitude, where a plain sum depends on the grouping."""
    rng = np.random.default_rng(0)
    terms = rng.standard_normal((3, 5000)) * np.exp(rng.uniform(-20, 20, (3, 5000)))
    exact = np.array([math.fsum(row) for row in terms])
    for cuts in ([], [2500], [1, 7, 4000], list(range(500, 5000, 500))):
        parts = [split_sums(block) for block in np.split(terms, cuts, axis=1)]
        np.testing.assert_array_equal(combine(parts), exact)
        np.testing.assert_array_equal(combine(parts[::-1]), exact)
    plain = [SplitSum.plain(block.sum(axis=1)) for block in np.split(terms, [2500], axis=1)]  # not exact
    np.testing.assert_allclose(combine(plain), exact, rtol=1e-12)
    # a diverging trial point's cost reaches IPOPT as inf or NaN (it then backtracks), no error
    odd = combine([split_sums(np.array([[1.0, np.inf], [np.nan, 1.0], [1e308, 1e308]]))])
    assert odd[0] == np.inf and np.isnan(odd[1]) and odd[2] == np.inf


@pytest.mark.parametrize("gradient, hessian", [("rows", True), ("summed", False), ("none", False)])
def test_stage_terms_of_a_chunked_learner_equal_the_plain_layout(problem, monkeypatch, gradient, hessian):
    """Shards of long records use the chunk-major learner layout (`ceem_casadi.learning._chunks`,
    e.g. Lorenz B = 256, T = 500: 64k stages per shard of two); their per-stage terms must sum to
    the plain layout's (padding stages add exact zeros). Fails when ``Learner.stage_terms_function``
    maps the stage Functions over the plain columns (``over_stages``) in the chunked layout."""
    from ceem_casadi.runtime import _policy as policy

    model, data, xs, theta = problem
    options = cc.LearnerOptions(hessian="exact", use_prior=False)
    plain = cc.learning.Learner(model, data.lengths, options)
    monkeypatch.setattr(policy, "LEARN_CHUNK_FROM", 100)
    monkeypatch.setattr(policy, "LEARN_CHUNK", 64)
    chunked = cc.learning.Learner(model, data.lengths, options)
    assert chunked._chunk == 64 and plain._chunk == 0
    z = theta[plain.free]
    out = []
    for learner in (plain, chunked):
        P = learner.parameter_vector(theta, data, xs, 0.0)
        res = learner.stage_terms_function(gradient, hessian)(z, P)
        res = res if isinstance(res, (list, tuple)) else [res]
        out.append([np.asarray(r, float) for r in res])
    n_stages = sum(data.lengths) - len(data.lengths)  # dynamics stages (g does not depend on theta)
    assert out[0][0].shape[1] == n_stages and out[1][0].shape[1] >= n_stages
    np.testing.assert_allclose(out[1][0].sum(axis=1), out[0][0].sum(axis=1), rtol=1e-12)
    if gradient == "summed":
        np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-12)
    # and the cost row is the learner's own objective (no trust region, no prior here)
    np.testing.assert_allclose(out[0][0][0].sum(), float(plain.cost_function(z, plain.parameter_vector(theta, data, xs, 0.0))),
                               rtol=1e-12)
