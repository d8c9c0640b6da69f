"""The CE-EM loop's acceptance logic and accelerations, made to face the cases they exist for:
a step that lowers J (injected), a SQUAREM extrapolation, a joint Newton step."""
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.ceem import _EMRun, _Iterate
from models import lorenz


@pytest.fixture(scope="module")
def problem():
    """Single Lorenz, 2 trajectories of 64 steps, shared prebuilt solvers (built once here)."""
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=10), 64, measurement_std=0.01, seed=11)
    smoother = cc.Smoother(model)
    learner = cc.Learner(model, data.lengths, stages=smoother.stages)
    theta0 = lorenz.perturbed(lorenz.TRUE, 0.1, seed=5)
    return model, data, theta0, dict(smoother=smoother, learner=learner)


def run(problem, **options):
    model, data, theta0, solvers = problem
    return cc.ceem(model, data, theta0, options=cc.CEEMOptions(**options), **solvers)


def thetas(result):
    return np.array([[float(r.theta[k]) for k in lorenz.TRUE] for r in result.history])


def test_step_that_lowers_J_is_rejected_kept_out_and_reported(problem, monkeypatch):
    """The third learning step is replaced by one that moves sigma 30 % away (J drops by orders of
    magnitude): the loop must not take it, must keep the second iterate and must say so."""
    original = cc.Learner.solve
    calls = []

    def sabotaged(self, theta_vec, data, xs, *args, **kwargs):
        res = original(self, theta_vec, data, xs, *args, **kwargs)
        calls.append(res.theta_vec.copy())
        if len(calls) == 3:
            res.theta_vec = res.theta_vec * np.array([1.3, 1.0, 1.0])
        return res

    monkeypatch.setattr(cc.Learner, "solve", sabotaged)
    res = run(problem, max_iters=6, tol=0.0)
    assert len(res.history) == 3, [(r.kind, r.accepted) for r in res.history]
    good, bad = res.history[1], res.history[2]
    assert good.accepted and not bad.accepted
    assert bad.objective < good.objective and bad.decrease < 0
    # the rejected step is not taken: the result is the last good iterate
    for k in lorenz.TRUE:
        np.testing.assert_array_equal(res.theta[k], good.theta[k])
    assert res.J == good.J
    # ... and reported
    assert res.status == cc.Status.STALLED and not res.success
    assert "iteration 3" in res.message and "lowered the objective" in res.message


def test_rejected_extrapolation_is_not_taken(problem, monkeypatch):
    """A SQUAREM point far from the iterates lowers J: recorded as rejected, the loop carries on
    from the plain EM iterate exactly as acceleration="none" does."""
    def bad_point(self, it0, it1, it2):
        return _Iterate([3.0 * x for x in it2.xs], it2.theta_vec * np.array([1.5, 0.6, 1.4]), np.nan, -np.inf)

    monkeypatch.setattr(_EMRun, "extrapolate", bad_point)
    sq = run(problem, max_iters=5, tol=0.0, acceleration="squarem")
    plain = run(problem, max_iters=4, tol=0.0)
    kinds = [(r.kind, r.accepted) for r in sq.history]
    assert kinds[2] == ("extrapolated", False), kinds
    assert sq.history[2].objective < sq.history[1].objective
    # the accepted iterates are exactly those of plain EM
    accepted = np.array([[float(r.theta[k]) for k in lorenz.TRUE] for r in sq.history if r.accepted])
    np.testing.assert_allclose(accepted, thetas(plain), rtol=1e-10)


def test_no_acceleration_takes_only_plain_em_steps(problem):
    res = run(problem, max_iters=4, tol=0.0)
    assert [(r.kind, r.accepted) for r in res.history] == [("em", True)] * 4


@pytest.mark.parametrize("acceleration,kind", [("squarem", "extrapolated"), ("newton", "newton")])
def test_acceleration_steps_are_taken_and_change_the_iterates(problem, acceleration, kind):
    """Same problem, same number of iterations: the accelerated run takes accepted steps of its own
    kind, its iterates leave plain EM's path after the first (SQUAREM: second) plain step and it
    ends at a higher objective, closer to the fixed point plain EM approaches."""
    plain = run(problem, max_iters=8, tol=0.0)
    fast = run(problem, max_iters=8, tol=0.0, acceleration=acceleration)
    kinds = [r.kind for r in fast.history]
    taken = [i for i, r in enumerate(fast.history) if r.kind == kind and r.accepted]
    assert taken, kinds
    n_plain = 2 if acceleration == "squarem" else 1  # SQUAREM extrapolates after two EM steps
    assert kinds[:n_plain] == ["em"] * n_plain and taken[0] == n_plain
    tp, tf = thetas(plain), thetas(fast)
    np.testing.assert_allclose(tf[:n_plain], tp[:n_plain], rtol=1e-10)  # identical until the first jump
    assert np.abs(tf[n_plain] - tp[n_plain]).max() > 1e-3                 # the jump changes theta
    # every taken accelerated step raises the objective over the iterate it started from
    obj = [fast.init_J] + [r.objective for r in fast.history]
    for i in taken:
        assert obj[i + 1] > obj[i]
    # the accelerated run is further along after the same number of iterations
    assert fast.history[-1].objective > plain.history[-1].objective + 0.1
    converged = run(problem, max_iters=200, tol=1e-12, acceleration="newton")
    err = lambda r: max(abs(float(r.theta[k]) - float(converged.theta[k])) for k in lorenz.TRUE)  # noqa: E731
    assert err(fast) < 0.5 * err(plain)
    for k in lorenz.TRUE:
        np.testing.assert_array_equal(fast.theta[k], fast.history[-1].theta[k])
