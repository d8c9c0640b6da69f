"""Model construction errors name the argument to fix (issue 14, item 7)."""
import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc

PARAMS = cc.Parameters(cc.Param("a", 1.0), cc.Param("D", np.ones((1, 2))))


def _ode(rhs, observe=lambda x, u, p: x[0], **kw):
    return cc.StateSpaceModel.from_ode(rhs, observe, dt=0.1, params=PARAMS, **kw)


def test_forgotten_nu_in_from_ode_names_nu():
    # the case: the input is used but nu=1 is missing (CasADi alone: "slice.cpp ... stop<=len")
    with pytest.raises(cc.errors.ModelError, match=r"rhs: the right-hand side function uses u\[0\] but the model was "
                                            r"declared with nu=0: pass nu=1"):
        _ode(lambda x, u, p: ca.vertcat(x[1], -p.a * x[0] + u[0]), nx=2)
    _ode(lambda x, u, p: ca.vertcat(x[1], -p.a * x[0] + u[0]), nx=2, nu=1)  # the fix works


def test_inputs_beyond_nu_in_step_and_observe():
    with pytest.raises(cc.errors.ModelError, match=r"f: the step function uses u\[3\] .* nu=1: pass nu=4"):
        cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u[3], lambda x, u, p: x[0], nx=2, nu=1,
                                         params=PARAMS)
    # a matrix product needs the exact width: D is (1, 2), so nu=2
    with pytest.raises(cc.errors.ModelError, match=r"observe: the observation function uses u\[1\] .* nu=0: pass nu=2"):
        _ode(lambda x, u, p: ca.vertcat(x[1], -p.a * x[0]), lambda x, u, p: x[0] + p.D @ u, nx=2)


def test_states_beyond_nx():
    with pytest.raises(cc.errors.ModelError, match=r"uses x\[2\] but the model was declared with nx=2: pass nx=3"):
        _ode(lambda x, u, p: ca.vertcat(x[1], -p.a * x[2], x[0]), nx=2)


def test_wrong_output_sizes_name_nx_and_the_output_size():
    with pytest.raises(cc.errors.ModelError, match=r"must return 2 entries \(nx\), got shape \(3, 1\): return nx=2 "
                                            r"entries, or declare nx=3"):
        _ode(lambda x, u, p: ca.vertcat(x[1], -p.a * x[0], x[0]), nx=2)
    with pytest.raises(cc.errors.ModelError, match=r"observe returns 1 outputs \(ny\) but measurement_std has 3 entries"):
        _ode(lambda x, u, p: ca.vertcat(x[1], -p.a * x[0]), nx=2, measurement_std=[0.1, 0.2, 0.3])
    with pytest.raises(cc.errors.ModelError, match=r"observe: .* must return a vector \(ny,\), got shape \(2, 2\)"):
        _ode(lambda x, u, p: ca.vertcat(x[1], -p.a * x[0]), lambda x, u, p: x @ x.T, nx=2)


def test_undeclared_parameter_and_other_failures():
    with pytest.raises(cc.errors.ModelError, match="no attribute 'b'; declare every parameter"):
        _ode(lambda x, u, p: ca.vertcat(x[1], -p.b * x[0]), nx=2)
    with pytest.raises(cc.errors.ModelError, match=r"failed when traced with x \(2,\), u \(0,\) .* ZeroDivisionError"):
        _ode(lambda x, u, p: ca.vertcat(x[1], x[0]) * (1 / 0), nx=2)
