"""Model structure: parameters, tracing, integrators, simulation."""
import casadi as ca
import numpy as np
import pytest
import scipy.linalg

import ceem_casadi as cc
from models import lorenz


def test_parameters_roundtrip_and_matrix_symbols():
    params = cc.Parameters(cc.Param("a", 1.0), cc.Param("M", np.arange(6.0).reshape(2, 3),
                                                         free=[[True, False, True], [True, True, False]]))
    theta = params.initial()
    vec = params.to_vector(theta)
    assert vec.shape == (7,) and params.free_index.tolist() == [0, 1, 3, 4, 5]
    back = params.from_vector(vec)
    np.testing.assert_array_equal(back["M"], theta["M"])
    p = params.symbols(ca.DM(vec))
    np.testing.assert_array_equal(np.asarray(ca.DM(p.M)), theta["M"])  # row-major view


def test_rk4_is_fourth_order_against_expm():
    A = np.array([[0.0, 1.0], [-4.0, -0.3]])
    params = cc.Parameters(cc.Param("A", A))
    x0 = np.array([1.0, 0.0])
    exact = scipy.linalg.expm(A * 0.4) @ x0
    errs = []
    for sub in (1, 2, 4, 8):
        m = cc.StateSpaceModel.from_ode(lambda x, u, p: p.A @ x, lambda x, u, p: x[0], nx=2, dt=0.4,
                                        params=params, substeps=sub)
        errs.append(np.linalg.norm(np.asarray(m.f(x0, [], A.ravel())).ravel() - exact))
    orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all(orders > 3.8), orders


def test_simulate_is_seeded_and_shapes():
    model = lorenz.single_lorenz()
    x0 = lorenz.initial_states(3, seed=0)
    d1, x1 = cc.simulate(model, lorenz.TRUE, x0, 50, process_std=0.1, measurement_std=0.5, seed=4)
    d2, x2 = cc.simulate(model, lorenz.TRUE, x0, 50, process_std=0.1, measurement_std=0.5, seed=4)
    assert len(d1) == 3 and d1.y[0].shape == (50, 2) and x1[0].shape == (50, 3)
    np.testing.assert_array_equal(d1.y[2], d2.y[2])
    resid = d1.y[0] - x1[0] @ lorenz.C_SINGLE.T
    assert 0.3 < resid.std() < 0.7


def test_coupled_lorenz_structure_and_dynamics_error():
    theta, C = lorenz.coupled_truth(6, seed=0)
    model = lorenz.coupled_lorenz(6, C)
    assert (model.nx, model.ny, model.params.size) == (18, 16, 18 + 324)
    assert model.params.free_index.size == 18 + 324 - 54
    assert lorenz.dynamics_error(model, theta, theta) == 0.0
    guess = lorenz.perturbed(theta, 0.1, seed=1)
    assert 5 < lorenz.dynamics_error(model, guess, theta) < 200


def test_a_prior_on_x1_needs_both_mean_and_std_on_every_path():
    """with_noise and from_functions check the x_1 prior like the constructor (StateSpaceModel._noise)."""
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.5 * x, lambda x, u, p: x, nx=1)
    for make in (lambda: model.with_noise(x1_mean=1.0),
                 lambda: cc.StateSpaceModel.from_functions(model.f, model.g, x1_std=0.1)):
        with pytest.raises(cc.errors.ShapeError, match="give both x1_mean and x1_std"):
            make()
    assert model.with_noise(x1_mean=1.0, x1_std=0.1).noise.inv_x1_std[0] == 10.0
