"""identify (the recommended pipeline) and compare_structures (issue 24, item 4)."""
import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc


def _pendulum(process_std=0.01):
    params = cc.Parameters(cc.Param("a", 1.6, lower=0.0), cc.Param("b", 0.2), cc.Param("c", 1.0))

    def rhs(x, u, p):
        return ca.vertcat(x[1], -p.a * ca.sin(x[0]) - p.b * x[1] + p.c * u[0])
    return cc.StateSpaceModel.from_ode(rhs, lambda x, u, p: x[0], nx=2, nu=1, dt=0.1, params=params,
                                       measurement_std=0.05, process_std=process_std)


def _data(model, truth, T=60, seed=3):
    rng = np.random.default_rng(seed)
    u = [np.sin(0.1 * np.arange(T) * (b + 1))[:, None] + 0.3 * rng.standard_normal((T, 1)) for b in range(2)]
    return cc.simulate(model, truth, np.array([[0.5, 0.0], [-0.3, 0.2]]), T, u=u, measurement_std=0.05,
                       seed=seed + 1)[0]


def test_identify_runs_every_stage_and_keeps_the_best_on_estimation_data():
    model = _pendulum()
    truth = {"a": 2.0, "b": 0.3, "c": 0.8}
    data = _data(model, truth)
    res = cc.identify(model, data, {"a": 1.0, "b": 0.0, "c": 1.2}, starts=[{"a": 3.0}],
                      ceem=True, ceem_options=cc.CEEMOptions(max_iters=5), time_limit=60, calibrate=False)
    names = [s.stage for s in res.stages]
    assert names == ["theta0", "output error from theta0", "CE-EM", "output error from CE-EM"]
    # the chosen stage has the lowest estimation objective, recomputed here by an independent free run
    for s in res.stages:
        obj = 0.0
        for b in range(len(data)):
            yh = cc.simulate_output(model, s.theta, data.inputs(b), s.x0[b])
            obj += 0.5 * np.sum(((data.y[b] - yh) / 0.05) ** 2)
        assert s.objective == pytest.approx(obj, rel=1e-9)
    assert res.best.objective == min(s.objective for s in res.stages)
    assert res.best.stage.startswith("output error")
    for k, v in truth.items():
        assert abs(float(res.theta[k]) - v) < 0.1 * abs(v) + 0.05
    assert "*" in res.table() and res.to_dict()["best"] == res.best.stage


def _poly_model(quadratic: bool):
    params = cc.Parameters(cc.Param("a", 0.5), cc.Param("b", 0.0, free=quadratic))
    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u + p.b * u ** 2, lambda x, u, p: x,
                                            nx=1, nu=1, params=params, measurement_std=0.01)


@pytest.mark.parametrize("criterion", ["aic", "split"])
def test_compare_structures_finds_the_true_structure(criterion):
    rng = np.random.default_rng(0)
    u = rng.standard_normal((300, 1))
    cands = {"linear": (_poly_model(False), None), "quadratic": (_poly_model(True), None)}
    y = cc.simulate_output(_poly_model(True), {"a": 0.7, "b": 0.3}, u, np.zeros(1)) + 0.01 * rng.standard_normal((300, 1))
    cmp = cc.compare_structures(cands, cc.Trajectories([y], [u]), criterion=criterion)
    assert cmp.best == "quadratic" and cmp.rows[0]["criterion"] < cmp.rows[1]["criterion"]
    assert cmp.rows[0]["rms"] < 0.0115                               # at the noise level
    # linear truth: the extra parameter does not pay for itself under AIC
    y_lin = cc.simulate_output(_poly_model(False), {"a": 0.7, "b": 0.0}, u, np.zeros(1)) + \
        0.01 * rng.standard_normal((300, 1))
    if criterion == "aic":
        cmp2 = cc.compare_structures(cands, cc.Trajectories([y_lin], [u]))
        assert cmp2.best == "linear", cmp2.table()
    with pytest.raises(cc.OptionsError):
        cc.compare_structures(cands, cc.Trajectories([y], [u]), criterion="bic")


def test_compare_structures_starts_each_candidate_from_its_own_initial_state():
    """A third entry (model, theta, x0) is the start of the candidate's fit (as the Cascaded Tanks
    script gives the CE-EM fit's initial state); the start's cost is recomputed here."""
    rng = np.random.default_rng(1)
    u = rng.standard_normal((120, 1))
    truth = {"a": 0.7, "b": 0.3}
    y = cc.simulate_output(_poly_model(True), truth, u, np.array([3.0])) + 0.01 * rng.standard_normal((120, 1))
    data = cc.Trajectories([y], [u])
    cmp = cc.compare_structures({"q": (_poly_model(True), truth, [3.0])}, data,
                                options=cc.OutputErrorOptions(max_iters=3))
    fit = cmp.rows[0]["fit"]
    start = 0.5 * np.sum(((y - cc.simulate_output(_poly_model(True), truth, u, np.array([3.0]))) / 0.01) ** 2)
    assert fit.initial_cost == pytest.approx(start, rel=1e-9)
    assert abs(float(fit.x0[0, 0]) - 3.0) < 0.05
    with pytest.raises(cc.OptionsError, match="expected \\(model, theta\\) or \\(model, theta, x0\\)"):
        cc.compare_structures({"q": (_poly_model(True),)}, data)


def test_a_diverged_output_error_stage_is_never_chosen():
    """Issue 32's exploding start (x+ = a x + b u from a = 1.2, truth 0.7): the LM engine ends
    'diverged' with an objective below the start's; identify must not pick it (fails without the
    'diverged' rejection in workflow/_identify_stages.py::Stages.add)."""
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
                                             params=cc.Parameters(cc.Param("a", 1.2), cc.Param("b", 1.0)),
                                             measurement_std=0.1)
    u = np.random.default_rng(0).normal(size=(400, 1))
    y = cc.simulate_output(model, {"a": 0.7, "b": 1.0}, u, np.zeros(1))
    y = y + 0.1 * np.random.default_rng(1).normal(size=y.shape)
    res = cc.identify(model, cc.Trajectories([y], [u]), {"a": 1.2, "b": 1.0}, ceem=False, calibrate=False)
    oe = next(s for s in res.stages if s.stage == "output error from theta0")
    assert oe.status == "diverged" and oe.rejected.startswith("diverged")
    assert oe.objective < res.stages[0].objective          # lower than the start, yet not chosen
    assert res.best is not oe and "diverged: the free run explodes" in res.table()
