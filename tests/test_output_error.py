"""Output-error (simulation-error) refinement (issue 14, item 2) against the truth and scipy."""
import casadi as ca
import numpy as np
import pytest
from scipy.optimize import least_squares

import ceem_casadi as cc

TRUTH = {"a": 2.0, "b": 0.3, "c": 0.8}
START = {"a": 1.6, "b": 0.2, "c": 1.0}
X0 = np.array([[0.5, 0.0], [-0.3, 0.2]])


def pendulum(**param_kwargs):
    """Damped pendulum driven by u, angle measured: x = (angle, rate), 2 states, 3 parameters."""
    kw = {"a": {"lower": 0.0}, "b": {}, "c": {}}
    for k, v in param_kwargs.items():
        kw[k].update(v)
    params = cc.Parameters(*[cc.Param(k, START[k], **kw[k]) for k in ("a", "b", "c")])

    def rhs(x, u, p):
        return ca.vertcat(x[1], -p.a * ca.sin(x[0]) - p.b * x[1] + p.c * u[0])
    return cc.StateSpaceModel.from_ode(rhs, lambda x, u, p: x[0], nx=2, nu=1, dt=0.1, params=params,
                                       measurement_std=0.05)


def _data(model, T=80, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    u = [np.sin(0.1 * np.arange(T) * (b + 1))[:, None] + 0.3 * rng.standard_normal((T, 1)) for b in range(2)]
    return cc.simulate(model, TRUTH, X0, T, u=u, measurement_std=noise, seed=seed + 1)[0]


def _residuals(model, data, fixed=None):
    """Oracle residuals by a plain Python loop over model.f / model.g (no rollout Function)."""
    names = [n for n in ("a", "b", "c") if not fixed or n not in fixed]

    def res(v):
        theta = dict(fixed or {})
        theta.update(zip(names, v[:len(names)]))
        pv = np.array([theta["a"], theta["b"], theta["c"]], float)
        out = []
        for b, y in enumerate(data.y):
            x = v[len(names) + 2 * b:len(names) + 2 * b + 2]
            for t in range(y.shape[0]):
                out.append((y[t, 0] - float(model.g(x, data.u[b][t], pv))) / 0.05)
                x = np.asarray(model.f(x, data.u[b][t], pv)).ravel()
        return np.array(out)
    return res, names


def test_noise_free_data_gives_the_truth_also_with_missing_outputs():
    model = pendulum()
    data = _data(model).with_missing(0.2, seed=4)
    res = cc.refine_output_error(model, data, START)
    assert res.status == cc.Status.CONVERGED and res.success, res.message
    for k, v in TRUTH.items():
        assert abs(float(res.theta[k]) - v) < 1e-6
    np.testing.assert_allclose(res.x0, X0, atol=1e-6)
    assert res.cost < 1e-12 < res.initial_cost


@pytest.fixture(scope="module")
def scipy_reference():
    model = pendulum()
    data = _data(model, T=60, noise=0.05, seed=3)
    fun, names = _residuals(model, data)
    v0 = np.concatenate([[START[n] for n in names], cc.estimate_initial_state(model, data, START).ravel()])
    return model, data, names, least_squares(fun, v0, method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15)


@pytest.mark.parametrize("solver", ["lm", "ipopt"])
def test_optimum_equals_scipy_least_squares(scipy_reference, solver):
    """Both solvers of the one output-error problem reach scipy's optimum (issue 32 item 3)."""
    model, data, names, ref = scipy_reference
    res = cc.refine_output_error(model, data, START, options=cc.OutputErrorOptions(solver=solver))
    assert res.status == "converged", res.message
    assert res.cost == pytest.approx(ref.cost, rel=1e-6)
    np.testing.assert_allclose([float(res.theta[n]) for n in names], ref.x[:3], rtol=1e-5)
    np.testing.assert_allclose(res.x0.ravel(), ref.x[3:], atol=1e-5)


@pytest.mark.parametrize("solver", ["lm", "ipopt"])
def test_multiple_shooting_reaches_the_single_shooting_optimum(solver):
    model = pendulum()
    full = _data(model, T=60, noise=0.05, seed=3)
    # unequal lengths: segments of 7 samples plus last segments of 4 and 2 (three rollout groups)
    data = cc.Trajectories([full.y[0], full.y[1][:37]], [full.u[0], full.u[1][:37]])
    tight = cc.OutputErrorOptions(tol=1e-14)   # past the default's statistical test (1 % of a standard error)
    single = cc.refine_output_error(model, data, START, options=tight)
    multi = cc.refine_output_error(model, data, START, shooting=7, options=cc.OutputErrorOptions(tol=1e-14,
                                                                                                 solver=solver))
    assert multi.status == "converged" and multi.constraint_violation < 1e-8, multi.message
    for k in TRUTH:
        assert float(multi.theta[k]) == pytest.approx(float(single.theta[k]), abs=1e-6)
    np.testing.assert_allclose(multi.x0, single.x0, atol=1e-6)
    assert multi.cost == pytest.approx(single.cost, rel=1e-8)


@pytest.mark.parametrize("shooting", [None, 10])
def test_ipopt_builds_nothing_rollout_sized(shooting):
    """IPOPT's NLP takes its values and derivatives from the engine's chunked sensitivities: no
    Function it holds needs work memory that grows with the record (the whole-rollout Jacobian of
    ``ca.jacobian(r, w)`` needed 2.5e6 doubles at T = 10,000 here, 250 per sample)."""
    from ceem_casadi.workflow.output_error._output_error import OutputErrorProblem

    prob = OutputErrorProblem(pendulum(), (10000,), shooting, cc.OutputErrorOptions(solver="ipopt"), False)
    nw = prob.lsq.nw
    held = [prob.solver.get_function(n) for n in prob.solver.get_function()] + prob.callbacks
    held += [v for k, v in vars(prob).items() if isinstance(v, ca.Function) and k != "solver"]
    assert len(held) >= 9 and max(f.sz_w() for f in held) <= 10 * nw + 1000


def test_ipopt_problem_reused_on_new_data_forgets_the_old():
    """The cached IPOPT problem of one model and lengths, called on other data from the point it
    last evaluated, gives what a fresh model gives (its caches are reset when data is bound)."""
    model = pendulum()
    ipopt = cc.OutputErrorOptions(solver="ipopt")
    first = cc.refine_output_error(model, _data(model, T=60, noise=0.05, seed=3), START, x0=X0, options=ipopt)
    other = _data(model, T=60, noise=0.05, seed=5)
    again = cc.refine_output_error(model, other, first.theta, x0=first.x0, options=ipopt)
    fresh = cc.refine_output_error(pendulum(), other, first.theta, x0=first.x0, options=ipopt)
    assert again.initial_cost == fresh.initial_cost and again.cost == pytest.approx(fresh.cost, rel=1e-12)


def test_fixed_entries_bounds_and_priors():
    model = pendulum(a={"upper": 1.9}, c={"free": False})
    data = _data(pendulum(), T=60, noise=0.05, seed=3)
    start = dict(START, c=0.9)
    res = cc.refine_output_error(model, data, start)
    assert res.success, res.message
    assert float(res.theta["c"]) == 0.9                       # fixed entry untouched
    assert 1.9 - 1e-8 <= float(res.theta["a"]) <= 1.9          # pushed onto its upper bound (truth 2.0)
    fun, names = _residuals(model, data, fixed={"c": 0.9})
    v0 = np.concatenate([[1.6, 0.2], res.x0.ravel()])
    ref = least_squares(fun, v0, bounds=([0, -np.inf, -np.inf, -np.inf, -np.inf, -np.inf], [1.9] + [np.inf] * 5),
                        xtol=1e-15, ftol=1e-15, gtol=1e-15)
    assert res.cost == pytest.approx(ref.cost, rel=1e-6)
    # a tight prior pulls b to its mean; without use_prior it is ignored
    tight = pendulum(b={"prior_mean": 0.5, "prior_std": 1e-4})
    with_prior = cc.refine_output_error(tight, data, START)
    assert abs(float(with_prior.theta["b"]) - 0.5) < 1e-3
    without = cc.refine_output_error(tight, data, START, options=cc.OutputErrorOptions(use_prior=False))
    assert abs(float(without.theta["b"]) - 0.3) < 0.1


def test_time_limit_returns_the_last_iterate_with_its_status():
    model = pendulum()
    data = _data(model, T=60, noise=0.05, seed=3)
    res = cc.refine_output_error(model, data, START, options=cc.OutputErrorOptions(time_limit=1e-9))
    assert res.status == cc.Status.TIME_LIMIT and res.iterations <= 1, res.message
    assert all(np.isfinite(float(v)) for v in res.theta.values()) and np.all(np.isfinite(res.x0))


def test_errors():
    model = pendulum()
    data = _data(model, T=30)
    with pytest.raises(cc.ShapeError, match="shooting"):
        cc.refine_output_error(model, data, START, shooting=0)
    with pytest.raises(cc.ShapeError, match="x0"):
        cc.refine_output_error(model, data, START, x0=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="hessian was removed"):
        cc.OutputErrorOptions(solver="ipopt", hessian="exact")
    with pytest.raises(ValueError, match="time_limit"):
        cc.OutputErrorOptions(time_limit=0)
    with pytest.raises(cc.ParameterError, match="missing"):
        cc.refine_output_error(model, data, {"a": 1.0})
