"""Smoother(observe=...): the batched smoother's observation terms from a column-wise observation
map, evaluated by numpy, give the scalar stage programs' terms and the same smoothing optimum."""
from __future__ import annotations

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.errors import ModelError
from ceem_casadi.model import MLP, Parameters, StateSpaceModel
from ceem_casadi.objective import StageFunctions
from ceem_casadi.smoothing import ObservationColumns, Smoother

NX, NU, NY = 3, 1, 2


def _head_model(seed=0):
    """x+ = A x + B u with a small tanh network head y = C x + MLP([x; u])."""
    rng = np.random.default_rng(seed)
    head = MLP((NX + NU, 5, NY), name="head")
    params = Parameters(cc.Param("A", 0.8 * np.eye(NX) + 0.05 * rng.normal(size=(NX, NX))),
                        cc.Param("B", rng.normal(size=(NX, NU))), cc.Param("C", rng.normal(size=(NY, NX))),
                        *head.params(rng))

    def step(x, u, p):
        return ca.mtimes(p.A, x) + ca.mtimes(p.B, u)

    def observe(x, u, p):
        return ca.mtimes(p.C, x) + head(p, ca.vertcat(x, u))

    model = StateSpaceModel.from_discrete(step, observe, nx=NX, nu=NU, params=params, process_std=0.3,
                                          measurement_std=0.2)
    theta = params.to_vector({q.name: q.array("value") for q in params})
    return model, theta, observe


def _data(model, theta, B=5, T=30, seed=1):
    rng = np.random.default_rng(seed)
    ys, us, xs = [], [], []
    for _ in range(B):
        u = rng.normal(size=(T, NU))
        x = np.zeros((T, NX))
        x[0] = rng.normal(size=NX)
        for t in range(T - 1):
            x[t + 1] = np.asarray(model.f(x[t], u[t], theta)).ravel() + 0.3 * rng.normal(size=NX)
        y = np.array([np.asarray(model.g(x[t], u[t], theta)).ravel() for t in range(T)]) + 0.2 * rng.normal(size=(T, NY))
        y[rng.random(y.shape) < 0.1] = np.nan                     # missing entries
        ys.append(y), us.append(u), xs.append(x)
    return cc.Trajectories(ys, us), xs


def test_observation_terms_equal_the_scalar_stage_program():
    """cost, gradient and the upper Gauss-Newton Hessian triangles of 40 stages (layout of the
    mapped ``obs_x_newton``) equal the compiled-free scalar program's to 1e-12."""
    model, theta, observe = _head_model()
    N, rng = 40, np.random.default_rng(3)
    X, U, Y = rng.normal(size=(NX, N)), rng.normal(size=(NU, N)), rng.normal(size=(NY, N))
    M, iv = (rng.random((NY, N)) > 0.2).astype(float), np.array([2.0, 0.5])
    c, g, h = ObservationColumns(model, observe, N).newton(X, U, Y, M, theta, iv)
    ref = StageFunctions(model, compile=False).obs_x_newton
    co, go, ho = (np.asarray(v) for v in ref.map(N, [False] * 4 + [True, True], [False] * 3)(X, U, Y, M, theta, iv))
    np.testing.assert_allclose(c, co.ravel(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(g, go, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(h, ho, rtol=1e-12, atol=1e-13)
    cost = ObservationColumns(model, observe, N).cost(X, U, Y, M, theta, iv)
    np.testing.assert_allclose(cost, co.ravel(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("hessian", ["gauss-newton", "exact"])
def test_smoother_with_columnwise_observe_reaches_the_same_optimum(hessian):
    """Five trajectories with missing outputs, rho_x = 0.2, from perturbed states: states and
    costs equal the scalar path's to 1e-9 (exact Hessian: observe= is not used, same path)."""
    model, theta, observe = _head_model()
    data, xs = _data(model, theta)
    rng = np.random.default_rng(5)
    x0 = [x + 0.3 * rng.normal(size=x.shape) for x in xs]
    opts = cc.SmootherOptions(rho_x=0.2, hessian=hessian, tol=1e-10, compile=False)
    plain = Smoother(model, opts).solve(theta, data, x0)
    cols = Smoother(model, opts, observe=observe)
    got = cols.solve(theta, data, x0)
    objective = cols._batched[30].objective
    assert (objective.observe is not None) == (hessian == "gauss-newton")
    for a, b in zip(plain, got):
        assert b.success and b.status == a.status
        np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-9 * np.abs(a.x).max())
        assert b.cost == pytest.approx(a.cost, rel=1e-9)
    J_plain = Smoother(model, opts).joint_log_density(theta, data, [r.x for r in got])
    assert cols.joint_log_density(theta, data, [r.x for r in got]) == pytest.approx(J_plain, rel=1e-12)


def test_observe_that_differs_from_the_model_is_refused():
    model, theta, observe = _head_model()
    with pytest.raises(ModelError, match="observe= on sample columns differs"):
        Smoother(model, observe=lambda X, U, p: 2 * observe(X, U, p))


def test_operations_numpy_does_not_replay_fall_back_to_the_scalar_programs():
    """An observe with atan2 (not replayed by numpy): the smoother falls back to the scalar
    programs and gives the same states as without observe=."""
    model = StateSpaceModel.from_discrete(lambda x, u, p: 0.9 * x, lambda x, u, p: ca.atan2(x[0], 1 + x[1] ** 2), nx=2)
    rng = np.random.default_rng(0)
    data = cc.Trajectories([rng.normal(size=(20, 1)) for _ in range(3)])
    x0 = [np.zeros((20, 2))] * 3
    opts = cc.SmootherOptions(rho_x=0.1, compile=False)
    cols = Smoother(model, opts, observe=lambda X, U, p: ca.atan2(X[0, :], 1 + X[1, :] ** 2))
    got = cols.solve(np.zeros(0), data, x0)
    assert cols._batched[20].objective.observe is None
    for a, b in zip(Smoother(model, opts).solve(np.zeros(0), data, x0), got):
        np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-12)
