"""The CE-EM loop's acceptance logic and accelerations, made to face the cases they exist for:
a step that lowers J (injected), a SQUAREM extrapolation, a joint Newton step."""
import importlib

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.em import _accelerations
from ceem_casadi.em._accelerations import Iterate, squarem_point
from models import lorenz


@pytest.fixture(scope="module")
def problem():
    """Single Lorenz, 2 trajectories of 64 steps, shared prebuilt solvers (built once here)."""
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=10), 64, measurement_std=0.01, seed=11)
    smoother = cc.smoothing.Smoother(model)
    learner = cc.learning.Learner(model, data.lengths, stages=smoother.stages)
    theta0 = lorenz.perturbed(lorenz.TRUE, 0.1, seed=5)
    return model, data, theta0, dict(smoother=smoother, learner=learner)


def run(problem, **options):
    model, data, theta0, solvers = problem
    return cc.ceem(model, data, theta0, options=cc.CEEMOptions(**options), **solvers)


def thetas(result):
    return np.array([[float(r.theta[k]) for k in lorenz.TRUE] for r in result.history])


def test_step_that_lowers_J_is_rejected_kept_out_and_reported(problem, monkeypatch):
    """The third learning step is replaced by one that moves sigma 30 % away (J drops by orders of
    magnitude): the loop must not take it, must keep the second iterate and must say so."""
    original = cc.learning.Learner.solve
    calls = []

    def sabotaged(self, theta_vec, data, xs, *args, **kwargs):
        res = original(self, theta_vec, data, xs, *args, **kwargs)
        calls.append(res.theta_vec.copy())
        if len(calls) == 3:
            res.theta_vec = res.theta_vec * np.array([1.3, 1.0, 1.0])
        return res

    monkeypatch.setattr(cc.learning.Learner, "solve", sabotaged)
    res = run(problem, max_iters=6, tol=0.0)
    assert len(res.history) == 3, [(r.kind, r.accepted) for r in res.history]
    good, bad = res.history[1], res.history[2]
    assert good.accepted and not bad.accepted
    assert bad.objective < good.objective and bad.increase < 0
    # the rejected step is not taken: the result is the last good iterate
    for k in lorenz.TRUE:
        np.testing.assert_array_equal(res.theta[k], good.theta[k])
    assert res.J == good.J
    # ... and reported
    assert res.status == cc.Status.STALLED and not res.success
    assert "iteration 3" in res.message and "lowered the objective" in res.message


def test_rejected_extrapolation_is_not_taken(problem, monkeypatch):
    """A SQUAREM point far from the iterates lowers J: recorded as rejected, the loop carries on
    from the plain EM iterate exactly as acceleration="none" does."""
    def bad_point(params, it0, it1, it2):
        return Iterate([3.0 * x for x in it2.xs], it2.theta_vec * np.array([1.5, 0.6, 1.4]), np.nan, -np.inf)

    monkeypatch.setattr(_accelerations, "squarem_point", bad_point)
    sq = run(problem, max_iters=5, tol=0.0, acceleration="squarem")
    plain = run(problem, max_iters=4, tol=0.0)
    kinds = [(r.kind, r.accepted) for r in sq.history]
    assert kinds[2] == ("extrapolated", False), kinds
    assert sq.history[2].objective < sq.history[1].objective
    # the accepted iterates are exactly those of plain EM
    accepted = np.array([[float(r.theta[k]) for k in lorenz.TRUE] for r in sq.history if r.accepted])
    np.testing.assert_allclose(accepted, thetas(plain), rtol=1e-10)


def test_no_acceleration_takes_only_plain_em_steps(problem):
    res = run(problem, max_iters=4, tol=0.0)
    assert [(r.kind, r.accepted) for r in res.history] == [("em", True)] * 4


@pytest.mark.parametrize("acceleration,kind", [("squarem", "extrapolated"), ("newton", "newton")])
def test_acceleration_steps_are_taken_and_change_the_iterates(problem, acceleration, kind):
    """Same problem, same number of iterations: the accelerated run takes accepted steps of its own
    kind, its iterates leave plain EM's path after the first (SQUAREM: second) plain step and it
    ends at a higher objective, closer to the fixed point plain EM approaches."""
    plain = run(problem, max_iters=8, tol=0.0)
    fast = run(problem, max_iters=8, tol=0.0, acceleration=acceleration)
    kinds = [r.kind for r in fast.history]
    taken = [i for i, r in enumerate(fast.history) if r.kind == kind and r.accepted]
    assert taken, kinds
    n_plain = 2 if acceleration == "squarem" else 1  # SQUAREM extrapolates after two EM steps
    assert kinds[:n_plain] == ["em"] * n_plain and taken[0] == n_plain
    tp, tf = thetas(plain), thetas(fast)
    np.testing.assert_allclose(tf[:n_plain], tp[:n_plain], rtol=1e-10)  # identical until the first jump
    assert np.abs(tf[n_plain] - tp[n_plain]).max() > 1e-3                 # the jump changes theta
    # every taken accelerated step raises the objective over the iterate it started from
    obj = [fast.init_J] + [r.objective for r in fast.history]
    for i in taken:
        assert obj[i + 1] > obj[i]
    # the accelerated run is further along after the same number of iterations
    assert fast.history[-1].objective > plain.history[-1].objective + 0.1
    converged = run(problem, max_iters=200, tol=1e-12, acceleration="newton")
    err = lambda r: max(abs(float(r.theta[k]) - float(converged.theta[k])) for k in lorenz.TRUE)  # noqa: E731
    assert err(fast) < 0.5 * err(plain)
    for k in lorenz.TRUE:
        np.testing.assert_array_equal(fast.theta[k], fast.history[-1].theta[k])


def _joint_log_density(model, data, theta, xs) -> float:
    """J(x, theta) with all constants, from the model's f and g sample by sample (independent of
    the library's stage Functions): observed outputs, transitions, the x1 prior if declared."""
    p = model.params.to_vector(theta)
    sv, sw = model.noise.measurement_std, model.noise.process_std
    J = 0.0
    for y, x in zip(data.y, xs):
        for t in range(y.shape[0]):
            m = np.isfinite(y[t])
            r = (y[t] - np.asarray(model.g(x[t], [], p)).ravel())[m] / sv[m]
            J += -0.5 * r @ r - 0.5 * np.sum(np.log(2 * np.pi * sv[m] ** 2))
            if t + 1 < y.shape[0]:
                w = (x[t + 1] - np.asarray(model.f(x[t], [], p)).ravel()) / sw
                J += -0.5 * w @ w - 0.5 * np.sum(np.log(2 * np.pi * sw ** 2))
        if model.noise.x1_mean is not None:
            z = (x[0] - model.noise.x1_mean) / model.noise.x1_std
            J += -0.5 * z @ z - 0.5 * np.sum(np.log(2 * np.pi * model.noise.x1_std ** 2))
    return J


@pytest.mark.parametrize("acceleration", ["none", "squarem", "newton"])
def test_history_records_are_consistent(problem, acceleration):
    """Every IterationRecord against values recomputed here: its number, J recomputed from the joint
    log-density at the record's own states and theta (objective = J without priors), the increase
    over the last accepted objective, the statuses of the solvers that produced it, finite timings."""
    model, data, theta0, solvers = problem
    seen = []  # (theta, states) of each record, copied in the callback (the record drops its states after it)
    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=6, tol=0.0, acceleration=acceleration),
                  callback=lambda rec: seen.append(({k: np.array(v) for k, v in rec.theta.items()},
                                                    [np.array(x) for x in rec.x])), **solvers)
    assert len(seen) == len(res.history)
    last = res.init_J
    for i, r in enumerate(res.history):
        assert r.iteration == i + 1 and r.kind in ("em", "extrapolated", "newton")
        theta, xs = seen[i]
        assert all(np.array_equal(theta[k], r.theta[k]) for k in theta)
        assert r.J == pytest.approx(_joint_log_density(model, data, theta, xs), rel=1e-10, abs=1e-8)
        assert np.isfinite(r.J) and r.objective == r.J  # no priors declared
        assert abs(r.increase - (r.objective - last)) <= 1e-9 * abs(last)
        assert np.isfinite([r.smooth_s, r.learn_s]).all() and r.smooth_s >= 0 and r.learn_s >= 0
        if r.kind == "newton":
            assert r.smooth_status == [] and r.smooth_s == 0.0 and r.learn_status.startswith("joint-gauss-newton (mu=")
        else:
            assert len(r.smooth_status) == len(data.y) and r.learn_status in ("Solve_Succeeded",
                                                                              "Solved_To_Acceptable_Level")
        if r.accepted:
            last = r.objective
    assert res.J == pytest.approx(last, rel=1e-12)


def _mus(result):
    return [float(r.learn_status.split("mu=")[1].rstrip(")")) for r in result.history if r.kind == "newton"]


def test_newton_damping_falls_after_accepted_steps_and_rises_after_a_failed_solve(problem, monkeypatch):
    """Levenberg-Marquardt bookkeeping: each accepted joint step divides mu by 3 (from 1e-3); a
    linear-algebra failure multiplies it by 10 and the step is retried at once (same iteration)."""
    from ceem_casadi.em._joint_gauss_newton import JointGaussNewton, LinAlgError
    res = run(problem, max_iters=4, tol=0.0, acceleration="newton")
    mus = _mus(res)
    assert len(mus) >= 2 and mus[0] == pytest.approx(1e-3, rel=0.05)
    np.testing.assert_allclose(np.diff(np.log10(mus)), np.log10(1 / 3), atol=0.03)
    original, calls = JointGaussNewton.step, []

    def failing_once(self, *args, **kwargs):
        calls.append(self.mu)
        if len(calls) == 1:
            raise LinAlgError("injected: matrix not positive definite")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(JointGaussNewton, "step", failing_once)
    res = run(problem, max_iters=2, tol=0.0, acceleration="newton")
    assert [r.kind for r in res.history] == ["em", "newton"]
    assert calls[:2] == [pytest.approx(1e-3), pytest.approx(1e-2)]
    assert _mus(res)[0] == pytest.approx(1e-2, rel=0.05)


def _linear_iterates(start, fixed, c, n=3):
    """Iterates of the linear fixed-point map z -> fixed + c (z - fixed) (SQUAREM's model case)."""
    out, z = [], np.asarray(start, float)
    for _ in range(n):
        out.append(z)
        z = fixed + c * (z - fixed)
    return out


def _extrapolate(params, thetas, xs):
    its = [Iterate([x], th, 0.0, 0.0) for th, x in zip(thetas, xs)]
    return squarem_point(params, *its)


@pytest.mark.parametrize("start", [[2.0, 0.0, 0.0], [4.0, 0.0, 0.0], [1.0, -3.0, 0.5]])
def test_squarem_point_is_exact_for_a_linear_contraction(start):
    """For z+ = z* + c (z - z*) with 0 < c < 1 the S3 step length alpha = -|r|/|v| = 1/(c - 1)
    lands exactly on z* (theta and states alike). Starts with |r| = 1 and |v| = 1 included."""
    params = cc.Parameters(cc.Param("a", 0.0), cc.Param("b", 0.0), cc.Param("c", 0.0))
    fixed_theta, fixed_x = np.zeros(3), np.arange(6.0).reshape(2, 3)
    th = _linear_iterates(start, fixed_theta, 0.5)
    xs = _linear_iterates(fixed_x + np.array(start), fixed_x, 0.5)
    point = _extrapolate(params, th, xs)
    np.testing.assert_allclose(point.theta_vec, fixed_theta, atol=1e-12)
    np.testing.assert_allclose(point.xs[0], fixed_x, atol=1e-12)


def test_squarem_step_length_at_most_minus_one_bounds_and_degenerate_iterates():
    params = cc.Parameters(cc.Param("a", 0.0, upper=0.1), cc.Param("b", 0.0, lower=-0.4), cc.Param("c", 0.0))
    # oscillating iterates (c = -0.5): -|r|/|v| = -2/3 > -1, so alpha = -1: z0 + 2 r + v
    th = _linear_iterates([1.0, -2.0, 2.0], np.zeros(3), -0.5)
    r, v = th[1] - th[0], th[2] - 2 * th[1] + th[0]
    want = th[0] + 2 * r + v
    np.testing.assert_allclose(want, [0.25, -0.5, 0.5])
    point = _extrapolate(params, th, [np.zeros((2, 3))] * 3)
    np.testing.assert_allclose(point.theta_vec, [0.1, -0.4, 0.5])  # clipped to a <= 0.1 and b >= -0.4
    # no move between the first two iterates, a non-finite state: no extrapolation
    same = [np.ones(3), np.ones(3), np.full(3, 2.0)]
    assert _extrapolate(params, same, [np.zeros((2, 3))] * 3) is None
    nan_x = [np.zeros((2, 3)), np.ones((2, 3)), np.full((2, 3), np.nan)]
    assert _extrapolate(params, _linear_iterates([1.0, 1.0, 1.0], np.zeros(3), 0.5), nan_x) is None


def test_smoothing_step_uses_processes_only_for_n_jobs_above_one(problem):
    """n_jobs=1 smooths in this process; n_jobs=k > 1 sets up a pool of k forked workers (not
    started here; test_core_ceem.py checks that parallel and sequential fits agree)."""
    from ceem_casadi.em._smoothing_step import SmoothingStep
    smoother = problem[3]["smoother"]
    assert SmoothingStep(smoother, 1).pool is None
    step = SmoothingStep(smoother, 3)
    try:
        pool = step.pool.executor  # a runtime._pool.WorkerPool (workers end with this process)
        assert pool._max_workers == 3 and pool._mp_context.get_start_method() == "fork"
    finally:
        step.close()


def test_a_small_J_decrease_is_rejected_too(problem, monkeypatch):
    """Near convergence (J rises by ~0.02 per step at iteration 12) a learning step nudged by 0.2 %
    in sigma lowers the objective by ~1 (4e-4 of |J|, far above round-off): rejected."""
    original = cc.learning.Learner.solve
    calls = []

    def nudged(self, theta_vec, data, xs, *args, **kwargs):
        res = original(self, theta_vec, data, xs, *args, **kwargs)
        calls.append(1)
        if len(calls) == 12:
            res.theta_vec = res.theta_vec * np.array([1.002, 1.0, 1.0])
        return res

    monkeypatch.setattr(cc.learning.Learner, "solve", nudged)
    res = run(problem, max_iters=14, tol=0.0)
    bad = res.history[-1]
    assert len(res.history) == 12 and not bad.accepted and res.status == "stalled"
    assert 1e-6 * abs(res.J) < -bad.increase < 1e-2 * abs(res.J)


@pytest.mark.parametrize("stage", ["smoothing", "learning"])
def test_a_failed_solve_stops_with_the_last_good_iterate(problem, monkeypatch, stage):
    """A solver returning an error status (finite values) in iteration 2 is not taken: status
    solver_failed naming the step, the first iterate returned, SolverError on request."""
    cls = cc.smoothing.Smoother if stage == "smoothing" else cc.learning.Learner
    original, calls = cls.solve, []

    def failing(self, *args, **kwargs):
        res = original(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            for r in (res if isinstance(res, list) else [res]):
                r.status = "Restoration_Failed"
        return res

    monkeypatch.setattr(cls, "solve", failing)
    res = run(problem, max_iters=5, tol=0.0)
    assert res.status == "solver_failed" and not res.success and len(res.history) == 1
    assert f"iteration 2: {stage} failed" in res.message and "Restoration_Failed" in res.message
    for k in lorenz.TRUE:
        np.testing.assert_array_equal(res.theta[k], res.history[0].theta[k])
    calls.clear()
    with pytest.raises(cc.SolverError, match=f"{stage} failed"):
        run(problem, max_iters=5, tol=0.0, raise_on_failure=True)


def test_objective_is_J_plus_the_log_prior_when_used(problem):
    """A Gaussian prior on beta: objective = J + log N(beta; 2.5, 0.1^2) (scipy), or J with
    use_prior=False."""
    from scipy.stats import norm
    _, data, theta0, _ = problem
    params = cc.Parameters(cc.Param("sigma", 9.0), cc.Param("rho", 26.0),
                           cc.Param("beta", 2.5, prior_mean=2.5, prior_std=0.1))
    model = cc.StateSpaceModel.from_ode(lorenz.lorenz_rhs, lambda x, u, p: lorenz.C_SINGLE @ x, nx=3, dt=lorenz.DT,
                                        params=params, process_std=0.01, measurement_std=0.01)
    for use_prior in (True, False):
        opts = cc.CEEMOptions(max_iters=2, tol=0.0, learner=cc.LearnerOptions(use_prior=use_prior))
        res = cc.ceem(model, data, theta0, options=opts)
        for r in res.history:
            want = norm.logpdf(float(r.theta["beta"]), 2.5, 0.1) if use_prior else 0.0
            assert r.objective - r.J == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_callback_sees_the_states_and_options_are_checked(problem):
    seen = []

    def callback(rec):
        seen.append([x.copy() for x in rec.x])

    model, data, theta0, solvers = problem
    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=2, tol=0.0), callback=callback, **solvers)
    assert len(seen) == 2 and all(r.x is None for r in res.history)
    for a, b in zip(seen[-1], res.x):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="options must be a CEEMOptions, got dict"):
        cc.ceem(model, data, theta0, options={"max_iters": 2})
    # a callback returning False stops the run after that iteration
    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=5, tol=0.0),
                  callback=lambda rec: rec.iteration < 2, **solvers)
    assert res.status == "stopped" and res.iterations == 2


def test_model_checked_at_the_first_given_state():
    """x_init's first state is where the model is checked: sqrt of a negative state is refused."""
    params = cc.Parameters(cc.Param("a", 0.5))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: [p.a * x[0]], lambda x, u, p: [x[0] ** 0.5],
                                             nx=1, params=params, process_std=0.1, measurement_std=0.1)
    data = cc.Trajectories([np.ones((5, 1))])
    good = [np.ones((5, 1))]
    cc.ceem(model, data, {"a": 0.5}, x_init=good, options=cc.CEEMOptions(max_iters=1))
    bad = [np.vstack([[-1.0], np.ones((4, 1))])]
    with pytest.raises(cc.errors.ModelError, match="non-finite"):
        cc.ceem(model, data, {"a": 0.5}, x_init=bad, options=cc.CEEMOptions(max_iters=1))


def test_identifiability_check_after_the_fit(problem, monkeypatch):
    """The final check of the learning Hessian: a singular one (here: zero in sigma's row and column)
    is reported in result.warnings; none is checked above IDENTIFIABILITY_CHECK_MAX free parameters
    or when the Hessian is not finite."""
    ceem_module = importlib.import_module("ceem_casadi.em._ceem")  # the module (cc.ceem is the function)
    singular = np.diag([0.0, 1.0, 1.0])
    monkeypatch.setattr(cc.learning.Learner, "hessian_matrix", lambda self, *args: singular)
    assert any("sigma" in w for w in run(problem, max_iters=1, tol=0.0).warnings)
    monkeypatch.setattr(ceem_module, "IDENTIFIABILITY_CHECK_MAX", 2)  # Lorenz has 3 free parameters
    assert run(problem, max_iters=1, tol=0.0).warnings == []
    monkeypatch.setattr(ceem_module, "IDENTIFIABILITY_CHECK_MAX", 1000)
    singular[1, 2] = np.nan
    assert run(problem, max_iters=1, tol=0.0).warnings == []
    # directions are named after the free entries only (rho fixed: the second free entry is beta)
    model, data, theta0, _ = problem
    params = cc.Parameters(cc.Param("sigma", 9.0), cc.Param("rho", 28.0, free=False), cc.Param("beta", 2.5))
    fixed_rho = cc.StateSpaceModel.from_ode(lorenz.lorenz_rhs, lambda x, u, p: lorenz.C_SINGLE @ x, nx=3,
                                            dt=lorenz.DT, params=params, process_std=0.01, measurement_std=0.01)
    monkeypatch.setattr(cc.learning.Learner, "hessian_matrix", lambda self, *args: np.diag([1.0, 0.0]))
    (warning,) = cc.ceem(fixed_rho, data, theta0, options=cc.CEEMOptions(max_iters=1)).warnings
    assert "beta" in warning and "rho" not in warning and "sigma" not in warning
