"""The Levenberg-Marquardt engine of ceem_casadi.workflow.output_error._least_squares (issue 24, item 1): agreement with
scipy.optimize.least_squares, the best-iterate guarantee, multi-start, and the output-error failure
cases of the issue reproduced on simulated data (IPOPT as the peer in the same run)."""
import warnings

import casadi as ca
import numpy as np
import pytest
from scipy.optimize import least_squares

import ceem_casadi as cc
from ceem_casadi import OutputErrorOptions
from ceem_casadi.workflow import solve_least_squares
from ceem_casadi.workflow.output_error._fit import output_error_least_squares
from ceem_casadi.workflow.output_error._least_squares import output_error_problem

TIGHT = dict(ftol=1e-15, xtol=1e-15, gtol=1e-15)


def _exp_fit():
    """Sum of two decaying exponentials fitted to noisy samples (a classic ill-conditioned fit)."""
    t = np.linspace(0, 4, 60)
    rng = np.random.default_rng(0)
    y = 2.0 * np.exp(-1.3 * t) + 0.5 * np.exp(-0.2 * t) + 0.01 * rng.standard_normal(t.size)
    x = ca.SX.sym("x", 4)
    r = x[0] * np.exp(0) * ca.exp(-x[1] * ca.DM(t)) + x[2] * ca.exp(-x[3] * ca.DM(t)) - ca.DM(y)
    fun = ca.Function("r", [x], [r])
    return fun, (lambda v: np.asarray(fun(v)).ravel()), np.array([1.0, 1.0, 1.0, 0.1])


def test_generic_problem_matches_scipy_lm_and_trf_with_bounds():
    fun, f_np, x0 = _exp_fit()
    res = solve_least_squares(fun, x0, options=OutputErrorOptions(tol=1e-15))
    ref = least_squares(f_np, x0, method="lm", **TIGHT)
    assert res.status == "converged", res.message
    assert res.cost == pytest.approx(ref.cost, rel=1e-10)
    np.testing.assert_allclose(res.x, ref.x, rtol=1e-7)
    # an active upper bound on the fast rate (unconstrained optimum 1.3): scipy's trf as the oracle
    hi = np.array([np.inf, 1.0, np.inf, np.inf])
    resb = solve_least_squares(fun, x0, upper=hi, options=OutputErrorOptions(tol=1e-15))
    refb = least_squares(f_np, x0, bounds=(-np.inf, hi), method="trf", **TIGHT)
    assert resb.success and resb.x[1] == pytest.approx(1.0, abs=1e-12)
    assert resb.cost == pytest.approx(refb.cost, rel=1e-9)
    np.testing.assert_allclose(resb.x, refb.x, rtol=1e-6, atol=1e-9)


def test_rosenbrock_and_scale_invariance():
    x = ca.SX.sym("x", 2)
    rosen = ca.Function("r", [x], [ca.vertcat(10 * (x[1] - x[0] ** 2), 1 - x[0])])
    res = solve_least_squares(rosen, [-1.2, 1.0], options=OutputErrorOptions(tol=1e-15))
    np.testing.assert_allclose(res.x, [1.0, 1.0], atol=1e-10)
    # residuals x 1e4 and the second unknown in other units (x1 = 1e-3 x1'): same iterates, same answer
    xs = ca.SX.sym("xs", 2)
    scaled = ca.Function("r", [xs], [1e4 * rosen(ca.vertcat(xs[0], 1e-3 * xs[1]))])
    res2 = solve_least_squares(scaled, [-1.2, 1e3], options=OutputErrorOptions(tol=1e-15))
    assert res2.iterations == res.iterations
    np.testing.assert_allclose(res2.x, [1.0, 1e3], rtol=1e-9)


def test_an_objective_that_overflows_at_the_start_is_a_failure_without_warnings():
    """``exp(x) - 2`` from x = 380: the residual (about 1e165) is finite but its square overflows. The engine
    reported "converged" (a gradient test on NaN) with numpy's overflow warnings; now a failure that says why.
    From x = 3 the same problem converges to x = ln 2 (the prior term 0.1 (x - 1) pulls it slightly up)."""
    x = ca.SX.sym("x")
    fun = ca.Function("r", [x], [ca.vertcat(ca.exp(x) - 2.0, 0.1 * (x - 1))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bad = solve_least_squares(fun, [380.0])
        good = solve_least_squares(fun, [3.0], options=OutputErrorOptions(tol=1e-15))
    assert bad.status == "solver_failed" and not bad.success and "not finite at the start" in bad.message
    ref = least_squares(lambda v: np.asarray(fun(v)).ravel(), [3.0], method="lm", **TIGHT)
    assert good.status == "converged" and good.x[0] == pytest.approx(ref.x[0], rel=1e-5)


def _pendulum():
    params = cc.Parameters(cc.Param("a", 1.6, lower=0.0), cc.Param("b", 0.2), cc.Param("c", 1.0))

    def rhs(x, u, p):
        return ca.vertcat(x[1], -p.a * ca.sin(x[0]) - p.b * x[1] + p.c * u[0])
    return cc.StateSpaceModel.from_ode(rhs, lambda x, u, p: x[0], nx=2, nu=1, dt=0.1, params=params,
                                       measurement_std=0.05)


@pytest.fixture(scope="module")
def pendulum_case():
    model = _pendulum()
    rng = np.random.default_rng(3)
    T = 60
    u = [np.sin(0.1 * np.arange(T) * (b + 1))[:, None] + 0.3 * rng.standard_normal((T, 1)) for b in range(2)]
    data = cc.simulate(model, {"a": 2.0, "b": 0.3, "c": 0.8}, np.array([[0.5, 0.0], [-0.3, 0.2]]), T, u=u,
                       measurement_std=0.05, seed=4)[0]
    return model, data


def test_output_error_single_and_multiple_shooting_match_scipy(pendulum_case):
    """The residual vector is the engine's own (checked against finite differences of the
    independent MX residual Function below), the optimum scipy's trf from the same start."""
    model, data = pendulum_case
    start = model.params.initial()
    x0 = cc.estimate_initial_state(model, data, start)
    res = output_error_least_squares(model, data, start, x0=x0, options=OutputErrorOptions(tol=1e-15))
    prob = output_error_problem(model, data.lengths, None)
    prob.set_data(model, model.params.to_vector(start), data, True)
    fun = lambda w: prob.evaluate(w, False)[0]                        # noqa: E731 (MX residuals, no sensitivities)
    w0 = np.concatenate([[1.6, 0.2, 1.0], x0.ravel()])
    ref = least_squares(fun, w0, method="trf", x_scale="jac", **TIGHT)
    assert res.status == "converged" and res.returned == "last", res.message
    assert res.cost == pytest.approx(ref.cost, rel=1e-10)
    np.testing.assert_allclose(res.x, ref.x, rtol=1e-6, atol=1e-8)
    # the sensitivity Jacobian equals central differences of the MX residuals
    _, J, _, _ = prob.evaluate(ref.x, True)
    fd = np.column_stack([(fun(ref.x + e) - fun(ref.x - e)) / 2e-6 for e in 1e-6 * np.eye(ref.x.size)])
    np.testing.assert_allclose(J, fd, atol=1e-5 * np.abs(fd).max())
    # multiple shooting (segments of 9 and a last one of 6) reaches the same optimum, continuity met
    ms = output_error_least_squares(model, data, start, x0=x0, shooting=9, options=OutputErrorOptions(tol=1e-15))
    assert ms.status == "converged" and ms.constraint_violation < 1e-8, ms.message
    assert ms.cost == pytest.approx(ref.cost, rel=1e-8)
    np.testing.assert_allclose([float(ms.theta[k]) for k in "abc"], ref.x[:3], rtol=1e-5)
    assert ms.to_dict()["status"] == "converged" and "cost" in ms.table()


@pytest.mark.parametrize("shooting", [None, 7])
def test_the_jacobian_has_the_priors_rows(pendulum_case, shooting):
    """With a Gaussian prior the residuals end with its rows ``(z - mu) / s``; the Jacobian (dense for single
    shooting, sparse for k = 7) has them too and equals central differences of the residuals."""
    model, data = pendulum_case
    params = cc.Parameters(cc.Param("a", 1.6, lower=0.0), cc.Param("b", 0.2, prior_mean=0.3, prior_std=0.5),
                           cc.Param("c", 1.0))
    prior = cc.StateSpaceModel.from_ode(lambda x, u, p: ca.vertcat(x[1], -p.a * ca.sin(x[0]) - p.b * x[1] + p.c * u[0]),
                                        lambda x, u, p: x[0], nx=2, nu=1, dt=0.1, params=params, measurement_std=0.05)
    prob = output_error_problem(prior, data.lengths, shooting)
    prob.set_data(prior, prior.params.to_vector(prior.params.initial()), data, True)
    w = np.concatenate([[1.8, 0.1, 0.9], 0.1 * np.sin(np.arange(prob.nw - 3))])
    r, J, _, _ = prob.evaluate(w, True)
    J = J.toarray() if shooting else J
    assert r.size == data.lengths[0] + data.lengths[1] + 3 and r[-2] == pytest.approx((0.1 - 0.3) / 0.5)
    fd = np.column_stack([(prob.evaluate(w + e, False)[0] - prob.evaluate(w - e, False)[0]) / 2e-6
                          for e in 1e-6 * np.eye(w.size)])
    np.testing.assert_allclose(J, fd, atol=1e-5 * np.abs(fd).max())
    np.testing.assert_array_equal(J[-3:, :3], np.diag([0.0, 2.0, 0.0]))


def test_never_worse_than_start_on_any_stop(pendulum_case):
    model, data = pendulum_case
    start = {"a": 0.3, "b": -0.5, "c": 3.0}             # far: the first trials are rejected
    for kw in ({"max_iters": 0}, {"max_iters": 1}, {"max_iters": 3}, {"time_limit": 1e-9}):
        res = output_error_least_squares(model, data, start, x0=np.zeros((2, 2)),
                                         options=OutputErrorOptions(**kw))
        assert res.cost <= res.initial_cost and np.isfinite(res.cost), (kw, res.message)
        assert (res.returned in ("last", "start", "best") and res.returned in res.message) or "returning" in res.message
    assert res.status == "time_limit" and res.returned == "start"
    limited = output_error_least_squares(model, data, start, x0=np.zeros((2, 2)),
                                         options=OutputErrorOptions(max_iters=3))
    assert limited.status == "max_iters" and limited.cost < limited.initial_cost


def test_multi_start_returns_the_best_start(pendulum_case):
    model, data = pendulum_case
    bad = {"a": 40.0, "b": 0.3, "c": 0.8}               # a far local minimum of the pendulum's frequency
    alone = output_error_least_squares(model, data, bad, options=OutputErrorOptions(max_iters=30))
    multi = output_error_least_squares(model, data, bad, starts=[{"a": 2.5}, {"a": 1.0, "c": 1.0}],
                                       options=OutputErrorOptions(max_iters=30))
    assert len(multi.starts) == 3 and [r["start"] for r in multi.starts] == [0, 1, 2]
    assert multi.cost == min(r["cost"] for r in multi.starts)
    assert multi.cost < 0.5 * alone.cost
    assert abs(float(multi.theta["a"]) - 2.0) < 0.1
    with pytest.raises(cc.ParameterError):
        output_error_least_squares(model, data, bad, starts=[[1.0]])


def _resonator():
    params = cc.Parameters(cc.Param("a1", -1.6), cc.Param("a2", 0.8), cc.Param("b", 1.0))

    def step(x, u, p):
        return ca.vertcat(-p.a1 * x[0] - p.a2 * x[1] + p.b * u[0], x[0])
    return cc.StateSpaceModel.from_discrete(step, lambda x, u, p: x[0], nx=2, nu=1, params=params,
                                            measurement_std=0.1)


def test_multiple_shooting_never_returns_an_unstable_iterate():
    """A lightly damped resonator (|pole| 0.995), 3,000 samples, segments of 50: IPOPT's third
    iterate has a pole outside the unit circle (free run ~1e40 before this issue); the engine
    returns, on every iteration limit, an iterate whose FREE RUN is no worse than the start's."""
    model = _resonator()
    T = 3000
    rng = np.random.default_rng(0)
    u = rng.standard_normal((T, 1))
    truth = {"a1": -2 * 0.995 * np.cos(0.3), "a2": 0.995 ** 2, "b": 0.1}
    y = cc.simulate_output(model, truth, u, np.zeros(2)) + 0.1 * rng.standard_normal((T, 1))
    data = cc.Trajectories([y], [u])
    start = {"a1": -2 * 0.9 * np.cos(0.5), "a2": 0.81, "b": 0.05}

    def free_run_cost(res):
        return 0.5 * np.sum(((y - cc.simulate_output(model, res.theta, u, res.x0[0])) / 0.1) ** 2)

    for it in (2, 3, 5):
        lm = cc.refine_output_error(model, data, start, shooting=50, x0=np.zeros(2),
                                    options=cc.OutputErrorOptions(max_iters=it))
        assert lm.solver == "lm" and free_run_cost(lm) <= lm.initial_cost * (1 + 1e-12), lm.message
        assert np.all(np.abs(np.roots([1, float(lm.theta["a1"]), float(lm.theta["a2"])])) < 1)
        ip = cc.refine_output_error(model, data, start, shooting=50, x0=np.zeros(2),
                                    options=cc.OutputErrorOptions(max_iters=it, solver="ipopt"))
        assert free_run_cost(ip) <= ip.initial_cost * (1 + 1e-9)        # the IPOPT path now checks too
    done = cc.refine_output_error(model, data, start, shooting=50, x0=np.zeros(2))
    assert done.status == "converged" and done.constraint_violation < 1e-6
    assert free_run_cost(done) == pytest.approx(done.cost, rel=1e-6)
    assert abs(np.abs(np.roots([1, float(done.theta["a1"]), float(done.theta["a2"])])).max() - 0.995) < 2e-3


def test_options_validate():
    with pytest.raises(cc.OptionsError, match="max_iter"):
        OutputErrorOptions(max_iters=-1)
    with pytest.raises(cc.OptionsError, match="tol"):
        OutputErrorOptions(tol=0)
    with pytest.raises(cc.OptionsError, match="compile was removed"), pytest.warns(DeprecationWarning):
        OutputErrorOptions(compile=True)
    with pytest.warns(DeprecationWarning, match="LeastSquaresOptions is deprecated"):
        assert cc.workflow.LeastSquaresOptions(ftol=1e-8, gtol=1e-12).tol == 1e-12     # the deprecated spellings
    with pytest.raises(cc.OptionsError, match="apply to output error only"):
        solve_least_squares(_exp_fit()[0], np.ones(4), options=OutputErrorOptions(use_prior=False))
    with pytest.raises(cc.OptionsError, match="solver"):
        cc.OutputErrorOptions(solver="newton")


def test_sensitivities_in_chunks_of_time(pendulum_case, monkeypatch):
    """The forward sensitivities run in chunks of time: the same Jacobian (multiple chunks of two
    mapped segments) and, for any record length, work arrays bounded by `CHUNK_DOUBLES` — never a
    Function over the whole run (100,000 samples x 146 parameters once took > 22 GB)."""
    from ceem_casadi.workflow.output_error import _least_squares as lsq

    model, data = pendulum_case
    tv = model.params.to_vector(model.params.initial())
    w = np.concatenate([tv[model.params.free_index], [0.5, 0.0, -0.3, 0.2]])
    ref = output_error_problem(model, data.lengths, None)
    ref.set_data(model, tv, data, False)
    monkeypatch.setattr(lsq, "CHUNK_DOUBLES", 12 * 2 * 7)       # 12 augmented states, 2 segments: K = 7
    small = lsq.OutputErrorLeastSquares(model, data.lengths, None)
    small.set_data(model, tv, data, False)
    small._build_sensitivities(model, ref.free.size)
    assert [k for _, k, _ in small._sens[0]] == [7] * 8 + [4]
    r0, J0, _, _ = ref.evaluate(w, True)
    r1, J1, _, _ = small.evaluate(w, True)
    np.testing.assert_allclose(r1, r0, rtol=1e-12)
    np.testing.assert_allclose(J1, J0, rtol=1e-10, atol=1e-12)
    monkeypatch.undo()
    long = lsq.OutputErrorLeastSquares(model, (1_000_000,), None)
    long._build_sensitivities(model, ref.free.size)
    assert max(call.fun.sz_w() + sum(call.fun.nnz_out(i) for i in range(3))
               for _, _, call in long._sens[0]) <= 6 * lsq.CHUNK_DOUBLES  # one call over 10^6 samples: 5.7e7


def test_compiled_residuals_are_evaluated_without_the_jacobian(pendulum_case):
    """From `COMPILE_SAMPLES` samples the residual rollout is compiled like the sensitivities: a trial
    point's evaluation (``jac=False``) runs the compiled rollout, equal to the virtual machine's, and
    builds no sensitivities (each trial once cost a residual + Jacobian evaluation)."""
    from ceem_casadi.workflow.output_error import _least_squares as lsq

    model, data = pendulum_case
    tv = model.params.to_vector(model.params.initial())
    w = np.concatenate([tv[model.params.free_index], [0.5, 0.0, -0.3, 0.2]])
    ref = lsq.OutputErrorLeastSquares(model, data.lengths, None)
    ref.set_data(model, tv, data, False)
    fast = lsq.OutputErrorLeastSquares(model, data.lengths, None, compiled=True)
    fast.set_data(model, tv, data, False)
    r1, J1, g1, _ = fast.evaluate(w, False)
    assert J1 is None and fast._sens is None and "External" in fast.F.class_name()
    r0, _, g0, _ = ref.evaluate(w, False)
    np.testing.assert_allclose(r1, r0, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(fast.evaluate(w, True)[0], r0, rtol=1e-12, atol=1e-14)


def test_geodesic_acceleration_follows_curved_valleys():
    """Issue 31 item 4: narrow curved valleys (Rosenbrock with a 1000-fold wall, the extended Rosenbrock
    of 10 unknowns) take 208 and 56 iterations without the geodesic acceleration of the damped step;
    with it (and the scaling memory), 24 and 14; the minimiser (1, ..., 1) is known exactly."""
    x = ca.SX.sym("x", 2)
    banana = ca.Function("r", [x], [ca.vertcat(1000 * (x[1] - x[0] ** 2), 1 - x[0])])
    res = solve_least_squares(banana, [-1.2, 1.0], options=OutputErrorOptions(max_iters=500))
    assert res.status is cc.Status.CONVERGED and res.iterations <= 60, res.message
    np.testing.assert_allclose(res.x, [1.0, 1.0], atol=1e-8)
    y = ca.SX.sym("y", 10)
    chain = ca.vertcat(*[ca.vertcat(100 * (y[2 * i + 1] - y[2 * i] ** 2), 1 - y[2 * i]) for i in range(5)])
    res = solve_least_squares(ca.Function("r", [y], [chain]), np.tile([-1.2, 1.0], 5),
                              options=OutputErrorOptions(max_iters=500))
    assert res.status is cc.Status.CONVERGED and res.iterations <= 30, res.message
    np.testing.assert_allclose(res.x, np.ones(10), atol=1e-8)
