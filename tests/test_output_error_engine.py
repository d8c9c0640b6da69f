"""The output-error engine (issue 32 items 3-4, issue 31 item 4): the exploding-start guard, one
options type (variable projection: removed, measured dominated)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import ceem_casadi as cc


def _scalar_case(T=600, seed=0):
    """``x+ = a x + b u``, ``y = x + e`` (truth a = 0.7, b = 1) and the model started at a = 1.2."""
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
                                             params=cc.Parameters(cc.Param("a", 1.2), cc.Param("b", 1.0)),
                                             measurement_std=0.1)
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(T, 1))
    y = cc.simulate_output(model, {"a": 0.7, "b": 1.0}, u, np.zeros(1)) + 0.1 * rng.normal(size=(T, 1))
    return model, cc.Trajectories([y], [u])


def test_exploding_start_is_not_reported_converged_and_multiple_shooting_recovers():
    """Issue 32: from a = 1.2 the free run grows like 1.2^600; the engine used to stop on its step
    test after 2 iterations (a unchanged) and say "converged"."""
    model, data = _scalar_case()
    res = cc.refine_output_error(model, data, {"a": 1.2, "b": 1.0})
    assert res.status is cc.Status.DIVERGED and not res.success, res.message
    assert "shooting=" in res.message and "explodes" in res.message
    ms = cc.refine_output_error(model, data, {"a": 1.2, "b": 1.0}, shooting=20)
    assert ms.status is cc.Status.CONVERGED, ms.message
    assert abs(float(ms.theta["a"]) - 0.7) < 0.01 and abs(float(ms.theta["b"]) - 1.0) < 0.03


@pytest.mark.parametrize("options, shooting", [({}, None), (dict(solver="ipopt"), None), ({}, 20)])
def test_a_start_whose_squares_overflow_fails_without_warnings(options, shooting):
    """From a = 2 the free run reaches 2^600 ~ 4e180: finite outputs whose sum of squares overflows. No
    solver reports "converged" there (segments of 20 samples grow by 2^20 ~ 1e6: too long for the engine,
    which then advises 3), and numpy prints no overflow warning on the way."""
    model, data = _scalar_case()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        res = cc.refine_output_error(model, data, {"a": 2.0, "b": 1.0}, shooting=shooting,
                                     options=cc.OutputErrorOptions(**options))
    assert res.status is cc.Status.DIVERGED and not res.success, res.message
    assert "shooting=3 (" in res.message and res.advice in res.message, res.message
    if shooting is None:
        assert float(res.theta["a"]) == 2.0


@pytest.mark.parametrize("a0, advised", [(1.2, 12), (2.0, 3), (5.0, 1)])
@pytest.mark.parametrize("options", [{}, dict(solver="ipopt")])
def test_following_the_exploding_start_advice_recovers_the_truth(a0, advised, options):
    """Issue 32 item 4: the advice names the segment length over which the measured growth per sample of
    the free run (a0 here) stays below 10, k = floor(log 10 / log a0), and following it recovers the truth;
    IPOPT (which stops with an error status there) gives the same status and advice."""
    model, data = _scalar_case()
    opts = cc.OutputErrorOptions(**options)
    res = cc.refine_output_error(model, data, {"a": a0, "b": 1.0}, options=opts)
    assert res.status is cc.Status.DIVERGED, res.message
    assert f"grows by a factor {a0:.3g} per sample" in res.advice and f"shooting={advised} (" in res.advice
    assert res.advice in res.message, res.message
    ms = cc.refine_output_error(model, data, {"a": a0, "b": 1.0}, shooting=advised, options=opts)
    assert ms.status is cc.Status.CONVERGED, ms.message
    assert abs(float(ms.theta["a"]) - 0.7) < 0.01 and abs(float(ms.theta["b"]) - 1.0) < 0.03


def test_multiple_shooting_leaves_a_start_whose_free_run_overflows():
    """From a = 3 the single-shooting objective overflows; the engine used to accept only steps that made
    it finite at once, so no trial was accepted from segments of 3 to 8 samples (measured)."""
    model, data = _scalar_case()
    ms = cc.refine_output_error(model, data, {"a": 3.0, "b": 1.0}, shooting=5)
    assert ms.status is cc.Status.CONVERGED, ms.message
    assert abs(float(ms.theta["a"]) - 0.7) < 0.01 and abs(float(ms.theta["b"]) - 1.0) < 0.03


def test_options_refuse_a_field_of_the_other_solver():
    """Issue 32 item 3: no field accepted and ignored."""
    with pytest.raises(cc.OptionsError, match="hessian was removed"):
        cc.OutputErrorOptions(solver="ipopt", hessian="exact")
    with pytest.raises(cc.OptionsError, match="variable_projection was removed"):   # measured dominated
        cc.OutputErrorOptions(variable_projection=True)
    assert cc.OutputErrorOptions(variable_projection=False) == cc.OutputErrorOptions()


def test_statistical_test_stops_within_a_hundredth_of_a_standard_error():
    """Issue 31 item 4: "converged" means the Gauss-Newton step left is below 1 % of a standard
    error (the default tol); the estimate is then that close to the tight optimum, in fewer iterations."""
    model, data = _scalar_case(T=2000, seed=1)
    start = {"a": 0.5, "b": 0.8}
    stat = cc.refine_output_error(model, data, start, x0=np.zeros(1))
    tight = cc.refine_output_error(model, data, start, x0=np.zeros(1), options=cc.OutputErrorOptions(tol=1e-15))
    assert stat.status is cc.Status.CONVERGED and "statistical test" in stat.message, stat.message
    assert tight.status is cc.Status.CONVERGED, tight.message    # its statistical test is at 1e-7 standard errors
    from ceem_casadi.workflow.output_error._least_squares import output_error_problem

    prob = output_error_problem(model, data.lengths, None)      # standard errors s^2 (J'J)^-1 at the optimum
    prob.set_data(model, model.params.to_vector(tight.theta), data, True)
    w = np.r_[float(tight.theta["a"]), float(tight.theta["b"]), tight.x0.ravel()]
    r, J = prob.evaluate(w, True)[:2]
    se = np.sqrt(np.diag(np.linalg.inv(J.T @ J)) * (r @ r) / (r.size - w.size))
    gap = np.abs([float(stat.theta[k]) - float(tight.theta[k]) for k in ("a", "b")]) / se[:2]
    assert np.all(gap <= 0.02) and np.any(gap > 0), gap
    assert stat.iterations < tight.iterations, (stat.message, tight.message)


@pytest.mark.parametrize("shooting, says", [(5, "use multiple shooting with shooting=3 ("),
                                            (3, "segments of 3 samples are short enough: try another start")])
def test_advice_when_multiple_shooting_diverges(shooting, says):
    """Segments longer than the advised ones get the advised length; segments already that short get
    another start (a = 2: growth 2 per sample, at most 10 over 3 samples)."""
    from ceem_casadi.workflow.output_error._least_squares import output_error_problem

    model, data = _scalar_case()
    prob = output_error_problem(model, data.lengths, shooting)
    prob.set_data(model, model.params.to_vector({"a": 2.0, "b": 1.0}), data, True)
    advice = prob.exploding_advice(np.r_[2.0, 1.0, np.zeros(len(prob.segs))])
    assert "grows by a factor 2 per sample" in advice and says in advice, advice


@pytest.mark.parametrize("solver", ["lm", "ipopt"])
def test_raise_on_failure_raises_a_diverged_fit_with_its_advice(solver):
    """A failed fit (diverged or solver_failed) raises with the advice when exceptions were asked for; a fit
    that runs out of iterations returns."""
    model, data = _scalar_case()
    opts = cc.OutputErrorOptions(solver=solver, raise_on_failure=True)
    with pytest.raises(cc.SolverError, match=r"shooting=3 \(") as err:
        cc.refine_output_error(model, data, {"a": 2.0, "b": 1.0}, options=opts)
    assert err.value.result.status is cc.Status.DIVERGED
    res = cc.refine_output_error(model, data, {"a": 0.5, "b": 1.0}, options=cc.OutputErrorOptions(
        solver=solver, raise_on_failure=True, max_iters=1))
    assert res.status is cc.Status.MAX_ITERS, res.message


def test_identify_stage_table_rejects_a_diverged_stage_with_its_measured_advice():
    """Issue 32 item 4: the rejected text of `identify`'s output-error stage is the advice measured there."""
    from ceem_casadi.workflow._identify_stages import Stages

    model, data = _scalar_case()
    stage = Stages(model, data, None, cc.OutputErrorOptions()).output_error("output error", {"a": 2.0, "b": 1.0},
                                                                             None, None)
    assert stage.status == "diverged" and stage.rejected.startswith("diverged: the free run explodes. The free run's output error grows")
    assert "shooting=3 (" in stage.rejected, stage.rejected


@pytest.mark.parametrize("history, converged", [([10.0, *[9.99999] * 10], True),     # fell by 1e-6: flat valley
                                                ([10.0, *[10.5] * 10], False),       # rose (multiple shooting's
                                                ([10.0, *[5.0] * 10], False)])       # honest objective): go on
def test_the_flat_valley_test_needs_the_objective_to_have_fallen(history, converged):
    """A run whose objective rose over the last 10 iterations (possible under multiple shooting, whose
    merit adds the gaps) is not reported converged by the flat-valley test."""
    from types import SimpleNamespace

    from ceem_casadi.workflow.output_error._lm import _Engine

    engine = SimpleNamespace(_feasible=lambda c: True, history=history)
    trial = SimpleNamespace(small_step=False, small_f=False)
    out = _Engine._converged_after(engine, trial, np.zeros(0))
    assert (out is not None and out[0] is cc.Status.CONVERGED and "flat valley" in out[1]) if converged else out is None
