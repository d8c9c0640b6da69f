"""The solve layer (issue 23, item 4): a deadline per thread, best-iterate tracking, and
refine_output_error never returning worse than its start or than the best iterate seen (bugs 1, 2)."""
import sys
import threading
import time
from pathlib import Path

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.runtime import _solve
from ceem_casadi.runtime._best import BestIterate

sys.path.insert(0, str(Path(__file__).parent))
from test_output_error import START, _data, pendulum

IPOPT = cc.OutputErrorOptions(solver="ipopt")  # these tests drive IPOPT's iterates (the default is the LM engine)


def _rosenbrock_solver(n=50):
    x = ca.MX.sym("x", n)
    f = ca.sumsqr(1 - x[:-1]) + 100 * ca.sumsqr(x[1:] - x[:-1] ** 2)
    return _solve.ipopt_solver("rosen", {"x": x, "f": f}, _solve.ipopt_options(500, 1e-10, track=(n, 0))), n


def test_overlapping_deadlines_in_two_threads_leave_no_deadline_behind():
    """Bug 1: thread A enters a deadline, thread B enters another, A leaves, B leaves. With one
    module-level deadline, B restored A's value: every later solve stopped at once."""
    n = 50
    x = ca.MX.sym("x", n)
    solver = ca.nlpsol("rosen", "ipopt", {"x": x, "f": ca.sumsqr(1 - x[:-1]) + 100 * ca.sumsqr(x[1:] - x[:-1] ** 2)},
                       _solve.ipopt_options(500, 1e-10))
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def thread_a():
        with _solve.deadline(time.perf_counter() - 1.0):  # already passed
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def thread_b():
        a_in.wait(5)
        with _solve.deadline(time.perf_counter() + 600.0):
            b_in.set()
            a_out.wait(5)
            # A's passed deadline is not B's: B's solve runs to the optimum
            _solve.solve(solver, x0=np.zeros(n))
            seen["b"] = solver.stats()["return_status"]

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen["b"] == "Solve_Succeeded"
    _solve.solve(solver, x0=np.zeros(n))
    assert solver.stats()["return_status"] == "Solve_Succeeded"  # no deadline left behind
    assert _solve.current_deadline() is None


def _status(solver):
    return cc.Status.from_ipopt(solver.stats()["return_status"], time_up=_solve.expired())


def test_a_per_call_deadline_stops_only_that_call():
    solver, n = _rosenbrock_solver()
    _solve.solve(solver, x0=np.zeros(n), expires=time.perf_counter())
    assert _status(solver) is cc.Status.STOPPED  # the deadline of the call is gone after it
    assert solver.stats()["iter_count"] <= 1
    with _solve.deadline(time.perf_counter()):
        _solve.solve(solver, x0=np.zeros(n))
        assert _status(solver) is cc.Status.TIME_LIMIT
    _solve.solve(solver, x0=np.zeros(n))
    assert _status(solver) is cc.Status.CONVERGED


def test_tracking_callback_keeps_the_lowest_objective_iterate_ipopt_visited():
    solver, n = _rosenbrock_solver()
    x = ca.MX.sym("x", n)
    f = ca.Function("f", [x], [ca.sumsqr(1 - x[:-1]) + 100 * ca.sumsqr(x[1:] - x[:-1] ** 2)])
    x0 = np.full(n, -1.0)
    best = BestIterate(x0, float(f(x0)))
    sol = _solve.solve(solver, x0=x0, best=best, lbx=-np.inf, ubx=np.inf)
    assert best.offered == solver.stats()["iter_count"] + 1  # iteration 0 included
    # the tracked objective is the true objective of the tracked iterate (an independent evaluation)
    assert best.f == pytest.approx(float(f(best.x)), rel=1e-12)
    assert best.f == pytest.approx(float(sol["f"]), abs=1e-12)


def test_best_iterate_rules():
    best = BestIterate(np.zeros(2), 5.0, feasibility_tol=1e-6)
    assert not best.offer(np.ones(2), 1.0, violation=1e-3)  # infeasible: not kept
    assert not best.offer(np.ones(2), np.nan)
    assert best.offer(np.ones(2), 2.0, label="step 3") and best.label == "step 3"
    x, f, msg = best.choose(np.full(2, 7.0), 4.0)
    assert f == 2.0 and np.array_equal(x, np.ones(2)) and "best iterate seen (step 3" in msg
    x, f, msg = best.choose(np.full(2, 7.0), 1.0)
    assert f == 1.0 and msg == "returning the final iterate"
    fresh = BestIterate(np.zeros(2), 5.0)
    x, f, msg = fresh.choose(np.full(2, np.nan), 1.0)
    assert f == 5.0 and "starting point (no iterate improved" in msg


class _WorseFinal:
    """Wraps a cached IPOPT solver: the real solve runs (its iterates are tracked), then its
    final iterate is replaced by ``final(x)`` -- what IPOPT held when stopped on time (bug 2:
    cost 1.7e5 -> 2.2e11) or a failed, non-finite iterate."""

    def __init__(self, solver, final, status):
        self.solver, self.final, self.status = solver, final, status

    def __call__(self, **kw):
        out = dict(self.solver(**kw))
        out["x"] = self.final(np.asarray(out["x"], float).ravel())
        return out

    def stats(self):
        return {**self.solver.stats(), "return_status": self.status}


@pytest.mark.parametrize("status, final, expected", [
    ("User_Requested_Stop", lambda x: x * 50.0, cc.Status.STOPPED),
    ("Restoration_Failed", lambda x: x * np.nan, cc.Status.SOLVER_FAILED),
])
def test_output_error_returns_the_best_iterate_seen_not_the_final_or_the_start(monkeypatch, status, final, expected):
    from ceem_casadi.workflow.output_error import _output_error as oe

    model = pendulum()
    data = _data(model, T=60, noise=0.05, seed=3)
    reference = cc.refine_output_error(model, data, START, options=IPOPT)  # also builds the cached problem
    prob = oe.problem_for(model, data.lengths, None, IPOPT)
    monkeypatch.setattr(prob, "solver", _WorseFinal(prob.solver, final, status))
    res = cc.refine_output_error(model, data, START, options=IPOPT)
    assert res.status is expected
    # progress kept: far below the start (the old code returned the start on solver_failed) and at
    # the converged optimum's cost (the best IPOPT iterate is its last one here)
    assert res.cost < 0.1 * res.initial_cost
    assert res.cost == pytest.approx(reference.cost, rel=1e-8)
    assert "returning the best iterate seen (IPOPT iteration" in res.message, res.message
    # the reported cost is the objective at the returned theta and x0 (independent evaluation)
    res2 = cc.refine_output_error(model, data, res.theta, x0=res.x0,
                                  options=cc.OutputErrorOptions(solver="ipopt", max_iters=1))
    assert res2.initial_cost == pytest.approx(res.cost, rel=1e-9)


def test_output_error_stopped_on_an_infeasible_shooting_iterate_returns_a_feasible_one():
    """Multiple shooting stopped after 2 iterations: IPOPT's iterate breaks continuity by ~0.6
    (the old code returned it as the estimate). What comes back is continuous and below the
    start: IPOPT's parameters and initial states with the nodes re-simulated from them."""
    model = pendulum()
    data = _data(model, T=60, noise=0.05, seed=3)
    start = {"a": 0.5, "b": 1.0, "c": 0.2}
    res = cc.refine_output_error(model, data, start, shooting=7, options=cc.OutputErrorOptions(solver="ipopt", max_iters=2))
    assert res.status == "max_iters"
    assert res.constraint_violation <= 1e-6 and res.cost < 0.5 * res.initial_cost
    assert "violates the constraints" in res.message and "re-simulated" in res.message, res.message
    # continuous: its cost is the single-shooting (free-run) cost at its theta and x0
    single = cc.refine_output_error(model, data, res.theta, x0=res.x0, options=cc.OutputErrorOptions(solver="ipopt", max_iters=1))
    assert single.initial_cost == pytest.approx(res.cost, rel=1e-9)


def test_the_best_iterate_is_kept_inside_the_bounds(monkeypatch):
    """IPOPT's intermediate iterates may lie outside the bounds by its bound relaxation (~1e-8):
    the best iterate returned after a stop is inside them (found on Cascaded Tanks: a returned
    theta with b2 = -1e-8 < 0 that every later call refused)."""
    from ceem_casadi.workflow.output_error import _output_error as oe

    data = _data(pendulum(), T=60, noise=0.05, seed=3)
    model = pendulum(a={"upper": 1.9})  # the optimum (a near 2) sits on the upper bound
    cc.refine_output_error(model, data, START, options=IPOPT)
    prob = oe.problem_for(model, data.lengths, None, IPOPT)
    monkeypatch.setattr(prob, "solver", _WorseFinal(prob.solver, lambda x: x * np.nan, "Restoration_Failed"))
    res = cc.refine_output_error(model, data, START, options=IPOPT)
    assert "best iterate seen" in res.message, res.message
    assert float(res.theta["a"]) <= 1.9 and float(res.theta["a"]) > 1.89
    model.params.validate(res.theta)  # inside every bound
    best = BestIterate(np.zeros(2), 1.0, lower=[-1.0, 0.0], upper=[1.0, 1.0])
    assert best.offer(np.array([-1.0 - 1e-8, 0.5]), 0.5) and best.x[0] == -1.0
