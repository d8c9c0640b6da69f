"""NumpyFunction replays an MX Function's instructions with numpy: same values as CasADi."""
from __future__ import annotations

import casadi as ca
import numpy as np
import pytest

from ceem_casadi.learning import AdamLearner, AdamOptions
from ceem_casadi.model import MLP, Parameters, StateSpaceModel
from ceem_casadi.runtime import NumpyFunction


def _agree(fun, args, rtol=1e-13):
    got, want = NumpyFunction(fun)(*args), [np.asarray(o) for o in fun(*args)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * (1 + np.abs(w).max()))


def test_network_cost_and_its_reverse_mode_gradient_agree_with_casadi():
    # an MLP on sample columns, its squared-error cost and the gradient in the flat parameters:
    # matrix products (with transposes), tanh, repmat / repsum, nonzero slices and adds
    rng = np.random.default_rng(0)
    net = MLP((5, 8, 8, 3), name="h")
    params = Parameters(*net.params(rng))
    p, X, Y = ca.MX.sym("p", params.size), ca.MX.sym("X", 5, 40), ca.MX.sym("Y", 3, 40)
    cost = 0.5 * ca.sumsqr(Y - net(params.symbols(p), X))
    fun = ca.Function("f", [p, X, Y], [cost, ca.gradient(cost, p), ca.jacobian(cost, X)])
    _agree(fun, [rng.normal(size=params.size), rng.normal(size=(5, 40)), rng.normal(size=(3, 40))])


def test_nonzero_access_concatenation_and_sparse_products_agree_with_casadi():
    rng = np.random.default_rng(1)
    x, y = ca.MX.sym("x", 6), ca.MX.sym("y", 3, 4)
    z = ca.MX(x)
    z[[4, 0, 2]] = x[[1, 1, 5]] * 3.0                     # SETNONZEROS with an index list
    S = ca.DM(ca.Sparsity.lower(3), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])   # a sparse constant factor
    M = ca.mtimes(S, y) + ca.repmat(x[0:3], 1, 4)
    out = [z, ca.vertcat(ca.horzcat(M, y), ca.horzcat(y, M)), ca.reshape(M, 2, 6).T, ca.exp(x) / (1 + x ** 2),
           ca.dot(M, y), ca.sum2(M), ca.mac(S, y, M)]     # mac: z + S y with z nonzero
    fun = ca.Function("g", [x, y], out)
    _agree(fun, [rng.normal(size=6), rng.normal(size=(3, 4))])


def test_unsupported_operations_and_sx_functions_are_refused_before_evaluating():
    x = ca.MX.sym("x", 2)
    with pytest.raises(NotImplementedError, match="ATAN2"):
        NumpyFunction(ca.Function("f", [x], [ca.atan2(x[0], x[1])]))
    s = ca.SX.sym("s")
    with pytest.raises(NotImplementedError, match="MX"):
        NumpyFunction(ca.Function("f", [s], [s * 2]))


def test_wrong_input_sizes_say_what_was_expected():
    x = ca.MX.sym("x", 3, 2)
    f = NumpyFunction(ca.Function("f", [x], [2 * x]))
    with pytest.raises(ValueError, match=r"needs \(3, 2\)"):
        f(np.ones(5))


def test_adam_learner_gradients_by_numpy_equal_the_mapped_model_functions():
    # the learner's batch Functions are replayed by numpy; its full objective and gradient must
    # equal an independent computation through model.g / model.f mapped over the columns
    rng = np.random.default_rng(2)
    net = MLP((3, 6, 2), name="head")
    params = Parameters(*net.params(rng))

    def step(x, u, p):
        return 0.9 * x

    def observe(x, u, p):
        return net(p, ca.vertcat(x, u))

    model = StateSpaceModel.from_discrete(step, observe, nx=2, nu=1, params=params)
    al = AdamLearner(model, AdamOptions(), step=step, observe=observe)
    al.chunk = 16
    assert all(isinstance(f, NumpyFunction) for f in al._functions(16))
    theta = params.to_vector(net.init(rng))
    T = 25
    xs, u, y = rng.normal(size=(T, 2)), rng.normal(size=(T, 1)), rng.normal(size=(T, 2))
    from ceem_casadi.io import Trajectories
    F, g = al.objective(theta, Trajectories([y], [u]), [xs], gradient=True)
    # independent: the same sums through the model's own Functions
    pv = ca.MX.sym("p", params.size)
    G = model.g.map(T)(xs.T, u.T, pv)
    Fx = model.f.map(T - 1)(xs[:-1].T, u[:-1].T, pv)
    c = 0.5 * ca.sumsqr(y.T - G) + 0.5 * ca.sumsqr(xs[1:].T - Fx)
    ref = ca.Function("ref", [pv], [c, ca.gradient(c, pv)])
    want_F, want_g = (np.asarray(v).ravel() for v in ref(theta))
    np.testing.assert_allclose(F, want_F[0], rtol=1e-12)
    np.testing.assert_allclose(g, want_g, rtol=1e-10, atol=1e-12)


def test_elementwise_operations_match_casadi_on_nan_inf_and_signed_zeros():
    """Every elementwise operation NumpyFunction supports gives CasADi's value (bitwise, NaN as NaN)
    on NaN, inf and signed zeros: fmax(NaN, 0) is 0 as in CasADi (it was NaN with np.maximum). Fails
    with np.maximum / np.minimum in runtime/_numpy_eval._BINARY."""
    import casadi as ca
    import numpy as np

    from ceem_casadi.runtime import NumpyFunction
    from ceem_casadi.runtime._numpy_eval import _BINARY, _UNARY

    values = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -2.5, 0.5])
    a, b = np.meshgrid(values, values)
    a, b = a.reshape(1, -1), b.reshape(1, -1)
    x, y = ca.MX.sym("x", 1, a.size), ca.MX.sym("y", 1, a.size)
    ops = [(op, ca.MX.binary(op, x, y)) for op in _BINARY] + [(op, ca.MX.unary(op, x)) for op in _UNARY]
    for op, expr in ops:
        f = ca.Function("f", [x, y], [expr])
        want = np.asarray(f(a, b), float)
        with np.errstate(all="ignore"):
            got = np.asarray(NumpyFunction(f)(a, b), float).reshape(want.shape)
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        assert same.all() and (np.signbit(got[same & (want == 0)]) == np.signbit(want[same & (want == 0)])).all(), \
            (op, a[~same], b[~same], got[~same], want[~same])
