"""Small neural networks as CasADi expressions ([`MLP`][ceem_casadi.MLP], weights as named parameters,
one sample as a column or a batch as the columns of a matrix), and the one Adam loop with harmonic
decay ``lr_k = lr / (1 + decay * epoch)`` of plain training (`adam`) and the Adam learning step.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace

import casadi as ca
import numpy as np

from ..errors import NonFiniteError, OptionsError, ShapeError
from ..runtime._schema import check_fields
from ._params import Param, Parameters

__all__ = ["MLP", "AdamOptions", "AdamResult", "adam", "flat_params", "mse_loss_factory", "namespace"]

log = logging.getLogger(__name__)

_ACTIVATIONS = {"tanh": ca.tanh, "relu": lambda z: ca.fmax(z, 0), "identity": lambda z: z}


class MLP:
    """Fully connected network ``sizes[0] -> ... -> sizes[-1]`` whose weights are named parameters (learned
    by CE-EM like any other parameter).

    Parameters
    ----------
    sizes : sequence of int
        Layer widths, e.g. ``(20, 32, 32, 6)``; the last layer is linear.
    name : str
        Prefix of the parameter names ``<name>_W<i>`` (sizes[i+1], sizes[i]) and ``<name>_b<i>``.
    activation : str
        Hidden-layer activation, ``"tanh"`` (default), ``"relu"`` or ``"identity"``.

    Raises
    ------
    ShapeError
        Fewer than two widths or a width below 1.
    OptionsError
        An unknown activation.

    Examples
    --------
    A network 1 -> 4 -> 1 as the whole dynamics, x[t+1] = W1 tanh(W0 x[t] + b0) + b1:

    >>> import numpy as np
    >>> import ceem_casadi as cc
    >>> net = cc.MLP((1, 4, 1), name="f")
    >>> net.names
    ['f_W0', 'f_b0', 'f_W1', 'f_b1']
    >>> params = cc.Parameters(*net.params(np.random.default_rng(0)))
    >>> params.size                           # 1*4 + 4 + 4*1 + 1
    13
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: net(p, x), lambda x, u, p: x,
    ...                                          nx=1, params=params)
    >>> w = net.init(np.random.default_rng(0))
    >>> by_hand = w["f_W1"] @ np.tanh(w["f_W0"] @ [0.5] + w["f_b0"]) + w["f_b1"]
    >>> bool(np.isclose(float(model.f(0.5, [], params.to_vector(w))), by_hand[0]))
    True
    """

    def __init__(self, sizes, name: str = "mlp", activation: str = "tanh"):
        sizes = tuple(int(s) for s in sizes)
        if len(sizes) < 2 or min(sizes) < 1:
            raise ShapeError(f"MLP sizes must be >= 2 positive widths, got {sizes}")
        if activation not in _ACTIVATIONS:
            raise OptionsError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.sizes, self.name, self.activation = sizes, name, activation

    @property
    def n_layers(self) -> int:
        """Number of weight layers."""
        return len(self.sizes) - 1

    @property
    def names(self) -> list[str]:
        """Parameter names ``[<name>_W0, <name>_b0, ...]``."""
        out = []
        for i in range(self.n_layers):
            out += [f"{self.name}_W{i}", f"{self.name}_b{i}"]
        return out

    def init(self, rng: np.random.Generator, last_scale: float = 1.0) -> dict[str, np.ndarray]:
        """Glorot-uniform weights and zero biases, name -> array, drawn from ``rng``; ``last_scale``
        multiplies the output layer's weights (0 starts the term at zero)."""
        theta = {}
        for i in range(self.n_layers):
            n_in, n_out = self.sizes[i], self.sizes[i + 1]
            lim = np.sqrt(6.0 / (n_in + n_out))
            W = rng.uniform(-lim, lim, size=(n_out, n_in))
            if i == self.n_layers - 1:
                W = W * last_scale
            theta[f"{self.name}_W{i}"] = W
            theta[f"{self.name}_b{i}"] = np.zeros(n_out)
        return theta

    def params(self, rng: np.random.Generator, last_scale: float = 1.0, **kwargs) -> list[Param]:
        """[`Param`][ceem_casadi.Param] objects initialised by [`init`][ceem_casadi.MLP.init] (``rng``,
        ``last_scale``); ``kwargs`` go to every Param (e.g. ``prior_std``)."""
        return [Param(k, v, **kwargs) for k, v in self.init(rng, last_scale).items()]

    def __call__(self, p, x):
        """Network output (n_out,) or (n_out, N) of ``x`` (n_in,) or (n_in, N) (columns are samples), CasADi
        or numpy; ``p`` the weights as a namespace (``p.<name>``) or a dict."""
        get = p.get if isinstance(p, dict) else (lambda k: getattr(p, k))
        numeric = isinstance(x, np.ndarray)
        h = x
        for i in range(self.n_layers):
            W, b = get(f"{self.name}_W{i}"), get(f"{self.name}_b{i}")
            if numeric:
                W, b = np.asarray(W), np.asarray(b).reshape(-1, 1) if np.ndim(h) == 2 else np.asarray(b)
                h = W @ h + b
                if i < self.n_layers - 1:
                    h = np.tanh(h) if self.activation == "tanh" else (
                        np.maximum(h, 0) if self.activation == "relu" else h)
            else:
                n_cols = h.shape[1] if hasattr(h, "shape") and len(h.shape) == 2 else 1
                z = ca.mtimes(W, h)
                h = z + (ca.repmat(b, 1, n_cols) if n_cols > 1 else b)
                if i < self.n_layers - 1:
                    h = _ACTIVATIONS[self.activation](h)
        return h


def flat_params(*nets: MLP, rng: np.random.Generator, last_scale: float = 1.0):
    """``(Parameters, theta0 vector, sym (n,) MX, namespace)`` for plain (non-model) training."""
    params = Parameters(*[q for net in nets for q in net.params(rng, last_scale)])
    theta0 = params.to_vector({q.name: q.array("value") for q in params})
    w = ca.MX.sym("w", params.size)
    return params, theta0, w, params.symbols(w)


# Adam's constants (Kingma and Ba, 2015): every caller used these defaults
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8


@dataclass(frozen=True)
class AdamOptions:
    """Adam with harmonic decay ``lr_k = lr / (1 + decay * epoch)``: the one options class of plain
    training (``ceem_casadi.model._nn.adam``) and of the learning step
    [`AdamLearner`][ceem_casadi.learning.AdamLearner].

    Parameters
    ----------
    lr : float
        Initial step (the learner: of the parameters only the observation g uses; paper 1e-3).
    lr_dynamics : float, optional
        The learner: step of the parameters the dynamics f uses (paper 5e-4); ``None``: ``lr / 2``.
    decay : float, optional
        Harmonic decay per epoch; ``None``: 0.1 for `adam`, 0 for the learner.
    epochs : int, optional
        Passes over the data; ``None``: 20 for `adam`, 1 per learning step for the learner.
    batch_size : int
        Samples (columns) per step (the learner: observation and dynamics columns each; paper 512).
    seed : int
        Mini-batch shuffling (the learner advances it at every solve).
    rho_theta : float
        The learner: trust-region weight (as [`LearnerOptions`][ceem_casadi.LearnerOptions]).
    use_prior : bool
        The learner: include the parameters' Gaussian priors.

    Raises
    ------
    OptionsError
        A value out of range (also a ``ValueError``); `adam` refuses the learner's fields.

    Examples
    --------
    >>> from ceem_casadi.learning import AdamOptions
    >>> o = AdamOptions(lr=1e-2, epochs=5)
    >>> o.lr, o.epochs, o.lr_dynamics is None
    (0.01, 5, True)
    """

    lr: float = 1e-3
    lr_dynamics: float | None = None
    decay: float | None = None
    epochs: int | None = None
    batch_size: int = 512
    seed: int = 0
    rho_theta: float = 0.0
    use_prior: bool = True

    def __post_init__(self):
        check_fields(self)
        bad = [f"{k}={getattr(self, k)!r}" for k, ok in (
            ("lr", self.lr > 0), ("lr_dynamics", self.lr_dynamics is None or self.lr_dynamics > 0),
            ("decay", self.decay is None or self.decay >= 0), ("epochs", self.epochs is None or self.epochs >= 1),
            ("batch_size", self.batch_size >= 1), ("rho_theta", self.rho_theta >= 0)) if not ok]
        if bad:
            raise OptionsError(f"AdamOptions: need lr, lr_dynamics > 0, decay, rho_theta >= 0, epochs, "
                               f"batch_size >= 1; got {', '.join(bad)}")

    def schedule(self, epochs: int, decay: float) -> tuple[int, float]:
        """``(epochs, decay)`` with the user's default (``epochs``, ``decay``) where a field is None."""
        return (epochs if self.epochs is None else self.epochs), (decay if self.decay is None else self.decay)


def adam_loop(w, grad, batches, lr, *, epochs: int, decay: float, project=None, end_epoch=None,
              name: str = "adam"):
    """The one Adam loop (bias-corrected moments): ``epochs`` passes of ``batches(epoch)`` (batch keys),
    ``w -= lr_k * m_hat / (sqrt(v_hat) + eps)`` with ``g = grad(w, batch)`` (n,), ``lr_k = lr / (1 + decay * epoch)``,
    ``project(w)`` after each step, ``end_epoch(epoch, w)`` after each epoch. Returns ``(w, steps)``."""
    w = np.asarray(w, float).copy()
    m, v, k = np.zeros_like(w), np.zeros_like(w), 0
    for epoch in range(epochs):
        rate = lr / (1.0 + decay * epoch)
        for s, batch in enumerate(batches(epoch)):
            g = np.asarray(grad(w, batch), float).ravel()
            if not np.all(np.isfinite(g)):
                raise NonFiniteError(f"{name}: non-finite gradient at epoch {epoch}, step {s}")
            k += 1
            m = BETA1 * m + (1 - BETA1) * g
            v = BETA2 * v + (1 - BETA2) * g * g
            w = w - rate * (m / (1 - BETA1 ** k)) / (np.sqrt(v / (1 - BETA2 ** k)) + EPS)
            if project is not None:
                w = project(w)
        if end_epoch is not None:
            end_epoch(epoch, w)
    return w, k


@dataclass
class AdamResult:
    """w : best weights (n,); train_loss / valid_loss : per-epoch mean losses (valid may be empty)."""

    w: np.ndarray
    train_loss: list
    valid_loss: list


def adam(loss, w0, data, *, options: AdamOptions = AdamOptions(), valid=None) -> AdamResult:
    """Minimise ``loss(w, *batch)`` with Adam over mini-batches of columns of ``data``.

    ``loss``: a ``ca.Function`` ``(w (n,), D_1 (d_1, B), ..., D_k (d_k, B)) -> scalar`` (a mean over the
    B columns), or a factory ``B -> ca.Function`` of that form (e.g. `mse_loss_factory`); ``w0`` (n,);
    ``data``: arrays (d_i, N), samples as columns; ``valid``: the same for a per-epoch validation loss
    (the weights of the best epoch are returned).
    """
    data = tuple(np.asarray(d, float) for d in data)
    N = data[0].shape[1]
    if any(d.ndim != 2 or d.shape[1] != N for d in data):
        raise ShapeError(f"data: every array must be (d_i, N) with N = {N}, got {[d.shape for d in data]}")
    factory = loss if not isinstance(loss, ca.Function) else (lambda B: loss)
    cache = {}

    def grad_fn(B):
        if B not in cache:
            f = factory(B)
            w = ca.MX.sym("w", f.size1_in(0))
            ins = [ca.MX.sym(f"d{i}", *f.size_in(i + 1)) for i in range(len(data))]
            L = f(w, *ins)
            cache[B] = ca.Function("loss_grad", [w, *ins], [L, ca.gradient(L, w)])
        return cache[B]

    o = options
    learner_only = [f"{k}={getattr(o, k)!r}" for k, default in (("lr_dynamics", None), ("rho_theta", 0.0),
                                                                ("use_prior", True))
                    if getattr(o, k) != default]
    if learner_only:
        raise OptionsError(f"adam: {', '.join(learner_only)} are options of the learning step (AdamLearner), "
                           "not of plain training: leave them at their defaults")
    epochs, decay = o.schedule(20, 0.1)
    rng = np.random.default_rng(o.seed)
    B = min(o.batch_size, N)
    best = {"w": np.asarray(w0, float).copy(), "val": np.inf}
    train_hist, valid_hist, losses = [], [], []

    def batches(epoch):
        perm = rng.permutation(N)
        return [perm[s:s + B] for s in range(0, N - B + 1, B)]   # full batches only (one compiled size)

    def grad(w, idx):
        L, g = grad_fn(B)(w, *[d[:, idx] for d in data])
        losses.append(float(L))
        return g

    def end_epoch(epoch, w):
        train_hist.append(float(np.mean(losses)))
        losses.clear()
        if valid is None:
            best["w"] = w.copy()
            log.info("adam epoch %d: train %.5g", epoch, train_hist[-1])
            return
        vd = tuple(np.asarray(d, float) for d in valid)
        valid_hist.append(float(factory(vd[0].shape[1])(w, *vd)))
        if valid_hist[-1] < best["val"]:
            best.update(w=w.copy(), val=valid_hist[-1])
        log.info("adam epoch %d: train %.5g valid %.5g", epoch, train_hist[-1], valid_hist[-1])

    adam_loop(w0, grad, batches, o.lr, epochs=epochs, decay=decay, end_epoch=end_epoch)
    return AdamResult(best["w"], train_hist, valid_hist)


def mse_loss_factory(net: MLP, params: Parameters):
    """``B -> ca.Function(w, X (n_in, B), Y (n_out, B)) -> mean squared error`` for ``net``."""
    def make(B):
        w = ca.MX.sym("w", params.size)
        X = ca.MX.sym("X", net.sizes[0], B)
        Y = ca.MX.sym("Y", net.sizes[-1], B)
        E = net(params.symbols(w), X) - Y
        return ca.Function("mse", [w, X, Y], [ca.sumsqr(E) / (B * net.sizes[-1])])
    return make


def namespace(params: Parameters, w) -> SimpleNamespace:
    """Numeric namespace ``p.<name>`` of a flat vector ``w`` (for evaluating an MLP in numpy)."""
    return SimpleNamespace(**params.from_vector(w))
