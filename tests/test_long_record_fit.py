"""Costs outside the smoothing solve of a long-record fit (issue 17): the learning step started at
its optimum, the initial states' noise-level choice, compiled stage Functions for long records."""
import numpy as np

import ceem_casadi as cc


def _bounded_linear(rng, lower=-5.0):
    """x+ = A x + B u with lower bounds on A and B (IPOPT then starts its bound multipliers at 1,
    far from their optimal 0: started at the optimum it stalls on round-off line searches)."""
    A = np.array([[0.8, 0.2], [-0.1, 0.7]])
    B, C = rng.standard_normal((2, 1)), np.array([[1.0, 0.0]])
    params = cc.Parameters(cc.Param("A", A, lower=lower), cc.Param("B", B, lower=lower),
                           cc.Param("C", C, free=False))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.A @ x + p.B @ u, lambda x, u, p: p.C @ x,
                                             nx=2, nu=1, params=params, process_std=[0.01, 0.02],
                                             measurement_std=0.05)
    return model, {"A": A, "B": B, "C": C}


def _normal_equations(model, data, xs, theta):
    """argmin over the free entries of the dynamics residuals (affine in them): dense solve."""
    params, iw = model.params, 1 / model.noise.process_std
    free = params.free_index

    def residual(z):
        vec = theta.copy()
        vec[free] = z
        th = params.from_vector(vec)
        return np.concatenate([(iw * (x[1:] - x[:-1] @ th["A"].T - data.u[b][:-1] @ th["B"].T)).ravel()
                               for b, x in enumerate(xs)])

    r0 = residual(np.zeros(free.size))
    J = np.column_stack([residual(e) - r0 for e in np.eye(free.size)])
    out = theta.copy()
    out[free] = np.linalg.solve(J.T @ J, -J.T @ r0)
    return out


def test_learner_started_at_its_optimum_skips_ipopt_and_elsewhere_solves():
    """At the dense least-squares optimum the Newton model predicts a decrease below round-off:
    no IPOPT iteration (IPOPT itself, bounded variables, takes several); 1e-3 away the solve
    runs and reaches the same optimum."""
    rng = np.random.default_rng(5)
    model, truth = _bounded_linear(rng)
    us = [rng.standard_normal((3000, 1))]
    data, xs = cc.simulate(model, truth, np.zeros((1, 2)), [3000], u=us,
                           process_std=model.noise.process_std, measurement_std=0.05, seed=6)
    best = _normal_equations(model, data, xs, model.theta_vector(truth))
    for hessian in ("exact", "gauss-newton"):
        learner = cc.learning.Learner(model, data.lengths, cc.LearnerOptions(hessian=hessian))
        at = learner.solve(best, data, xs)
        assert at.success and at.status == "Solve_Succeeded" and at.iterations == 0, (at.status, at.iterations)
        np.testing.assert_array_equal(at.theta_vec, best)
        near = learner.solve(best + 1e-3 * model.params.free_mask, data, xs, rho_theta=0.0)
        assert near.success and near.iterations >= 1, (near.status, near.iterations)
        np.testing.assert_allclose(near.theta_vec, best, atol=1e-8)


def _lorenz_record(T, sigma_w=1e-3, seed=0):
    from models import lorenz

    model = lorenz.single_lorenz(process_std=sigma_w, measurement_std=1e-2)
    data, x = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(1, seed=seed), T,
                          process_std=sigma_w, measurement_std=1e-2, seed=seed + 1)
    theta0 = lorenz.perturbed(dict(lorenz.TRUE), 0.1, seed=seed + 2)
    return model, data, x[0], model.theta_vector(theta0)


class _CountingEKF(cc.filtering.EKF):
    """An EKF that records the length of every trajectory it runs over."""

    def __init__(self, model):
        super().__init__(model)
        self.lengths = []

    def run(self, theta_vec, y, u=None, **kw):
        self.lengths.append(len(y))
        return super().run(theta_vec, y, u, **kw)

    def run_many(self, theta_vec, ys, us=None, **kw):
        self.lengths.extend(len(y) for y in ys)
        return super().run_many(theta_vec, ys, us, **kw)


def test_initial_states_choose_the_noise_level_on_prefixes_and_run_the_record_once():
    """Single Lorenz, sigma_w = 1e-3, parameters 10 % off (the noise level matters: a small q
    diverges). Scored on the first 600 of 3000 samples, the EKF picks the same process-noise level
    as scored on all of them, so the initial states are the same arrays; the whole record is
    filtered once instead of once per candidate."""
    from ceem_casadi.smoothing._initial_states import Q_CANDIDATES, eks_states, process_noise_scores

    model, data, x_true, theta_vec = _lorenz_record(3000)
    kw = dict(x0=np.zeros(3), Sigma0=100.0 * np.ones(3), R=model.noise.measurement_std ** 2,
              ekf=cc.filtering.EKF(model))
    on_prefix = process_noise_scores(model, theta_vec, data, steps=600, **kw)
    on_all = process_noise_scores(model, theta_vec, data, steps=None, **kw)
    np.testing.assert_array_equal(on_prefix[0][1], on_all[0][1])
    assert len(on_all) < len(Q_CANDIDATES) or on_all[0][0] - on_all[-1][0] > 100  # the choice matters
    counting = _CountingEKF(model)
    fast = eks_states(model, theta_vec, data, ekf=counting, select_steps=600)
    assert counting.lengths.count(3000) == 1 and max(counting.lengths[:-1]) == 600, counting.lengths
    full = eks_states(model, theta_vec, data, select_steps=None)
    np.testing.assert_array_equal(fast[0], full[0])
    assert np.sqrt(np.mean((fast[0] - x_true) ** 2)) < 1.0  # a usable start


def test_stage_functions_compile_for_many_stages_with_the_same_numbers(monkeypatch):
    """Mapped over enough stages (instructions x stages >= AUTO_COMPILE_WORK, lowered here to fit
    a small record) the learner's stage Functions are compiled, and the learning solve gives the
    same numbers as in CasADi's virtual machine."""
    import pytest

    from ceem_casadi.objective import _stages as stages_mod
    from ceem_casadi.runtime._compile import compiler

    if compiler() is None:
        pytest.skip("no C compiler")
    model, data, x_true, theta_vec = _lorenz_record(400, sigma_w=1e-2)
    out = {}
    for work in (None, 400 * 100):  # default (not compiled at 400 stages), then lowered
        if work is not None:
            monkeypatch.setattr(stages_mod, "AUTO_COMPILE_WORK", work)
        st = stages_mod.StageFunctions(model, "exact")
        learner = cc.learning.Learner(model, data.lengths, cc.LearnerOptions(), st)
        out[work] = (set(st._compiled), learner.solve(theta_vec, data, [x_true]))
    (vm, vm_res), (native, native_res) = out.values()
    assert vm == set() and {"dyn_cost", "dyn_p_grad", "dyn_p_hess"} <= native, (vm, native)
    assert native_res.iterations == vm_res.iterations >= 1
    np.testing.assert_allclose(native_res.theta_vec, vm_res.theta_vec, rtol=1e-12)


def test_ekf_compiled_for_long_records_gives_the_same_numbers(monkeypatch):
    """The EKF's mapaccum step compiled (automatically once steps x instructions reach
    AUTO_COMPILE_WORK, lowered here) gives the virtual machine's filter to the last bit, with
    missing outputs and chunks that do not divide the record."""
    import pytest

    from ceem_casadi.objective import _stages as stages_mod
    from ceem_casadi.runtime._compile import compiler

    if compiler() is None:
        pytest.skip("no C compiler")
    model, data, _, theta_vec = _lorenz_record(1000, sigma_w=1e-2)
    data = data.with_missing(0.2, seed=3)
    kw = dict(x0=np.zeros(3), Sigma0=100.0 * np.ones(3), Q=1e-2 * np.ones(3), R=1e-4 * np.ones(2), engine="casadi")
    vm = cc.filtering.EKF(model, compile=False)
    vm.chunk = 300
    monkeypatch.setattr(stages_mod, "AUTO_COMPILE_WORK", 1000 * 10)
    auto = cc.filtering.EKF(model)
    auto.chunk = 300
    a, b = vm.run(theta_vec, data.y[0], **kw), auto.run(theta_vec, data.y[0], **kw)
    assert vm._native is None and auto._native is not None
    for name in ("x_filt", "P_filt", "x_pred", "P_pred", "y_pred", "S", "A"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.loglik == b.loglik and np.isfinite(a.loglik)
    python = cc.filtering.EKF(model).run(theta_vec, data.y[0], **{**kw, "engine": "python"})
    np.testing.assert_allclose(b.x_filt, python.x_filt, atol=1e-9)
    np.testing.assert_allclose(b.loglik, python.loglik, rtol=1e-10)


def _free_observation_model(rng):
    """x+ = A x + B u, y = C x + B_0 u with A, B, C free: observation stages enter the learning
    objective too."""
    A, B, C = np.array([[0.8, 0.2], [-0.1, 0.7]]), rng.standard_normal((2, 1)), rng.standard_normal((2, 2))
    params = cc.Parameters(cc.Param("A", A, lower=-3.0), cc.Param("B", B), cc.Param("C", C))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.A @ x + p.B @ u,
                                             lambda x, u, p: p.C @ x + p.B[0] * u[0], nx=2, nu=1,
                                             params=params, process_std=[0.1, 0.2], measurement_std=[0.05, 0.5])
    return model, {"A": A, "B": B, "C": C}


def test_learner_chunk_major_layout_equals_the_plain_one(monkeypatch):
    """Learner over many stages in chunks (lowered thresholds: chunks of 64 stages from 100 on,
    two trajectories of 300 and 211 samples, so chunks pad; 10 % missing outputs, inputs, free
    observation parameters): cost, Hessian and the learning solve equal the plain layout's."""
    from ceem_casadi.runtime import _policy as policy

    rng = np.random.default_rng(7)
    model, truth = _free_observation_model(rng)
    us = [rng.standard_normal((300, 1)), rng.standard_normal((211, 1))]
    data, xs = cc.simulate(model, truth, rng.standard_normal((2, 2)), [300, 211], u=us,
                           process_std=model.noise.process_std, measurement_std=model.noise.measurement_std, seed=8)
    data = data.with_missing(0.1, seed=9)
    start = model.theta_vector({"A": truth["A"] + 0.2, "B": truth["B"] - 0.3, "C": truth["C"] + 0.4})
    z = start[model.params.free_index]
    for hessian in ("exact", "gauss-newton"):
        got = {}
        for chunk_from in (10**9, 100):
            monkeypatch.setattr(policy, "LEARN_CHUNK_FROM", chunk_from)
            monkeypatch.setattr(policy, "LEARN_CHUNK", 64)
            learner = cc.learning.Learner(model, data.lengths, cc.LearnerOptions(hessian=hessian))
            P = learner.parameter_vector(start, data, xs, 0.5)
            got[chunk_from] = (learner._chunk, float(learner.cost_function(z, P)),
                               learner.hessian_matrix(start, data, xs), learner.solve(start, data, xs))
        (c0, f0, H0, r0), (c1, f1, H1, r1) = got.values()
        assert (c0, c1) == (0, 64)
        np.testing.assert_allclose(f1, f0, rtol=1e-13)
        np.testing.assert_allclose(H1, H0, rtol=1e-12, atol=1e-12 * np.abs(H0).max())
        assert r1.success and r1.iterations == r0.iterations
        np.testing.assert_allclose(r1.theta_vec, r0.theta_vec, rtol=1e-10, atol=1e-12)
        assert np.abs(r0.theta_vec - start).max() > 0.1


class _InProcessEngine:
    """The engine interface of RemoteLearner over one in-process Learner (as a Dask shard)."""

    def __init__(self, model, data):
        self.learner, self.data = cc.learning.Learner(model, data.lengths, cc.LearnerOptions(use_prior=False)), data

    def learning_session(self, theta_vec, xs):
        return [self.learner.parameter_vector(theta_vec, self.data, xs, 0.0)]

    def reduce(self, session, z, what):
        solver, P = self.learner.solver, session[0]
        f = float(solver.get_function("nlp_f")(z, P))
        g = np.asarray(solver.get_function("nlp_grad_f")(z, P)[1], float).ravel()
        H = np.asarray(solver.get_function("nlp_hess_l")(z, P, 1.0, np.zeros(0)).full())
        return [(np.array([f]), g, np.triu(H).T[np.tril_indices(z.size)], 0.0)], 0  # shard terms as arrays

    def record(self, *args, **kwargs):
        pass


def test_remote_learner_started_at_its_optimum_skips_ipopt():
    """The client-side IPOPT of the distributed learner makes the same start test: at the dense
    optimum no iteration (IPOPT itself stalls there), elsewhere the solve reaches it."""
    from ceem_casadi.learning._remote import RemoteLearner

    rng = np.random.default_rng(5)
    model, truth = _bounded_linear(rng)
    data, xs = cc.simulate(model, truth, np.zeros((1, 2)), [3000], u=[rng.standard_normal((3000, 1))],
                           process_std=model.noise.process_std, measurement_std=0.05, seed=6)
    best = _normal_equations(model, data, xs, model.theta_vector(truth))
    remote = RemoteLearner(_InProcessEngine(model, data), model, cc.LearnerOptions(), "exact")
    at = remote.solve(best, data, xs)
    assert at.success and at.iterations == 0 and at.status == "Solve_Succeeded", (at.status, at.iterations)
    np.testing.assert_array_equal(at.theta_vec, best)
    near = remote.solve(best + 1e-3 * model.params.free_mask, data, xs, rho_theta=0.0)
    assert near.success and near.iterations >= 1
    np.testing.assert_allclose(near.theta_vec, best, atol=1e-8)
