"""ceem_casadi.learner_adam: the Adam learning step minimises the IPOPT Learner's objective
(same value and gradient; same optimum), respects fixed entries, and drives ceem()."""
import itertools

import casadi as ca
import numpy as np
import pytest

from ceem_casadi.em._ceem import ceem
from ceem_casadi.em._options import CEEMOptions
from ceem_casadi.errors import ModelError, OptionsError
from ceem_casadi.io._data import Trajectories
from ceem_casadi.learning import AdamLearner, AdamOptions
from ceem_casadi.learning._learner import Learner
from ceem_casadi.learning._options import LearnerOptions
from ceem_casadi.model._model import StateSpaceModel
from ceem_casadi.model._nn import MLP
from ceem_casadi.model._params import Param, Parameters
from ceem_casadi.smoothing._options import SmootherOptions

RHO = 0.5


def _problem(seed=0, B=3, T=40, convex=False):
    """x+ = A x + B u, y = C x + MLP(x) (2 -> 4 -> 1); A[0, 1] fixed, prior on C, one missing y.

    ``convex``: the head's hidden layer is fixed, so the learning objective is quadratic in the
    free parameters (unique optimum)."""
    rng = np.random.default_rng(seed)
    head = MLP((2, 4, 1), name="head")
    free_A = np.array([[True, False], [True, True]])
    hidden = {"head_W0", "head_b0"} if convex else set()
    params = Parameters(Param("A", 0.9 * np.eye(2), free=free_A), Param("B", np.zeros((2, 1))),
                        Param("C", np.ones((1, 2)), prior_mean=np.zeros((1, 2)), prior_std=2.0),
                        *[Param(k, v, free=k not in hidden) for k, v in head.init(rng, last_scale=0.5).items()])
    model = StateSpaceModel.from_discrete(
        lambda x, u, p: ca.mtimes(p.A, x) + ca.mtimes(p.B, u),
        lambda x, u, p: ca.mtimes(p.C, x) + head(p, x), nx=2, nu=1, params=params,
        process_std=0.5, measurement_std=1.0, name="adam_test")
    ys = [rng.normal(size=(T, 1)) for _ in range(B)]
    ys[0][5] = np.nan
    data = Trajectories(ys, [rng.normal(size=(T, 1)) for _ in range(B)])
    xs = [rng.normal(size=(T, 2)) for _ in range(B)]
    theta = model.theta_vector({q.name: q.array("value") for q in params})
    return model, data, xs, theta


def test_objective_and_gradient_match_ipopt_learner():
    model, data, xs, theta = _problem()
    ref = Learner(model, data.lengths, LearnerOptions(rho_theta=RHO, hessian="exact"))
    al = AdamLearner(model, AdamOptions(rho_theta=RHO))
    al.chunk = 50                                            # 3 chunks, padded
    rng = np.random.default_rng(5)
    point = theta.copy()
    point[ref.free] += 0.1 * rng.normal(size=ref.free.size)                 # off the trust-region centre
    P = ref.parameter_vector(theta, data, xs, RHO)
    F, g = al.objective(point, data, xs, theta_prev=theta, gradient=True)
    assert F == pytest.approx(float(ref.cost_function(point[ref.free], P)), rel=1e-12)
    eps, fd = 1e-6, []
    for e in np.eye(ref.free.size):
        z = point[ref.free]
        fd.append((float(ref.cost_function(z + eps * e, P)) - float(ref.cost_function(z - eps * e, P))) / (2 * eps))
    np.testing.assert_allclose(g[ref.free], fd, rtol=1e-6, atol=1e-6)
    fixed = np.setdiff1d(np.arange(theta.size), ref.free)
    assert fixed.size == 1 and g[fixed] == 0.0
    # the dynamics parameters (A, B) get lr_dynamics, the rest lr_observation
    names = [q.name for q in model.params for _ in range(q.size)]
    assert {n for n, d in zip(names, al.dynamics_mask) if d} == {"A", "B"}


@pytest.mark.parametrize("batch,epochs,tol", [(512, 2000, 1e-7), (32, 600, 1e-3)])
def test_solve_reaches_ipopt_optimum(batch, epochs, tol):
    """Quadratic learning objective (unique optimum): full batch, Adam converges to the IPOPT
    optimum; mini-batches of 32 (of 120 columns): within tol relative to the decrease F0 - F*."""
    model, data, xs, theta = _problem(convex=True)
    ref = Learner(model, data.lengths, LearnerOptions(rho_theta=RHO, hessian="exact", max_iters=500, tol=1e-12))
    opt = ref.solve(theta, data, xs)
    assert opt.success
    al = AdamLearner(model, AdamOptions(rho_theta=RHO, epochs=epochs, batch_size=batch, lr_dynamics=3e-2,
                                               lr=3e-2, decay=0.003 if batch > 120 else 0.02))
    F0 = al.objective(theta, data, xs)
    res = al.solve(theta, data, xs)
    assert res.success and res.iterations == epochs * (1 if batch > 120 else 4)
    assert res.cost == pytest.approx(al.objective(res.theta_vec, data, xs, theta_prev=theta), rel=1e-12)
    assert res.cost - opt.cost <= tol * (F0 - opt.cost), (res.cost, opt.cost, F0)
    fixed = np.setdiff1d(np.arange(theta.size), ref.free)
    assert np.array_equal(res.theta_vec[fixed], theta[fixed])


def test_nonconvex_solve_ends_at_a_local_optimum():
    """With the whole head free the objective has several local minima (Adam and IPOPT from the
    same start can end in different ones): Adam's point is stationary, and IPOPT started there
    stays there."""
    model, data, xs, theta = _problem()
    ref = Learner(model, data.lengths, LearnerOptions(rho_theta=RHO, hessian="exact", max_iters=500, tol=1e-12))
    al = AdamLearner(model, AdamOptions(rho_theta=RHO, epochs=2000, lr_dynamics=3e-2, lr=3e-2,
                                               decay=0.003))
    res = al.solve(theta, data, xs)
    F, g = al.objective(res.theta_vec, data, xs, theta_prev=theta, gradient=True)
    assert np.abs(g).max() < 1e-3 * np.abs(al.objective(theta, data, xs, gradient=True)[1]).max()
    sol = ref.solver(x0=res.theta_vec[ref.free], p=ref.parameter_vector(theta, data, xs, RHO))
    assert float(sol["f"]) == pytest.approx(F, rel=1e-8)
    assert float(sol["f"]) >= ref.solve(theta, data, xs).cost - 1e-9       # IPOPT's own minimum is no higher


def test_never_returns_a_worse_point():
    model, data, xs, theta = _problem()
    al = AdamLearner(model, AdamOptions(rho_theta=RHO, epochs=3, lr_dynamics=50.0, lr=50.0))
    res = al.solve(theta, data, xs)                      # absurd steps: F goes up, start is kept
    assert np.array_equal(res.theta_vec, theta) and res.cost == pytest.approx(al.objective(theta, data, xs))


def test_drives_ceem():
    model, data, xs, theta = _problem()
    al = AdamLearner(model, AdamOptions(rho_theta=RHO, epochs=50, batch_size=64, lr_dynamics=1e-2,
                                               lr=1e-2))
    res = ceem(model, data, model.params.from_vector(theta), x_init=xs, learner=al,
               options=CEEMOptions(max_iters=3, smoother=SmootherOptions(rho_x=RHO),
                                   learner=LearnerOptions(rho_theta=RHO)))
    assert res.status != "solver_failed", res.message
    obj = [r.objective for r in res.history]           # J + log prior (C has a prior)
    assert len(obj) >= 2 and all(r.increase >= -1e-9 * abs(r.objective) for r in res.history), obj
    assert all(b >= a - 1e-9 * abs(a) for a, b in itertools.pairwise(obj)), obj
    assert res.history[0].increase > 1.0


def test_matrix_valued_step_observe_equal_mapped_functions():
    model, data, xs, theta = _problem()
    head = MLP((2, 4, 1), name="head")

    def step(x, u, p):
        return ca.mtimes(p.A, x) + ca.mtimes(p.B, u)

    def observe(x, u, p):
        return ca.mtimes(p.C, x) + head(p, x)

    fast = AdamLearner(model, AdamOptions(rho_theta=RHO), step=step, observe=observe)
    mapped = AdamLearner(model, AdamOptions(rho_theta=RHO))
    fast.chunk = mapped.chunk = 64
    point = theta + 0.05 * np.random.default_rng(1).normal(size=theta.size)
    Ff, gf = fast.objective(point, data, xs, theta_prev=theta, gradient=True)
    Fm, gm = mapped.objective(point, data, xs, theta_prev=theta, gradient=True)
    assert Ff == pytest.approx(Fm, rel=1e-12)
    np.testing.assert_allclose(gf, gm, rtol=1e-10, atol=1e-10)
    with pytest.raises(ModelError, match="observe= on sample columns differs"):
        AdamLearner(model, observe=lambda x, u, p: ca.mtimes(p.C, x))               # head missing
    with pytest.raises(ModelError, match="step="):                                # per-column code
        AdamLearner(model, step=lambda x, u, p: ca.vertcat(x[0, 0], x[1, 0]) + ca.mtimes(p.B, u))


def test_bad_options():
    with pytest.raises(OptionsError, match="lr_dynamics"):
        AdamOptions(lr_dynamics=0.0)
    with pytest.raises(OptionsError, match="batch_size"):
        AdamOptions(batch_size=0)
    with pytest.raises(TypeError, match="AdamOptions"):
        AdamLearner(None, LearnerOptions())
