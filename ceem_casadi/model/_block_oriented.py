"""Block-oriented models: Wiener, Hammerstein and Wiener-Hammerstein (discrete time, SISO) around a static
nonlinearity, and the similarity-invariant views `block_poles`, `block_markov` (the parametrisation, its gain
convention and conditioning: docs/block_oriented.md)."""
from __future__ import annotations

import casadi as ca
import numpy as np

from ..errors import OptionsError, ParameterError, ShapeError
from ._model import StateSpaceModel
from ._nn import MLP
from ._params import Param, Parameters

NONLINEARITIES = ("poly", "mlp")
GAINS = ("markov", "dc")            # gain convention of the linear blocks (module docstring)
BASES = ("monomial", "chebyshev")   # basis of the polynomial nonlinearity


# --------------------------------------------------------------------------------------------------
# linear block: cascade of sections
def sections(n: int) -> list[tuple[int, int]]:
    """``(offset, order)`` of the sections of an order-n block: second order, then one first order if n is odd."""
    return [(k, 2) for k in range(0, n - 1, 2)] + ([(n - 1, 1)] if n % 2 else [])


def _block_step(x, v, den, n: int) -> list:
    """Next state entries (list of n) of the cascade for block input ``v`` (numpy or CasADi)."""
    out, inp = [], v
    for k, order in sections(n):
        if order == 2:
            out += [-den[k] * x[k] - den[k + 1] * x[k + 1] + inp, x[k]]
        else:
            out += [-den[k] * x[k] + inp]
        inp = x[k]
    return out


def steady_state(den, n: int) -> list:
    """State (list of n) of the cascade at rest under a unit constant input (numpy or CasADi): each section
    settles at ``in / (1 + sum of its den)`` in its states and feeds its first state to the next.

    Examples
    --------
    >>> steady_state([-1.0, 0.25, -0.5], 3)        # (z - 0.5)^2 then z - 0.5: 4, 4, then 4 / 0.5
    [4.0, 4.0, 8.0]
    """
    out, inp = [], 1.0
    for k, order in sections(n):
        if order == 2:
            s0 = inp / (1 + den[k] + den[k + 1])
            out += [s0, s0]
        else:
            s0 = inp / (1 + den[k])
            out += [s0]
        inp = s0
    return out


def dc_gain(den, num, d: float):
    """Static gain ``num . x_ss + d`` of a block (numpy or CasADi).

    Examples
    --------
    >>> float(dc_gain([-0.5], [1.0], 0.0))          # 1 / (1 - 0.5 q^-1) q^-1
    2.0
    """
    n = len(den) if not hasattr(den, "shape") else den.shape[0]
    return sum(num[j] * x for j, x in enumerate(steady_state(den, n))) + d


def block_system(den, num, d: float, gain: str = "markov") -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """State-space matrices ``(A (n, n), B (n,), C (n,), D)`` of a block with ``<g>_den``, ``<g>_num``, ``d``
    (``gain="dc"``: C and D divided by the block's static gain, the models' ``gain="dc"`` convention)."""
    den, num = np.asarray(den, float).ravel(), np.asarray(num, float).ravel()
    n = den.size
    eye = np.eye(n)
    A = np.column_stack([np.array(_block_step(eye[:, j], 0.0, den, n), float) for j in range(n)])
    B = np.array(_block_step(np.zeros(n), 1.0, den, n), float)
    k = float(dc_gain(den, num, d)) if gain == "dc" else 1.0
    return A, B, num.copy() / k, float(d) / k


def _block_params(prefix: str, n: int, feedthrough: bool, den=None, num=None) -> list:
    if n < 1:
        raise ShapeError(f"{prefix}: the block order must be >= 1, got {n}")
    lo, hi = np.empty(n), np.empty(n)
    for k, order in sections(n):
        if order == 2:
            lo[k:k + 2], hi[k:k + 2] = (-2.0, -1.0), (2.0, 1.0)
        else:
            lo[k], hi[k] = -1.0, 1.0
    if den is None:                     # all poles at 0.5: (z - 0.5)^2 sections, first order z - 0.5
        den = np.concatenate([[-1.0, 0.25] if order == 2 else [-0.5] for _, order in sections(n)])
    if num is None:
        num = np.zeros(n)
        num[0] = 0.0 if feedthrough else 1.0
    free = np.ones(n, bool)
    if not feedthrough:
        free[0] = False
        num = np.array(num, float)
        if num[0] != 1.0:
            raise ParameterError(f"{prefix}_num[0] is the fixed leading Markov coefficient 1 of a block without "
                                    f"feedthrough, got {num[0]}; rescale the block (and the nonlinearity)")
    for name, value in (("den", den), ("num", num)):
        if np.shape(value) != (n,):
            raise ShapeError(f"{prefix}_{name}: expected shape ({n},) for a block of order {n}, got {np.shape(value)}")
    return [Param(f"{prefix}_den", np.asarray(den, float), lower=lo, upper=hi),
            Param(f"{prefix}_num", np.asarray(num, float), free=free)]


def _block_output(x, v, num, n: int, d: float, den=None, gain: str = "markov"):
    out = sum(num[j] * x[j] for j in range(n)) + d * v
    return out / dc_gain(den, num, d) if gain == "dc" else out


# --------------------------------------------------------------------------------------------------
# static nonlinearity
def _nl_params(kind: str, degree: int, hidden: int, theta0: dict, seed: int, prior_std):
    if kind not in NONLINEARITIES:
        raise OptionsError(f"nonlinearity must be one of {NONLINEARITIES}, got {kind!r}")
    if kind == "poly":
        if int(degree) != degree or degree < 1:
            raise OptionsError(f"degree must be an integer >= 1, got {degree!r}")
        coef = np.zeros(degree + 1)
        coef[1] = 1.0
        return [Param("f_coef", np.asarray(theta0.get("f_coef", coef), float))], None
    if int(hidden) != hidden or hidden < 1:
        raise OptionsError(f"hidden must be an integer >= 1, got {hidden!r}")
    if prior_std is not None and not (np.isfinite(prior_std) and prior_std > 0):
        raise OptionsError(f"mlp_prior_std must be None or a positive number, got {prior_std!r}")
    prior = {} if prior_std is None else {"prior_mean": 0.0, "prior_std": float(prior_std)}
    net = MLP((1, int(hidden), 1), name="f")
    init = net.init(np.random.default_rng(seed))
    return [Param(k, np.asarray(theta0.get(k, v), float), **prior) for k, v in init.items()], net


def _nl_expr(kind: str, net, p, v, scale: float, basis: str = "monomial", center: float = 0.0,
             out_scale: float = 1.0):
    z = (v - center) / scale
    if kind == "poly":
        coef = p.f_coef
        if basis == "chebyshev":                        # Clenshaw: sum c_k T_k(z)
            b1, b2 = 0.0, 0.0
            for k in range(coef.shape[0] - 1, 0, -1):
                b1, b2 = 2 * z * b1 - b2 + coef[k], b1
            return out_scale * (z * b1 - b2 + coef[0])
        out = coef[coef.shape[0] - 1]
        for k in range(coef.shape[0] - 2, -1, -1):      # Horner
            out = out * z + coef[k]
        return out_scale * out
    return out_scale * net(p, z)


def nonlinearity(theta: dict, v, *, scale: float = 1.0, basis: str = "monomial", center: float = 0.0,
                 out_scale: float = 1.0) -> np.ndarray:
    """f(v) (same shape as ``v``) of a model's ``theta`` (``"poly"`` or ``"mlp"``, detected from the names);
    ``scale``, ``basis``, ``center``, ``out_scale`` as given to the factory."""
    v = np.asarray(v, float)
    z = (v - center) / scale
    if "f_coef" in theta:
        c = np.asarray(theta["f_coef"], float)
        val = np.polynomial.chebyshev.chebval(z, c) if basis == "chebyshev" else np.polynomial.polynomial.polyval(z, c)
        return out_scale * val
    hidden = np.asarray(theta["f_W0"]).shape[0]
    out = MLP((1, hidden, 1), name="f")(theta, z.reshape(1, -1))
    return out_scale * np.asarray(out, float).reshape(v.shape)


# --------------------------------------------------------------------------------------------------
# factories
def _model(step, observe, nx, params, name, noise: dict):
    return StateSpaceModel.from_discrete(step, observe, nx=nx, nu=1, params=Parameters(*params), name=name, **noise)


def _static(nonlinearity, degree, hidden, theta0, seed, mlp_prior_std, scale, gain, basis, center, out_scale):
    """``(theta0 dict, f's parameters, f(p, v))`` of a factory's arguments, checked."""
    if gain not in GAINS:
        raise OptionsError(f"gain must be one of {GAINS}, got {gain!r}")
    if basis not in BASES:
        raise OptionsError(f"basis must be one of {BASES}, got {basis!r}")
    t0 = dict(theta0 or {})
    fp, net = _nl_params(nonlinearity, degree, hidden, t0, seed, mlp_prior_std)

    def f(p, v):
        return _nl_expr(nonlinearity, net, p, v, scale, basis=basis, center=center, out_scale=out_scale)

    return t0, fp, f


def _one_block(hammerstein: bool, n: int, feedthrough: bool, nonlinearity: str, static, gain: str, noise: dict):
    """Wiener (f after G) or Hammerstein (f before G) model of one block of order n; ``static`` of `_static`."""
    t0, fp, f = static
    params = _block_params("g", n, feedthrough, t0.get("g_den"), t0.get("g_num")) + fp
    d = 1.0 if feedthrough else 0.0

    def block_input(u, p):
        return f(p, u[0]) if hammerstein else u[0]

    def step(x, u, p):
        return ca.vertcat(*_block_step(x, block_input(u, p), p.g_den, n))

    def observe(x, u, p):
        y = _block_output(x, block_input(u, p), p.g_num, n, d, p.g_den, gain)
        return y if hammerstein else f(p, y)

    kind = "hammerstein" if hammerstein else "wiener"
    return _model(step, observe, n, params, f"{kind}_{n}_{nonlinearity}", noise)


def wiener(n: int = 2, *, feedthrough: bool = False, nonlinearity: str = "poly", degree: int = 3,
           hidden: int = 8, scale: float = 1.0, theta0: dict | None = None, seed: int = 0,
           mlp_prior_std: float | None = 1.0, process_std=1e-3, measurement_std=1e-2,
           dt: float | None = None, gain: str = "markov", basis: str = "monomial", center: float = 0.0,
           out_scale: float = 1.0) -> StateSpaceModel:
    """Wiener model ``y = f(G u)`` (the parametrisation and its conditioning: docs/block_oriented.md).

    Parameters
    ----------
    n : int
        Order of G (parameters ``g_den``, ``g_num``).
    feedthrough : bool
        Whether G has a direct term (fixed to 1; otherwise ``g_num[0] = 1`` is fixed): the gain
        ambiguity.
    nonlinearity : str
        ``"poly"`` (coefficients ``f_coef``) or ``"mlp"`` (``f_W0, f_b0, f_W1, f_b1``).
    degree, hidden : int
        Polynomial degree; MLP hidden units.
    scale : float
        Constant dividing f's input.
    theta0 : dict, optional
        Initial values by name (defaults: poles at 0.5, unit leading Markov coefficient, f(v) = v).
    seed : int
        Seed of the MLP's Glorot initial weights.
    mlp_prior_std : float, optional
        Std of the N(0, s^2) prior on the MLP weights (``None``: no prior).
    process_std, measurement_std : float or array
        Noise levels of the `StateSpaceModel`.
    dt : float, optional
        Sample time (s), informative only.
    gain : str
        ``"markov"`` (unit leading Markov coefficient) or ``"dc"`` (unit static gain: the
        nonlinearity carries the gain; scale-invariant, for real records).
    basis : str
        ``"monomial"`` or ``"chebyshev"`` (Chebyshev polynomials over the input range).
    center, out_scale : float
        Centre of f's input range; scale of the output (`bla_initialise` sets std(y)).

    Returns
    -------
    StateSpaceModel
        Discrete-time model with states (G's n).

    Examples
    --------
    >>> from ceem_casadi.model import wiener
    >>> model = wiener(2)
    >>> model.nx, model.nu, model.ny
    (2, 1, 1)
    """
    static = _static(nonlinearity, degree, hidden, theta0, seed, mlp_prior_std, scale, gain, basis, center, out_scale)
    return _one_block(False, n, feedthrough, nonlinearity, static, gain,
                      dict(process_std=process_std, measurement_std=measurement_std, dt=dt))


def hammerstein(n: int = 2, *, feedthrough: bool = False, nonlinearity: str = "poly", degree: int = 3,
                hidden: int = 8, scale: float = 1.0, theta0: dict | None = None, seed: int = 0,
                mlp_prior_std: float | None = 1.0, process_std=1e-3, measurement_std=1e-2,
                dt: float | None = None, gain: str = "markov", basis: str = "monomial", center: float = 0.0,
                out_scale: float = 1.0) -> StateSpaceModel:
    """Hammerstein model ``y = G f(u)`` (docs/block_oriented.md).

    Parameters
    ----------
    n : int
        Order of G (parameters ``g_den``, ``g_num``).
    feedthrough : bool
        Whether G has a direct term (fixed to 1; otherwise ``g_num[0] = 1`` is fixed).
    nonlinearity, degree, hidden, scale, theta0, seed, mlp_prior_std, process_std, measurement_std, dt, gain, \
basis, center, out_scale
        As for `wiener`.

    Returns
    -------
    StateSpaceModel
        Discrete-time model with states (G's n).

    Examples
    --------
    >>> from ceem_casadi.model import hammerstein
    >>> model = hammerstein(2)
    >>> model.nx, model.nu, model.ny
    (2, 1, 1)
    """
    static = _static(nonlinearity, degree, hidden, theta0, seed, mlp_prior_std, scale, gain, basis, center, out_scale)
    return _one_block(True, n, feedthrough, nonlinearity, static, gain,
                      dict(process_std=process_std, measurement_std=measurement_std, dt=dt))


def wiener_hammerstein(n1: int = 2, n2: int = 2, *, feedthrough: tuple = (False, True), nonlinearity: str = "poly",
                       degree: int = 3, hidden: int = 8, scale: float = 1.0, theta0: dict | None = None,
                       seed: int = 0, mlp_prior_std: float | None = 1.0, process_std=1e-3,
                       measurement_std=1e-2, dt: float | None = None, gain: str = "markov",
                       basis: str = "monomial", center: float = 0.0, out_scale: float = 1.0) -> StateSpaceModel:
    """Wiener-Hammerstein model ``y = G2 f(G1 u)`` (docs/block_oriented.md).

    Parameters
    ----------
    n1, n2 : int
        Orders of G1 (``g1_den``, ``g1_num``) and G2 (``g2_den``, ``g2_num``).
    feedthrough : tuple of bool
        (G1, G2) direct terms (fixed to 1; otherwise that block's ``num[0] = 1`` is fixed); default
        (False, True): y[t] depends on u[t-1] and earlier, as a sampled continuous system with a hold.
    nonlinearity, degree, hidden, scale, theta0, seed, mlp_prior_std, process_std, measurement_std, dt, gain, \
basis, center, out_scale
        As for `wiener`.

    Returns
    -------
    StateSpaceModel
        Discrete-time model with states (G1's n1, then G2's n2).

    Examples
    --------
    >>> from ceem_casadi.model import wiener_hammerstein
    >>> model = wiener_hammerstein(3, 3)
    >>> model.nx, model.nu, model.ny
    (6, 1, 1)
    """
    t0, fp, f = _static(nonlinearity, degree, hidden, theta0, seed, mlp_prior_std, scale, gain, basis, center,
                        out_scale)
    if len(tuple(feedthrough)) != 2:
        raise ShapeError(f"feedthrough: expected a pair (G1, G2) of bools, got {feedthrough!r}")
    f1, f2 = (bool(b) for b in feedthrough)
    params = (_block_params("g1", n1, f1, t0.get("g1_den"), t0.get("g1_num"))
              + _block_params("g2", n2, f2, t0.get("g2_den"), t0.get("g2_num")) + fp)
    d1, d2 = float(f1), float(f2)

    def middle(x, u, p):
        return f(p, _block_output(x[:n1], u[0], p.g1_num, n1, d1, p.g1_den, gain))

    def step(x, u, p):
        w = middle(x, u, p)
        return ca.vertcat(*_block_step(x[:n1], u[0], p.g1_den, n1), *_block_step(x[n1:], w, p.g2_den, n2))

    def observe(x, u, p):
        return _block_output(x[n1:], middle(x, u, p), p.g2_num, n2, d2, p.g2_den, gain)

    return _model(step, observe, n1 + n2, params, f"wh_{n1}_{n2}_{nonlinearity}",
                  dict(process_std=process_std, measurement_std=measurement_std, dt=dt))


# --------------------------------------------------------------------------------------------------
# similarity-invariant views of a theta
def block_poles(theta: dict, block: str = "g") -> np.ndarray:
    """Poles (n,) complex of block ``block`` (``"g"``, ``"g1"`` or ``"g2"``), sorted by angle then modulus."""
    den = np.asarray(theta[f"{block}_den"], float)
    poles = []
    for k, order in sections(den.size):
        poles += list(np.roots([1.0, den[k], den[k + 1]]) if order == 2 else [-den[k]])
    poles = np.asarray(poles, complex)
    return poles[np.lexsort((np.abs(poles), np.round(np.angle(poles), 9)))]


def block_markov(theta: dict, block: str = "g", feedthrough: bool = False, K: int = 30,
                 gain: str = "markov") -> np.ndarray:
    """Impulse response ``[D, CB, CAB, ..., C A^(K-1) B]`` (K + 1,) of a block (invariant to its realisation;
    ``gain="dc"``: of the unit-static-gain block of a ``gain="dc"`` model)."""
    A, B, C, D = block_system(theta[f"{block}_den"], theta[f"{block}_num"], float(feedthrough), gain)
    out, x = [D], B
    for _ in range(K):
        out.append(float(C @ x))
        x = A @ x
    return np.asarray(out)
