"""A stacked LSTM as CasADi matrix expressions (samples as columns), for sequence baselines; its equations
(PyTorch's gate layout) are in docs/baselines.md."""
from __future__ import annotations

import casadi as ca
import numpy as np

from ceem_casadi.errors import ShapeError
from ceem_casadi.model._params import Param, Parameters

__all__ = ["LSTM", "sequence_loss_factory", "windows"]


def _sigmoid(z, lib):
    return 0.5 * (1.0 + lib.tanh(0.5 * z))       # overflow-free logistic function


class LSTM:
    """Stacked LSTM ``n_in -> hidden x layers -> n_out`` (linear read-out at every step); parameters
    ``<name>_W<l>`` (4 hidden, n_in or hidden), ``<name>_U<l>`` (4 hidden, hidden), ``<name>_b<l>`` (4 hidden,),
    ``<name>_V`` (n_out, hidden), ``<name>_d`` (n_out,).

    Parameters
    ----------
    n_in, hidden, layers, n_out : int
        Inputs per step, units per layer, stacked layers, outputs per step.
    name : str
        Prefix of the parameter names.

    Raises
    ------
    ShapeError
        A size below 1.

    Examples
    --------
    >>> import numpy as np
    >>> from scripts.baselines import LSTM
    >>> net = LSTM(n_in=1, hidden=4, layers=1, n_out=1)
    >>> net.names
    ['lstm_W0', 'lstm_U0', 'lstm_b0', 'lstm_V', 'lstm_d']
    >>> net.init(np.random.default_rng(0))["lstm_W0"].shape             # 4 gates x hidden, n_in
    (16, 1)
    """

    def __init__(self, n_in: int, hidden: int = 32, layers: int = 2, n_out: int = 6, name: str = "lstm"):
        if min(n_in, hidden, layers, n_out) < 1:
            raise ShapeError(f"LSTM sizes must be positive, got n_in={n_in}, hidden={hidden}, "
                             f"layers={layers}, n_out={n_out}")
        self.n_in, self.hidden, self.layers, self.n_out, self.name = n_in, hidden, layers, n_out, name

    @property
    def names(self) -> list[str]:
        """Parameter names in order."""
        return [f"{self.name}_{m}{i}" for i in range(self.layers) for m in "WUb"] + [f"{self.name}_V", f"{self.name}_d"]

    def init(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Parameter values (name -> array) by PyTorch's initialisation, uniform on +-1/sqrt(hidden), drawn
        from ``rng`` (a numpy Generator)."""
        k, h = 1.0 / np.sqrt(self.hidden), self.hidden
        theta = {}
        for i in range(self.layers):
            n_in = self.n_in if i == 0 else h
            theta[f"{self.name}_W{i}"] = rng.uniform(-k, k, size=(4 * h, n_in))
            theta[f"{self.name}_U{i}"] = rng.uniform(-k, k, size=(4 * h, h))
            theta[f"{self.name}_b{i}"] = rng.uniform(-k, k, size=4 * h)
        theta[f"{self.name}_V"] = rng.uniform(-k, k, size=(self.n_out, h))
        theta[f"{self.name}_d"] = rng.uniform(-k, k, size=self.n_out)
        return theta

    def params(self, rng: np.random.Generator, **kwargs) -> list[Param]:
        """`ceem_casadi.Param` objects initialised by `init`
        from ``rng``; ``kwargs`` are passed to every Param."""
        return [Param(k, v, **kwargs) for k, v in self.init(rng).items()]

    def __call__(self, p, xs):
        """Outputs ``[y_1 ... y_L]`` (each (n_out, B)) for inputs ``xs = [x_1 ... x_L]`` (each
        (n_in, B)), zero initial states. ``p``: namespace or dict of CasADi symbols or arrays."""
        get = p.get if isinstance(p, dict) else (lambda k: getattr(p, k))
        numeric = isinstance(xs[0], np.ndarray)
        lib = np if numeric else ca
        mm = np.matmul if numeric else ca.mtimes
        B = xs[0].shape[1]
        if numeric:
            def col(v):
                return np.asarray(v, float).reshape(-1, 1)
        else:
            def col(v):
                return ca.repmat(v, 1, B) if B > 1 else v
        h = self.hidden
        seq = list(xs)
        for i in range(self.layers):
            W, U = get(f"{self.name}_W{i}"), get(f"{self.name}_U{i}")
            b = col(get(f"{self.name}_b{i}"))
            hs, ht, ct = [], None, None
            for a in seq:
                z = mm(W, a) + b if ht is None else mm(W, a) + mm(U, ht) + b
                ig, fg = _sigmoid(z[:h, :], lib), _sigmoid(z[h:2 * h, :], lib)
                gg, og = lib.tanh(z[2 * h:3 * h, :]), _sigmoid(z[3 * h:, :], lib)
                ct = ig * gg if ct is None else fg * ct + ig * gg
                ht = og * lib.tanh(ct)
                hs.append(ht)
            seq = hs
        V, d = get(f"{self.name}_V"), col(get(f"{self.name}_d"))
        return [mm(V, a) + d for a in seq]


def sequence_loss_factory(net: LSTM, params: Parameters, L: int):
    """Factory of the mean-squared-error loss (over steps, windows and outputs) of windows of length ``L``.

    Parameters
    ----------
    net : LSTM
    params : Parameters
        Its parameters (``net.params(...)``).
    L : int
        Window length.

    Returns
    -------
    callable
        ``B -> casadi.Function(w, U (L*n_in, B), Y (L*n_out, B)) -> mse`` (for `ceem_casadi.model._nn.adam`).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from scripts.baselines import LSTM, sequence_loss_factory
    >>> net = LSTM(n_in=1, hidden=4, layers=1, n_out=1)
    >>> params = cc.Parameters(*net.params(np.random.default_rng(0)))
    >>> loss = sequence_loss_factory(net, params, L=3)(2)                  # windows of 3 steps, batches of 2
    >>> loss.name(), loss.size_in(1)
    ('lstm_mse', (3, 2))
    """
    def make(B):
        w = ca.MX.sym("w", params.size)
        U = ca.MX.sym("U", L * net.n_in, B)
        Y = ca.MX.sym("Y", L * net.n_out, B)
        outs = net(params.symbols(w), [U[k * net.n_in:(k + 1) * net.n_in, :] for k in range(L)])
        E = ca.vertcat(*outs) - Y
        return ca.Function("lstm_mse", [w, U, Y], [ca.sumsqr(E) / (B * L * net.n_out)])
    return make


def windows(u: np.ndarray, y: np.ndarray | None, L: int, stride: int = 1):
    """Windows of length L of a batch of sequences, as columns (trajectory-major; window j starts at ``j * stride``).

    Parameters
    ----------
    u, y : numpy.ndarray
        (N, T, n_in) inputs and (N, T, n_out) targets (or None).
    L, stride : int
        Window length and steps between window starts.

    Returns
    -------
    U : numpy.ndarray
        (L*n_in, M), M = N * len(range(0, T - L + 1, stride)).
    Y : numpy.ndarray or None
        (L*n_out, M), None without ``y``.

    Examples
    --------
    >>> import numpy as np
    >>> from scripts.baselines import windows
    >>> U, Y = windows(np.arange(5.0).reshape(1, 5, 1), None, 3, stride=2)
    >>> U, Y
    (array([[0., 2.],
           [1., 3.],
           [2., 4.]]), None)
    """
    u = np.asarray(u, float)
    if u.ndim != 3 or u.shape[1] < L:
        raise ShapeError(f"u: expected (N, T >= {L}, n_in), got {u.shape}")
    starts = np.arange(0, u.shape[1] - L + 1, stride)
    idx = starts[:, None] + np.arange(L)[None, :]                     # (S, L)

    def pack(a):
        w = a[:, idx, :]                                                # (N, S, L, d)
        return w.reshape(a.shape[0] * len(starts), L * a.shape[2]).T

    return pack(u), (None if y is None else pack(np.asarray(y, float)))
