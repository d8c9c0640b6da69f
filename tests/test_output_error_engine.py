"""The output-error engine (issue 32 items 3-4, issue 31 item 4): the exploding-start guard, one
options type, variable projection of the parameters that enter the output linearly."""
from __future__ import annotations

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


def test_options_refuse_a_field_of_the_other_solver():
    """Issue 32 item 3: no field accepted and ignored."""
    with pytest.raises(cc.OptionsError, match="hessian applies to solver='ipopt' only"):
        cc.OutputErrorOptions(hessian="exact")
    with pytest.raises(cc.OptionsError, match="variable_projection applies to solver='lm' only"):
        cc.OutputErrorOptions(solver="ipopt", variable_projection=False)
    assert cc.OutputErrorOptions(solver="ipopt", hessian="exact").ipopt_hessian == "exact"
    assert cc.OutputErrorOptions().max_iter == cc.workflow.LeastSquaresOptions().max_iter   # one default
