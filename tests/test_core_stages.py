"""Stage Functions (ceem_casadi.stages) against independent derivatives."""
import copy

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.objective import _stages as stages_module
from ceem_casadi.objective._stages import StageFunctions


def _bilinear_model():
    """x+ = A x + B u, y = C x (all free): residuals bilinear in (x, theta)."""
    A, B, C = np.array([[0.9, 0.2], [-0.3, 0.7]]), np.array([[0.5], [1.0]]), np.array([[1.0, -0.5], [0.3, 2.0]])
    params = cc.Parameters(cc.Param("A", A), cc.Param("B", B), cc.Param("C", C))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.A @ x + p.B @ u, lambda x, u, p: p.C @ x,
                                             nx=2, nu=1, params=params, process_std=[0.1, 0.2],
                                             measurement_std=[0.3, 0.05])
    return model, model.theta_vector({"A": A, "B": B, "C": C})


def test_cross_blocks_gauss_newton_equals_exact_at_zero_residuals_and_not_elsewhere():
    """d^2 cost / dx dtheta: the Gauss-Newton block J_x^T J_theta equals CasADi's exact second
    derivative of 0.5 ||r||^2 where the residuals vanish (y = g(x), x_next = f(x)); with
    residuals left, the bilinear terms make them differ."""
    model, p = _bilinear_model()
    exact, gn = StageFunctions(model, "exact"), StageFunctions(model, "gauss-newton")
    x, u, iv, iw = np.array([1.0, -2.0]), np.array([0.7]), np.array([2.0, 3.0]), np.array([1.5, 0.5])
    y, xn = np.asarray(model.g(x, u, p)).ravel(), np.asarray(model.f(x, u, p)).ravel()
    # an independent exact cross block: CasADi AD of the stage costs written out here
    xs, xns, ps = ca.SX.sym("x", 2), ca.SX.sym("xn", 2), ca.SX.sym("p", p.size)
    obs_cost = 0.5 * ca.sumsqr(iv * (y - model.g(xs, u, ps)))
    dyn_cost = 0.5 * ca.sumsqr(iw * (xns - model.f(xs, u, ps)))
    z = ca.vertcat(xs, xns)
    ad_obs = ca.Function("o", [xs, ps], [ca.jacobian(ca.gradient(obs_cost, xs), ps)])
    ad_dyn = ca.Function("d", [z, ps], [ca.jacobian(ca.gradient(dyn_cost, z), ps)])
    for shift in (0.0, 0.5):  # residuals zero, then not
        xo = x + shift
        obs_args, dyn_args = (xo, u, y, np.ones(2), p, iv), (xo, xn, u, p, iw)
        want_obs = np.asarray(ad_obs(xo, p))
        want_dyn = np.asarray(ad_dyn(np.concatenate([xo, xn]), p))
        np.testing.assert_allclose(np.asarray(exact.obs_xp_hess(*obs_args)), want_obs, atol=1e-12)
        np.testing.assert_allclose(np.asarray(exact.dyn_xp_hess(*dyn_args)), want_dyn, atol=1e-12)
        got_obs, got_dyn = np.asarray(gn.obs_xp_hess(*obs_args)), np.asarray(gn.dyn_xp_hess(*dyn_args))
        assert got_obs.shape == want_obs.shape and got_dyn.shape == want_dyn.shape
        if shift == 0.0:
            np.testing.assert_allclose(got_obs, want_obs, atol=1e-12)
            np.testing.assert_allclose(got_dyn, want_dyn, atol=1e-12)
        else:
            assert np.abs(got_obs - want_obs).max() > 0.1 and np.abs(got_dyn - want_dyn).max() > 0.1


def test_unknown_stage_function_and_hessian_kind_are_refused():
    model, _ = _bilinear_model()
    with pytest.raises(ValueError, match="hessian must be one of"):
        StageFunctions(model, "bfgs")
    stages = StageFunctions(model)
    with pytest.raises(KeyError, match="no stage Function 'obs_bogus'"):
        stages.get("obs_bogus")
    with pytest.raises(AttributeError, match="obs_bogus"):
        stages.obs_bogus  # noqa: B018
    # a shallow copy (copy looks attributes up before __dict__ is filled) shares the built Functions
    clone = copy.copy(stages)
    assert clone.obs_cost is stages.obs_cost


@pytest.fixture
def compile_calls(monkeypatch):
    """start_compile replaced by a recorder whose handles return markers (no C compiler run)."""
    calls = []

    class Done:
        def __init__(self, name):
            self.name = name

        def result(self):
            return ("compiled", self.name)

    def fake(funs, name):
        calls.append([f.name() for f in funs])
        return [Done(f.name()) for f in funs]

    monkeypatch.setattr(stages_module, "start_compile", fake)
    monkeypatch.setattr(stages_module, "compiler", lambda: "cc")
    return calls


def test_compile_decision(compile_calls, monkeypatch):
    """compile=None compiles when the requested programs reach AUTO_COMPILE_INSTRUCTIONS,
    True always, False never; programs above MAX_COMPILE_INSTRUCTIONS are never compiled;
    compiled Functions are reused."""
    model, _ = _bilinear_model()
    names = ("obs_cost", "dyn_cost")
    n_obs, n_dyn = (StageFunctions(model).instructions([n]) for n in names)
    monkeypatch.setattr(stages_module, "AUTO_COMPILE_INSTRUCTIONS", n_obs + n_dyn + 1)
    StageFunctions(model).get(*names)
    StageFunctions(model, compile=False).get(*names)
    assert compile_calls == []
    StageFunctions(model, compile=True).get(*names)
    assert compile_calls == [list(names)]
    monkeypatch.setattr(stages_module, "AUTO_COMPILE_INSTRUCTIONS", n_obs + n_dyn)
    stages = StageFunctions(model)
    assert stages.get(*names) == [("compiled", n) for n in names]
    assert stages.get(*names) == [("compiled", n) for n in names]  # already compiled: not again
    assert compile_calls[1:] == [list(names)]
    monkeypatch.setattr(stages_module, "MAX_COMPILE_INSTRUCTIONS", min(n_obs, n_dyn))  # the shorter one only
    stages = StageFunctions(model, compile=True)
    short, long_ = (0, 1) if n_obs < n_dyn else (1, 0)
    got = stages.get(*names)
    assert n_obs != n_dyn and compile_calls[2:] == [[names[short]]]
    assert got[short] == ("compiled", names[short]) and got[long_] is getattr(stages, names[long_])


def test_failed_compilation_falls_back_unless_compile_was_requested(monkeypatch, caplog):
    model, _ = _bilinear_model()

    def broken(funs, name):
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(stages_module, "start_compile", broken)
    monkeypatch.setattr(stages_module, "compiler", lambda: "cc")
    monkeypatch.setattr(stages_module, "AUTO_COMPILE_INSTRUCTIONS", 0)
    stages = StageFunctions(model)
    with caplog.at_level("WARNING", logger="ceem_casadi.objective._stages"):
        (f,) = stages.get("obs_cost")
    assert f is stages.obs_cost and "no compiler today" in caplog.text
    with pytest.raises(RuntimeError, match="no compiler today"):
        StageFunctions(model, compile=True).get("obs_cost")
