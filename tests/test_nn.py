"""ceem_casadi.nn: MLP expressions (symbolic == numpy), Glorot init, Adam fits a known function."""
import casadi as ca
import numpy as np
import pytest

from ceem_casadi.errors import OptionsError, ShapeError
from ceem_casadi.learning import AdamOptions
from ceem_casadi.model._model import StateSpaceModel
from ceem_casadi.model._nn import MLP, adam, flat_params, mse_loss_factory, namespace
from ceem_casadi.model._params import Parameters


def test_mlp_symbolic_equals_numpy_and_batch():
    rng = np.random.default_rng(0)
    net = MLP((3, 5, 2))
    params, w0, w, p = flat_params(net, rng=rng)
    X = rng.normal(size=(3, 7))
    Xs = ca.MX.sym("X", 3, 7)
    f = ca.Function("f", [w, Xs], [net(p, Xs)])
    ns = namespace(params, w0)
    W0, b0, W1, b1 = ns.mlp_W0, ns.mlp_b0, ns.mlp_W1, ns.mlp_b1
    ref = W1 @ np.tanh(W0 @ X + b0[:, None]) + b1[:, None]
    np.testing.assert_allclose(np.asarray(f(w0, X)), ref, atol=1e-12)
    np.testing.assert_allclose(net(ns, X), ref, atol=1e-12)
    # one column through a StateSpaceModel observation
    model = StateSpaceModel.from_discrete(lambda x, u, q: x, lambda x, u, q: net(q, x), nx=3,
                                          params=Parameters(*net.params(np.random.default_rng(0))))
    np.testing.assert_allclose(np.asarray(model.g(X[:, 0], [], w0)).ravel(), ref[:, 0], atol=1e-12)


def test_glorot_limits_and_seed():
    net = MLP((20, 32, 6))
    a = net.init(np.random.default_rng(1))
    b = net.init(np.random.default_rng(1))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert np.abs(a["mlp_W0"]).max() <= np.sqrt(6 / 52) and np.abs(a["mlp_W0"]).max() > 0.8 * np.sqrt(6 / 52)
    assert np.all(a["mlp_b0"] == 0)
    assert np.all(net.init(np.random.default_rng(1), last_scale=0.0)["mlp_W1"] == 0)


def test_adam_fits_smooth_function():
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, size=(2, 2048))
    Y = np.vstack([np.sin(X[0]) * np.cos(X[1])])
    net = MLP((2, 16, 16, 1))
    params, w0, _, _ = flat_params(net, rng=rng)
    make = mse_loss_factory(net, params)
    L0 = float(make(2048)(w0, X, Y))
    res = adam(make, w0, (X, Y), options=AdamOptions(lr=1e-2, decay=0.05, epochs=60, batch_size=256),
               valid=(X[:, :512], Y[:, :512]))
    L1 = float(make(2048)(res.w, X, Y))
    assert L1 < 0.02 * L0 and L1 < 3e-3, (L0, L1)
    assert res.valid_loss and min(res.valid_loss) == pytest.approx(float(make(512)(res.w, X[:, :512], Y[:, :512])))


def test_bad_options_and_shapes():
    with pytest.raises(OptionsError):
        AdamOptions(lr=0)
    with pytest.raises(ShapeError):
        MLP((3,))
    net = MLP((2, 3, 1))
    params, w0, _, _ = flat_params(net, rng=np.random.default_rng(0))
    with pytest.raises(ShapeError):
        adam(mse_loss_factory(net, params), w0, (np.zeros((2, 10)), np.zeros((1, 9))))


# --- LSTM (scripts.baselines) ----------------------------------------------------------------------
def _lstm(n_in=2, hidden=8, n_out=1, seed=0):
    from scripts.baselines import LSTM
    net = LSTM(n_in, hidden=hidden, layers=2, n_out=n_out)
    params = Parameters(*net.params(np.random.default_rng(seed)))
    return net, params, params.to_vector({q.name: q.array("value") for q in params})


def test_lstm_gradient_matches_finite_differences_and_numpy_forward():
    from scripts.baselines import sequence_loss_factory
    net, params, w0 = _lstm()
    rng = np.random.default_rng(1)
    L, B = 6, 5
    f = sequence_loss_factory(net, params, L)(B)
    U, Y = rng.normal(size=(L * 2, B)), rng.normal(size=(L, B))
    # numpy forward (independent evaluation path) gives the same loss
    outs = net(params.from_vector(w0), [U[2 * k:2 * k + 2] for k in range(L)])
    assert float(f(w0, U, Y)) == pytest.approx(np.mean((np.vstack(outs) - Y) ** 2), rel=1e-12)
    w = ca.MX.sym("w", params.size)
    G = np.asarray(ca.Function("g", [w], [ca.gradient(f(w, U, Y), w)])(w0)).ravel()
    eps = 1e-6
    for i in rng.choice(params.size, 25, replace=False):
        e = np.zeros(params.size)
        e[i] = eps
        fd = (float(f(w0 + e, U, Y)) - float(f(w0 - e, U, Y))) / (2 * eps)
        assert abs(G[i] - fd) <= 1e-7 + 1e-6 * abs(fd), (i, G[i], fd)


def test_lstm_learns_delayed_input():
    """y_t = u1_{t-3} + 0.5 u2_t needs memory: a memoryless model cannot beat variance 1 of u1_{t-3};
    the trained LSTM's last-step error on fresh windows is far below it."""
    from scripts.baselines import sequence_loss_factory, windows
    net, params, w0 = _lstm()
    rng = np.random.default_rng(2)

    def sample(N, T=40):
        u = rng.normal(size=(N, T, 2))
        y = 0.5 * u[:, :, 1:]
        y[:, 3:, 0] += u[:, :-3, 0]
        return u, y

    u, y = sample(40)
    U, Y = windows(u, y, 10, stride=2)
    res = adam(sequence_loss_factory(net, params, 10), w0, (U, Y),
               options=AdamOptions(lr=1e-2, decay=0.02, epochs=40, batch_size=128))
    ut, yt = sample(10)
    Ut, Yt = windows(ut, yt, 10, stride=1)
    last = net(params.from_vector(res.w), [Ut[2 * k:2 * k + 2] for k in range(10)])[-1]
    mse = np.mean((last - Yt[-1:]) ** 2)
    assert mse < 0.1, mse      # measured 0.043 (memoryless floor: 1.0)


def test_windows_layout():
    from scripts.baselines import windows
    u = np.arange(2 * 7 * 3, dtype=float).reshape(2, 7, 3)
    U, Y = windows(u, u[:, :, :1], 4, stride=2)
    assert U.shape == (12, 4) and Y.shape == (4, 4)      # 2 trajectories x starts {0, 2}
    np.testing.assert_array_equal(U[:, 1], u[0, 2:6].ravel())
    np.testing.assert_array_equal(Y[:, 2], u[1, 0:4, 0])
    with pytest.raises(ShapeError):
        windows(u, None, 8)
