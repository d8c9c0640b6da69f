"""Every documented input error is raised with a message naming expected vs given."""
import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from models import lorenz


@pytest.fixture(scope="module")
def setup():
    model = lorenz.single_lorenz()
    data, xs = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(1, seed=0), 20, measurement_std=0.01)
    return model, data, xs


def test_data_shape_errors():
    with pytest.raises(cc.ShapeError, match=r"expected an array \(B, T, n\)"):
        cc.Trajectories(np.zeros((2, 3, 4, 5)))
    with pytest.raises(cc.ShapeError, match=r"expected 2 output columns like y\[0\], got 3"):
        cc.Trajectories([np.zeros((10, 2)), np.zeros((10, 3))])
    with pytest.raises(cc.ShapeError, match=r"u\[0\]: expected shape \(10, 1\), got \(9, 1\)"):
        cc.Trajectories([np.zeros((10, 2))], [np.zeros((9, 1))])
    with pytest.raises(cc.ShapeError, match="expected 1 trajectories like y, got 2"):
        cc.Trajectories([np.zeros((10, 2))], [np.zeros((10, 1))] * 2)


def test_non_finite_inputs_and_inf_observations():
    u = np.zeros((10, 1))
    u[3] = np.nan
    with pytest.raises(cc.NonFiniteError, match=r"u\[0\] contains NaN or inf"):
        cc.Trajectories([np.zeros((10, 2))], [u])
    y = np.zeros((10, 2))
    y[1, 1] = np.inf
    with pytest.raises(cc.NonFiniteError, match="contains inf; use NaN for missing"):
        cc.Trajectories([y])
    y[1, 1] = np.nan  # NaN is fine: a missing observation
    assert np.isnan(cc.Trajectories([y]).y[0][1, 1])


def test_data_model_mismatch(setup):
    model, _, _ = setup
    with pytest.raises(cc.ShapeError, match="data has ny=3 output columns, the model observes ny=2"):
        cc.ceem(model, cc.Trajectories([np.zeros((10, 3))]), lorenz.TRUE)


def test_unknown_and_missing_parameter_names(setup):
    model, data, _ = setup
    with pytest.raises(cc.ParameterError, match=r"unknown parameter name\(s\) \['gamma'\]"):
        cc.ceem(model, data, {**lorenz.TRUE, "gamma": 1.0})
    with pytest.raises(cc.ParameterError, match=r"missing value\(s\) for parameter\(s\) \['beta'\]"):
        cc.ceem(model, data, {"sigma": 10.0, "rho": 28.0})
    with pytest.raises(KeyError):  # typed errors subclass builtins
        model.params.to_vector({"sigma": 1.0})


def test_parameter_shape_and_bounds(setup):
    model, data, _ = setup
    with pytest.raises(cc.ShapeError, match=r"parameter 'sigma': expected shape \(\), got \(2,\)"):
        cc.ceem(model, data, {**lorenz.TRUE, "sigma": [1.0, 2.0]})
    with pytest.raises(cc.ParameterError, match="parameter 'beta': value -1.0 outside its bounds"):
        cc.ceem(model, data, {**lorenz.TRUE, "beta": -1.0})
    with pytest.raises(cc.NonFiniteError, match="parameter 'rho': values must be finite"):
        cc.ceem(model, data, {**lorenz.TRUE, "rho": np.nan})
    with pytest.raises(cc.ParameterError, match="lower bound above upper bound"):
        cc.Param("a", 1.0, lower=2.0, upper=1.0)
    with pytest.raises(cc.ParameterError, match="duplicate parameter names"):
        cc.Parameters(cc.Param("a"), cc.Param("a"))
    with pytest.raises(cc.ShapeError, match=r"free of shape \(3,\) does not fit the parameter shape \(2, 2\)"):
        cc.Param("M", np.eye(2), free=[True, False, True])


def test_model_function_wrong_shape_or_nan():
    params = cc.Parameters(cc.Param("a", 1.0))
    with pytest.raises(cc.errors.ModelError, match=r"must return 2 entries \(nx\), got shape \(3, 1\)"):
        cc.StateSpaceModel.from_discrete(lambda x, u, p: ca.vertcat(x, p.a), lambda x, u, p: x[0], nx=2,
                                         params=params)
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: ca.sqrt(p.a) * x, lambda x, u, p: x[0], nx=2,
                                             params=params)
    data = cc.Trajectories([np.ones((10, 1))])
    with pytest.raises(cc.errors.ModelError, match="returns non-finite values at the initial guess"):
        cc.ceem(model, data, {"a": -1.0})


def test_options_validate_themselves():
    with pytest.raises(ValueError, match="rho_x must be >= 0"):
        cc.SmootherOptions(rho_x=-1)
    with pytest.raises(ValueError, match="hessian must be one of"):
        cc.LearnerOptions(hessian="bfgs")
    with pytest.raises(ValueError, match="n_jobs must be >= 1"):
        cc.CEEMOptions(n_jobs=0)
    with pytest.raises(cc.ShapeError, match="dt must be a positive sample time"):
        cc.StateSpaceModel.from_ode(lorenz.lorenz_rhs, lambda x, u, p: x, nx=3, dt=0.0,
                                    params=lorenz.single_lorenz().params)
    with pytest.raises(cc.NonFiniteError, match="process_std: expected finite positive values"):
        lorenz.single_lorenz(process_std=0.0)


def test_x_init_validation(setup):
    model, data, xs = setup
    with pytest.raises(cc.ShapeError, match=r"x_init\[0\]: expected shape \(20, 3\), got \(19, 3\)"):
        cc.ceem(model, data, lorenz.TRUE, x_init=[xs[0][:-1]])


def test_solver_failure_is_reported_not_hidden():
    """A smoothing NLP that is NaN at its starting point: status solver_failed, last good iterate
    kept, and SolverError when the caller asks for it."""
    params = cc.Parameters(cc.Param("a", 0.5))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * ca.sqrt(x), lambda x, u, p: x, nx=1,
                                             params=params, process_std=0.1, measurement_std=0.1)
    data = cc.Trajectories([np.full((10, 1), 0.25)])
    x_init = np.full((10, 1), 0.25)
    x_init[5] = -1.0  # sqrt(-1): the objective is NaN at the start
    res = cc.ceem(model, data, {"a": 0.5}, x_init=[x_init])
    assert res.status == "solver_failed" and not res.success
    assert "smoothing failed on trajectories [0]" in res.message and "last good iterate" in res.message
    np.testing.assert_array_equal(res.x[0], x_init)
    assert res.theta["a"] == 0.5
    with pytest.raises(cc.SolverError, match="smoothing failed"):
        cc.ceem(model, data, {"a": 0.5}, x_init=[x_init], options=cc.CEEMOptions(raise_on_failure=True))
