"""The shared guard (issue 32, items 4 and 8): every iterative entry point returns through
runtime/_best.py (never worse than its start, never "converged" on a non-finite or exploding
objective), all-NaN data is refused on any trajectory, and an inner time budget never extends the
deadline already in force."""
import time
from types import SimpleNamespace

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.errors import DataError
from ceem_casadi.runtime._best import EXPLODING, checked_status
from ceem_casadi.runtime._solve import current_deadline, deadline, deadline_after, expired
from ceem_casadi.workflow import FRF, fit_frf
from models import lorenz

THETA = {"sigma": 9.0, "rho": 26.0, "beta": 3.0}


@pytest.fixture(scope="module")
def lorenz_problem():
    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(3, seed=1), 40, measurement_std=0.05, seed=2)
    return model, data


# -- all-NaN data on a trajectory other than the first ------------------------------------------
ENTRY_POINTS = {
    "ceem": lambda m, d: cc.ceem(m, d, THETA),
    "refine_output_error": lambda m, d: cc.refine_output_error(m, d, THETA),
    "refine_output_error(ipopt)": lambda m, d: cc.refine_output_error(m, d, THETA,
                                                                      options=cc.OutputErrorOptions(solver="ipopt")),
    "estimate_initial_state": lambda m, d: cc.estimate_initial_state(m, d, THETA),
    "estimate_initial_state(arrays)": lambda m, d: cc.estimate_initial_state(m, list(d.y), THETA),
    "calibrate_noise": lambda m, d: cc.calibrate_noise(m, d, THETA, grid=[1.0]),
    "validation_report": lambda m, d: cc.validation_report(m, d, THETA),
    "identify": lambda m, d: cc.identify(m, d, THETA),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_an_all_nan_trajectory_after_the_first_is_refused_by_every_entry_point(lorenz_problem, entry):
    model, data = lorenz_problem
    ys = [y.copy() for y in data.y]
    ys[2][:] = np.nan  # trajectories 0 and 1 are observed: a check of trajectory 0 alone lets this through
    with pytest.raises(DataError) as info:
        ENTRY_POINTS[entry](model, cc.Trajectories(ys))
    assert str(info.value).startswith("trajectory 2: every output is missing (NaN)")


# -- per-call deadlines nest --------------------------------------------------------------------
def test_an_inner_deadline_never_extends_the_outer_one():
    outer = time.perf_counter() - 1.0  # already passed
    with deadline(outer):
        with deadline(time.perf_counter() + 1000.0):      # a generous inner budget
            assert expired() and current_deadline() == outer
        assert deadline_after(1000.0) == outer and deadline_after(None) == outer
    later = time.perf_counter() + 1000.0
    with deadline(later):
        with deadline(outer):                               # an earlier inner deadline applies
            assert expired()
        assert current_deadline() == later and not expired()  # and the outer comes back
    assert current_deadline() is None and deadline_after(5.0, start=10.0) == 15.0


@pytest.mark.parametrize("entry", ["lm", "ipopt", "estimate_initial_state", "ceem"])
def test_a_public_time_limit_inside_a_passed_deadline_stops_at_once(lorenz_problem, entry):
    model, data = lorenz_problem
    start = lorenz.perturbed(lorenz.TRUE, 0.05, seed=1)
    calls = {
        "lm": lambda: cc.refine_output_error(model, data, start, x0=np.zeros((3, 3)),
                                             options=cc.OutputErrorOptions(time_limit=1000.0)),
        "ipopt": lambda: cc.refine_output_error(model, data, start, x0=np.zeros((3, 3)),
                                                options=cc.OutputErrorOptions(solver="ipopt", time_limit=1000.0)),
        "estimate_initial_state": lambda: cc.estimate_initial_state(model, data, lorenz.TRUE, time_limit=1000.0,
                                                                    full_output=True)[0],
        "ceem": lambda: cc.ceem(model, data, start, options=cc.CEEMOptions(time_limit=1000.0, max_iters=5)),
    }
    with deadline(time.perf_counter() - 1.0):
        res = calls[entry]()
    assert res.status == cc.Status.TIME_LIMIT and res.iterations == 0


# -- convergence is not claimed on a non-finite or exploding objective ---------------------------
def test_converged_is_refused_on_a_non_finite_or_exploding_objective():
    # the exploding start of issue 32: cost 2.2e48 -> 3.8e17, a stable restart costs ~ 12
    status, reason = checked_status(cc.Status.CONVERGED, 3.8e17, reference=12.0)
    assert status == cc.Status.STALLED and "multiple shooting" in reason
    assert checked_status(cc.Status.CONVERGED, float("nan"))[0] == cc.Status.SOLVER_FAILED
    assert checked_status(cc.Status.CONVERGED, float("inf"), reference=12.0)[0] == cc.Status.SOLVER_FAILED
    assert checked_status(cc.Status.CONVERGED, 0.99 * EXPLODING * 12.0, reference=12.0) == (cc.Status.CONVERGED, "")
    assert checked_status(cc.Status.MAX_ITERS, float("nan")) == (cc.Status.MAX_ITERS, "")


# -- the entry points with their own optimisers return through BestIterate ----------------------
def test_design_input_never_returns_a_result_worse_than_its_start(monkeypatch):
    from ceem_casadi.workflow.design import _experiment_design as ed

    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
                                             params=cc.Parameters(cc.Param("a", 0.8), cc.Param("b", 1.0)),
                                             measurement_std=0.1)
    u0 = np.sign(np.sin(0.7 * np.arange(30)))[None, :, None]
    real = ed.solve

    def ends_worse(solver, **kw):  # IPOPT runs, then "returns" a constant input (no information)
        real(solver, **kw)
        return {"x": np.full_like(kw["x0"], 0.1)}

    monkeypatch.setattr(ed, "solve", ends_worse)
    design = cc.design_input(model, {"a": 0.8, "b": 1.0}, 30, u_bounds=(-1.0, 1.0), starts=u0, x0=np.zeros(1))
    np.testing.assert_array_equal(design.u, u0[0])          # the start, not the worse final iterate
    assert design.value == design.starts[0]["initial"]


def _frf():
    f = np.arange(1, 40) / 128
    zi = np.exp(-2j * np.pi * f)
    G = (0.3 * zi) / (1 - 1.6 * zi + 0.9 * zi ** 2) + 0.01 * np.sin(np.arange(39))
    return FRF(f, np.arange(1, 40), G, np.full(39, 1e-3), np.full(39, np.nan), 128, 2, 1, 1.0)


def test_fit_frf_never_returns_a_result_worse_than_its_starts(monkeypatch):
    import scipy.optimize  # fit_frf imports least_squares from it on each call

    def stays(fun, x0, **kw):
        return SimpleNamespace(x=np.array(x0, float), fun=fun(x0))

    def ends_worse(fun, x0, **kw):
        bad = np.asarray(x0, float) + 0.5
        return SimpleNamespace(x=bad, fun=fun(bad))

    monkeypatch.setattr(scipy.optimize, "least_squares", stays)
    at_starts = fit_frf(_frf(), 2, feedthrough=False)
    monkeypatch.setattr(scipy.optimize, "least_squares", ends_worse)
    guarded = fit_frf(_frf(), 2, feedthrough=False)
    assert guarded.cost == at_starts.cost
    np.testing.assert_array_equal(guarded.a, at_starts.a)
