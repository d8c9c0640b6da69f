"""Status type and the CE-EM time budget (issue 14, item 4)."""
import json
import time

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.runtime import _solve as _ipopt
from models import lorenz


@pytest.fixture(scope="module")
def lorenz_fit():
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=10), 64, measurement_std=0.01, seed=11)
    return model, data, lorenz.perturbed(lorenz.TRUE, 0.1, seed=5)


def test_status_is_a_string_with_advice():
    assert cc.Status.CONVERGED == "converged" and f"{cc.Status.TIME_LIMIT}" == "time_limit"
    assert json.dumps({"s": cc.Status.STALLED}) == '{"s": "stalled"}'
    assert all(len(s.advice) > 20 for s in cc.Status)
    assert cc.Status.from_ipopt("Solve_Succeeded") is cc.Status.CONVERGED
    assert cc.Status.from_ipopt("User_Requested_Stop", time_up=True) is cc.Status.TIME_LIMIT
    assert cc.Status.from_ipopt("Search_Direction_Becomes_Too_Small") is cc.Status.STALLED
    assert cc.Status.from_ipopt("Restoration_Failed") is cc.Status.SOLVER_FAILED


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "10", True])
def test_time_limit_is_validated(bad):
    with pytest.raises(ValueError, match="time_limit"):
        cc.CEEMOptions(time_limit=bad)


def test_deadline_stops_a_running_ipopt_solve(lorenz_fit):
    model, data, theta0 = lorenz_fit
    xs = list(cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=10), 64)[1])
    learner = cc.learning.Learner(model, data.lengths)
    free = learner.solve(model.theta_vector(theta0), data, xs)
    assert free.status == "Solve_Succeeded" and free.iterations > 1
    with _ipopt.deadline(time.perf_counter()):
        stopped = learner.solve(model.theta_vector(theta0), data, xs)
    assert stopped.status == "User_Requested_Stop" and stopped.iterations <= 1
    assert _ipopt.current_deadline() is None  # the context restored "no deadline"


def test_time_limit_spent_before_the_first_iteration_returns_theta0(lorenz_fit):
    model, data, theta0 = lorenz_fit
    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=50, time_limit=1e-6))
    assert res.status == cc.Status.TIME_LIMIT and res.iterations == 0 and res.success
    assert all(np.array_equal(res.theta[k], theta0[k]) for k in theta0) and res.J == res.init_J


def test_time_limit_between_iterations_keeps_the_last_accepted_iterate(lorenz_fit):
    """Iteration 1's callback sleeps past the deadline: the loop stops before iteration 2."""
    model, data, theta0 = lorenz_fit

    def sleep_past_deadline(rec):
        time.sleep(max(0.0, _ipopt.current_deadline() - time.perf_counter() + 0.01))

    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=50, tol=0.0, time_limit=2.0),
                  callback=sleep_past_deadline)
    assert res.status == "time_limit" and res.success, res.message
    assert res.iterations == 1  # iteration 1 had 2 s minus the build time (~0.2 s)
    last = res.history[-1]
    assert np.isfinite(res.J) and res.J == last.J and res.J > res.init_J
    assert all(np.array_equal(res.theta[k], last.theta[k]) for k in theta0)


class _LearnerExpiringAt(cc.learning.Learner):
    """A learner whose ``n``-th solve starts exactly at the deadline (time runs out inside it)."""

    def __init__(self, *args, n=2, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.n = 0, n

    def solve(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.n:
            with _ipopt.deadline(time.perf_counter()):
                return super().solve(*args, **kwargs)
        return super().solve(*args, **kwargs)


def test_time_limit_inside_a_solve_discards_the_interrupted_step(lorenz_fit):
    model, data, theta0 = lorenz_fit
    learner = _LearnerExpiringAt(model, data.lengths, n=2)
    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=50, tol=0.0, time_limit=600.0),
                  learner=learner)
    assert res.status == cc.Status.TIME_LIMIT and "learning step" in res.message, res.message
    assert res.iterations == 1 and learner.calls == 2
    assert res.J == res.history[-1].J
    assert all(np.array_equal(res.theta[k], res.history[-1].theta[k]) for k in theta0)
    assert _ipopt.current_deadline() is None


def test_ctrl_c_during_an_ipopt_solve_stops_it_and_raises_keyboard_interrupt():
    """CasADi swallows a KeyboardInterrupt raised inside IPOPT's Python callbacks; _ipopt.solve
    turns SIGINT into a flag that stops the solve, then raises KeyboardInterrupt after it."""
    import os
    import signal
    import threading

    import casadi as ca

    n = 2000
    x = ca.MX.sym("x", n)
    solver = ca.nlpsol("s", "ipopt", {"x": x, "f": ca.sumsqr(ca.sin(x) - 0.5) + ca.sumsqr(x[1:] - x[:-1] ** 2)},
                       _ipopt.ipopt_options(100000, 1e-30))
    def interrupt_once_ipopt_runs():  # not at a fixed 0.2 s: on a loaded machine that fell before the solve
        t_end = time.perf_counter() + 30
        while signal.getsignal(signal.SIGINT) is signal.default_int_handler and time.perf_counter() < t_end:
            time.sleep(0.005)
        time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_ipopt_runs, daemon=True).start()
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        while time.perf_counter() - t0 < 30:
            _ipopt.solve(solver, x0=np.full(n, 3.0))
    # IPOPT was stopped by the flag (not run to its end and the interrupt raised afterwards)
    assert solver.stats()["return_status"] == "User_Requested_Stop" and not _ipopt.interrupted()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("acceleration", ["none", "newton"])
def test_deadline_passed_after_iteration_1_stops_before_any_further_step(lorenz_fit, monkeypatch, acceleration):
    """The deadline is made to pass during iteration 1's callback (no sleeping): no further step
    is taken, not even a joint Gauss-Newton step, which no IPOPT deadline would interrupt."""
    model, data, theta0 = lorenz_fit
    passed = []
    from ceem_casadi.em import _ceem

    for module in (_ipopt, _ceem):  # the IPOPT callback's and the EM loop's view of the deadline
        monkeypatch.setattr(module, "expired", lambda: bool(passed))
    res = cc.ceem(model, data, theta0, callback=lambda rec: passed.append(rec.iteration),
                  options=cc.CEEMOptions(max_iters=5, tol=0.0, time_limit=1e3, acceleration=acceleration))
    assert res.status == "time_limit" and res.iterations == 1 and "after 1 iterations" in res.message
