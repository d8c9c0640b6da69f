"""Batched smoothing of many short trajectories (ceem_casadi/smoothing/_batched.py, batched_newton.py)
reaches the IPOPT smoother's optimum, trajectory by trajectory, with the banded solver's statuses."""
from __future__ import annotations

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.objective import StageFunctions
from ceem_casadi.runtime import _solve as _ipopt
from ceem_casadi.runtime._policy import BATCHED_MIN_TRAJECTORIES
from ceem_casadi.smoothing._banded import BandedNewton
from ceem_casadi.smoothing._batched import BatchedSmoother, any_batched, batched_default
from ceem_casadi.smoothing._batched_newton import stacked_directions
from ceem_casadi.smoothing._smoother import Smoother, TrajectorySmoother
from models import lorenz


def _single(B, T, seed=4):
    model = lorenz.single_lorenz(process_std=0.1, measurement_std=0.5).with_noise(x1_mean=[0, 0, 20], x1_std=5)
    data, xt = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(B, seed=seed), T, process_std=0.1,
                           measurement_std=0.5, seed=seed)
    return model, model.theta_vector(lorenz.TRUE), data.with_missing(0.05, seed=seed), xt


def _six(B, T, seed=2):
    truth, C = lorenz.coupled_truth(6, seed=0)
    model = lorenz.coupled_lorenz(6, C, process_std=0.01, measurement_std=0.01)
    model = model.with_noise(x1_mean=np.tile([-6.0, -6.0, 24.0], 6), x1_std=2.5)
    data, xt = cc.simulate(model, truth, lorenz.initial_states(B, 6, seed=seed), T, measurement_std=0.01,
                           process_std=0.01, seed=seed)
    return model, model.theta_vector(truth), data, xt


def _starts(xt, scale, seed=1):
    rng = np.random.default_rng(seed)
    return [x + scale * rng.standard_normal(x.shape) for x in xt]


@pytest.mark.parametrize("make, B, T, hessian, noise", [(_single, 5, 60, "gauss-newton", 0.3),
                                                         (_single, 4, 40, "exact", 0.3),
                                                         (_six, 2, 20, "gauss-newton", 0.02)])
def test_batched_equals_ipopt(make, B, T, hessian, noise):
    """Lorenz (missing outputs, x_1 prior) and six coupled Lorenz, trust region rho_x = 0.3: every
    trajectory's states and cost equal the IPOPT smoother's to 1e-8 (relative), both succeed."""
    model, theta, data, xt = make(B, T)
    x0 = _starts(xt, noise)
    stages = StageFunctions(model, hessian, compile=False)
    ip = TrajectorySmoother(stages, T, cc.SmootherOptions(solver="ipopt", hessian=hessian, tol=1e-10))
    bs = BatchedSmoother(stages, T, cc.SmootherOptions(solver="batched", hessian=hessian, tol=1e-10))
    us = [data.inputs(b) for b in range(B)]
    got = bs.solve(model, theta, list(data.y), us, x0, 0.3)
    for b in range(B):
        ref = ip.solve(model, theta, data.y[b], us[b], x0[b], 0.3)
        assert ref.success and got[b].success and got[b].status in ("Solve_Succeeded", "Solved_To_Acceptable_Level")
        np.testing.assert_allclose(got[b].x, ref.x, rtol=0, atol=1e-8 * np.abs(ref.x).max())
        assert got[b].cost == pytest.approx(ref.cost, rel=1e-8)


def test_batched_equals_banded_per_trajectory_with_shifts_and_failures():
    """Exact Hessian from far starts (indefinite: the Levenberg-Marquardt shift, the line search and a
    failed stacked factorisation are needed), one start with a NaN and a batch size of 2 (three
    batches): each trajectory's outcome equals BandedNewton.solve on it alone (same status,
    iterations, largest shift; states to 1e-9), and the NaN start fails alone."""
    B, T = 5, 50
    model, theta, data, xt = _single(B, T, seed=3)
    x0 = [np.tile(c, (T, 1)) for c in ([10.0, -10.0, 0.0], [-8.0, 8.0, 30.0], [1.0, 1.0, 1.0],
                                       [10.0, -10.0, 0.0], [0.0, 0.0, 0.0])]
    x0[3] = x0[3].copy()
    x0[3][7, 2] = np.nan
    stages = StageFunctions(model, "exact", compile=False)
    opts = cc.SmootherOptions(solver="batched", hessian="exact")
    bs = BatchedSmoother(stages, T, opts)
    bs.batch = 2
    us = [data.inputs(b) for b in range(B)]
    got = bs.solve(model, theta, list(data.y), us, x0)
    one = TrajectorySmoother(stages, T, opts)
    shifted = 0
    for b in range(B):
        P = one.parameter_vector(model, theta, data.y[b], us[b], x0[b], opts.rho_x)
        ref = one._newton.solve(x0[b].ravel(), one._objective.bind(P))
        assert got[b].status == ref.status and got[b].iterations == ref.iterations
        if b == 3:
            assert ref.status == "Invalid_Number_Detected" and not got[b].success
            continue
        assert got[b].success
        np.testing.assert_allclose(got[b].x.ravel(), ref.x, rtol=0, atol=1e-9 * np.abs(ref.x).max())
        shifted += ref.max_shift > 0
    assert shifted >= 2


def test_stacked_directions_equal_single_solves():
    """One stacked factorisation == BandedNewton.direction system by system, an indefinite system
    in the middle is reported as None and does not spoil the others."""
    nx, T, m = 3, 7, 4
    rng = np.random.default_rng(0)
    k = nx * nx + nx * (nx + 1) // 2
    reqs = []
    for i in range(m):
        nz = 0.1 * rng.standard_normal((T, k))
        nz[:, [nx + sum(nx + 1 + j for j in range(jj)) + jj for jj in range(nx)]] += 3.0  # diagonal
        reqs.append((nz, rng.uniform(0, 1, nx), rng.standard_normal(nx * T), 0.5 * i))
    bad = reqs[1][0].copy()
    bad[4, nx] = -50.0  # a negative diagonal entry
    reqs[1] = (bad, *reqs[1][1:])
    got = stacked_directions(reqs, nx, T)
    single = BandedNewton(nx, T, 10, 1e-8)
    for i, (r, d) in enumerate(zip(reqs, got)):
        ref = single.direction(*r)
        if i == 1:
            assert ref is None and d is None
        else:
            np.testing.assert_allclose(d, ref, rtol=1e-12, atol=1e-14)


def test_default_choice_and_options():
    """solver=None batches >= BATCHED_MIN_TRAJECTORIES trajectories of a length below the
    long-record threshold without bounds; solver='batched' with bounds is refused."""
    opts = cc.SmootherOptions()
    assert batched_default(opts, 500, BATCHED_MIN_TRAJECTORIES)
    assert BATCHED_MIN_TRAJECTORIES == 1 or not batched_default(opts, 500, BATCHED_MIN_TRAJECTORIES - 1)
    assert not batched_default(opts, 20_000, 10) and not batched_default(cc.SmootherOptions(x_lower=-1), 50, 10)
    assert batched_default(cc.SmootherOptions(solver="batched"), 50, 1)
    assert not batched_default(cc.SmootherOptions(solver="ipopt"), 50, 10)
    assert any_batched(opts, [50, 60, 50]) and not any_batched(cc.SmootherOptions(x_lower=-1), [50, 50])
    with pytest.raises(cc.OptionsError, match="without state bounds"):
        cc.SmootherOptions(solver="batched", x_lower=-3.0)


def test_smoother_batches_lengths_and_keeps_order():
    """Smoother.solve on lengths (30, 20, 30, 30): the three of length 30 are batched, the one of
    length 20 is a batch of one, results in data order and equal to IPOPT's; with the library's
    deadline expired every trajectory stops at once."""
    model = lorenz.single_lorenz(process_std=0.1, measurement_std=0.5)
    data, xt = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(4, seed=1), [30, 20, 30, 30],
                           process_std=0.1, measurement_std=0.5, seed=1)
    theta = model.theta_vector(lorenz.TRUE)
    x0 = _starts(xt, 0.2)
    sm = Smoother(model, cc.SmootherOptions(compile=False, tol=1e-10, rho_x=0.1))
    ref = Smoother(model, cc.SmootherOptions(compile=False, tol=1e-10, rho_x=0.1, solver="ipopt"))
    got, want = sm.solve(theta, data, x0), ref.solve(theta, data, x0)
    assert sorted(sm._batched) == [20, 30]
    for g, w in zip(got, want, strict=True):
        assert g.success and g.x.shape == w.x.shape
        np.testing.assert_allclose(g.x, w.x, rtol=0, atol=1e-8 * np.abs(w.x).max())
    with _ipopt.deadline(0.0):
        stopped = sm.solve(theta, data, x0)
    assert [r.status for r in stopped] == ["User_Requested_Stop"] * 4


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_ceem_default_batched_equals_ipopt(n_jobs):
    """A CE-EM fit of four trajectories with the default (batched) smoother, sequential and in two
    processes (one shard each), equals the fit with the IPOPT smoother."""
    model = lorenz.single_lorenz(process_std=0.05, measurement_std=0.1)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(4, seed=1), 60, measurement_std=0.1,
                          process_std=0.05, seed=2)
    theta0 = lorenz.perturbed(lorenz.TRUE, 0.05, seed=3)
    fits = [cc.ceem(model, data, theta0, options=cc.CEEMOptions(
        max_iters=4, n_jobs=n_jobs, smoother=cc.SmootherOptions(solver=s, compile=False, tol=1e-10)))
        for s in ("ipopt", None)]
    assert fits[0].iterations == fits[1].iterations
    np.testing.assert_allclose(model.theta_vector(fits[1].theta), model.theta_vector(fits[0].theta), rtol=1e-8)
    assert fits[1].J == pytest.approx(fits[0].J, rel=1e-10)


def test_joint_log_density_batched_equals_one_by_one():
    """Smoother.joint_log_density with the batched costs (lengths 25, 25, 25, 18; missing outputs,
    x_1 prior) == the IPOPT smoother's per-trajectory cost Functions."""
    model = lorenz.single_lorenz(process_std=0.1, measurement_std=0.5).with_noise(x1_mean=[0, 0, 20], x1_std=5)
    data, xt = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(4, seed=2), [25, 25, 25, 18],
                           process_std=0.1, measurement_std=0.5, seed=2)
    data = data.with_missing(0.1, seed=3)
    theta = model.theta_vector(lorenz.perturbed(lorenz.TRUE, 0.1, seed=1))
    xs = _starts(xt, 0.5)
    sm = Smoother(model, cc.SmootherOptions(compile=False))
    ref = Smoother(model, cc.SmootherOptions(compile=False, solver="ipopt"))
    assert sm.joint_log_density(theta, data, xs) == pytest.approx(ref.joint_log_density(theta, data, xs), rel=1e-13)
    assert sorted(sm._batched) == [18, 25] and not sm._solvers


def test_one_mapped_evaluation_per_newton_step(monkeypatch):
    """Full Newton steps (Gauss-Newton, near the optimum): the trial point of each step is
    evaluated with its derivatives and reused, so k steps cost k + 1 mapped evaluations for the
    whole batch and no separate cost calls; without that (speculate = False) the outcome is the
    same with k more cost calls."""
    from ceem_casadi.smoothing import _batched as batched_smoother

    B, T = 4, 40
    model, theta, data, xt = _single(B, T)
    x0 = _starts(xt, 0.05)
    us = [data.inputs(b) for b in range(B)]
    calls = {"evaluate": 0, "cost": 0}
    evaluate, functions = batched_smoother.BatchObjective._evaluate, batched_smoother.BatchObjective.functions

    def counted_evaluate(self, idx, xs):
        calls["evaluate"] += 1
        return evaluate(self, idx, xs)

    class CountedCost:
        def __init__(self, call):
            self.call = call

        def __call__(self, *args):
            calls["cost"] += 1
            return self.call(*args)

    monkeypatch.setattr(batched_smoother.BatchObjective, "_evaluate", counted_evaluate)
    monkeypatch.setattr(batched_smoother.BatchObjective, "functions",
                        lambda self, n: (functions(self, n)[0], CountedCost(functions(self, n)[1])))
    outs = {}
    for speculate in (True, False):
        bs = BatchedSmoother(StageFunctions(model, compile=False), T, cc.SmootherOptions(solver="batched"))
        bs.objective.speculate = speculate
        calls.update(evaluate=0, cost=0)
        outs[speculate] = (bs.solve(model, theta, list(data.y), us, x0), dict(calls))
    (fast, c_fast), (slow, c_slow) = outs[True], outs[False]
    k = max(r.iterations for r in fast)
    assert all(r.status == "Solve_Succeeded" for r in fast) and k >= 2
    assert c_fast == {"evaluate": k + 1, "cost": 0}
    assert c_slow == {"evaluate": k + 1, "cost": k}
    for a, b in zip(fast, slow):
        assert a.iterations == b.iterations
        np.testing.assert_allclose(a.x, b.x, rtol=0, atol=1e-12 * np.abs(b.x).max())


class _Flat:
    """f constant at 1e3, gradient stuck at 1e-3 > the acceptable tolerance, Hessian 1e6 I: Newton
    steps of 1e-9 that predict a decrease of 2.5e-12 and change f below round-off."""

    def cost_many(self, idx, xs):
        return [1e3] * len(idx)

    def newton_many(self, idx, xs):
        nz = np.tile([0.0, 1e6], (5, 1))
        return [(1e3, np.full(5, 1e-3), nz, np.zeros(1)) for _ in idx]


def test_stalled_objective_stops_after_stall_stop_steps():
    """The flat objective with a tolerance (1e-11) whose Newton-decrement threshold (1e-18 |f|) is
    below the predicted decrease: it ends after STALL_STOP steps as Search_Direction_Becomes_Too_Small
    (usable), for every problem of a batch, instead of running to max_iter."""
    from ceem_casadi.smoothing._banded import STALL_STOP
    from ceem_casadi.smoothing._batched_newton import solve_many

    out = solve_many(BandedNewton(1, 5, 100, 1e-11), [np.zeros(5)] * 2, _Flat())
    assert [(o.status, o.iterations) for o in out] == [("Search_Direction_Becomes_Too_Small", STALL_STOP)] * 2


def test_newton_decrement_below_round_off_stops_at_once():
    """The flat objective at the default tolerance 1e-8: the predicted decrease 2.5e-12 is below
    1e-12 |f|, so every problem of the batch stops at once (no step, no line search) as converged."""
    from ceem_casadi.smoothing._batched_newton import solve_many

    out = solve_many(BandedNewton(1, 5, 100, 1e-8), [np.zeros(5)] * 2, _Flat())
    assert [(o.status, o.iterations) for o in out] == [("Solve_Succeeded", 0)] * 2


def test_calls_are_built_for_at_most_per_call_trajectories(monkeypatch):
    """A batch of 7 trajectories with CALL_COLUMNS = 3 T: the mapped Functions exist only for
    1, 2 and 3 trajectories (never 4 or 7: their build time grows with the columns, and forked
    workers pay it again), and every trajectory's states equal the per-trajectory banded
    solver's to 1e-10."""
    from ceem_casadi.runtime import _policy as policy

    B, T = 7, 30
    model, theta, data, xt = _single(B, T)
    monkeypatch.setattr(policy, "CALL_COLUMNS", 3 * T)
    stages = StageFunctions(model, compile=False)
    bs = BatchedSmoother(stages, T, cc.SmootherOptions(solver="batched", tol=1e-10))
    x0, us = _starts(xt, 0.3), [data.inputs(b) for b in range(B)]
    got = bs.solve(model, theta, list(data.y), us, x0, 0.3)
    assert set(bs.objective._calls) <= {1, 2, 3} and 3 in bs.objective._calls
    ref = TrajectorySmoother(stages, T, cc.SmootherOptions(solver="banded", tol=1e-10))
    for b in range(B):
        r = ref.solve(model, theta, data.y[b], us[b], x0[b], 0.3)
        np.testing.assert_allclose(got[b].x, r.x, rtol=0, atol=1e-10 * np.abs(r.x).max())
