"""The moves of the structure search: larger models that give their parent's outputs exactly at their start
(new terms at zero); the table is in docs/own_data.md ("How the search decides")."""
from __future__ import annotations

import weakref
from collections import namedtuple
from dataclasses import dataclass

import casadi as ca
import numpy as np

from ..model._model import StateSpaceModel
from ..model._nn import MLP
from ..model._params import Param, Parameters
from ..model._simulation import run
from ..runtime._checks import is_integer
from ..runtime._schema import is_number, require

__all__ = ["AUGMENTATIONS", "Augmentation", "Context", "Grown", "augment", "context_of", "is_block_oriented",
           "register_family"]

#: block-oriented models built by `bla_initialise`: model -> (factory, its keyword arguments), so that
#: the ``poly_degree`` move can rebuild them with a higher degree (weak keys: no model is kept alive)
_FAMILIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: models grown from a block-oriented one by a generic move (still no `NOT_FOR_BLOCKS` moves for them)
_GROWN_FROM_BLOCKS: weakref.WeakSet = weakref.WeakSet()


def is_block_oriented(model) -> bool:
    """Whether ``model`` came from `bla_initialise`, directly or grown from such a model by a generic move."""
    return model in _FAMILIES or model in _GROWN_FROM_BLOCKS


def register_family(model, factory, kwargs: dict) -> None:
    """Remember how ``model`` was built (a block-oriented factory and its arguments)."""
    _FAMILIES[model] = (factory, dict(kwargs))


#: centres and half-ranges of the parent's free run on the data (scales of the new terms): ``yc, yh`` (ny,),
#: ``uc, uh`` (nu,), ``xc, xh`` (nx,), ``dxh`` (nx,) the spread of the state increments
Context = namedtuple("Context", "yc yh uc uh xc xh dxh")


def _centre_half(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if a.shape[1] == 0:
        return np.zeros(0), np.zeros(0)
    lo, hi = np.nanmin(a, axis=0), np.nanmax(a, axis=0)
    half = 0.5 * (hi - lo)
    half = np.where(np.isfinite(half) & (half > 0), half, np.maximum(np.abs(0.5 * (hi + lo)), 1.0))
    return np.where(np.isfinite(lo + hi), 0.5 * (hi + lo), 0.0), half


def context_of(model, theta, x0: np.ndarray, data) -> Context:
    """The `Context` of ``model`` at ``theta`` from its free runs from ``x0`` (B, nx) on ``data``."""
    tv = model.params.to_vector(theta)
    us = [data.inputs(b) for b in range(len(data))]
    ys, xs = zip(*(run(model, tv, np.asarray(x0[b], float), us[b]) for b in range(len(data))))
    yc, yh = _centre_half(np.vstack(ys))
    uc, uh = _centre_half(np.vstack(us))
    xc, xh = _centre_half(np.vstack(xs))
    dx = np.vstack([np.diff(x, axis=0) for x in xs])
    dxh = np.nanstd(dx, axis=0) if dx.shape[0] > 1 else np.ones(model.nx)
    dxh = np.where(np.isfinite(dxh) & (dxh > 0), dxh, np.maximum(1e-3 * xh, 1e-12))
    return Context(yc, yh, uc, uh, xc, xh, dxh)


#: an augmented model: ``model``, its start ``theta`` and ``x0`` (B, nx) equal to the parent's optimum,
#: ``lift(theta, x0, data) -> (theta, x0)`` mapping any parent point to the child's equivalent point, and
#: ``n_new`` new parameter entries
Grown = namedtuple("Grown", "model theta x0 lift n_new")


@dataclass(frozen=True)
class Augmentation:
    """One move of the structure search (the table of docs/own_data.md, "How the search decides").

    Parameters
    ----------
    kind : str
        A key of `AUGMENTATIONS`, e.g. ``"output_poly"`` or ``"mlp_state"``.
    degree : int
        Polynomial degree of ``output_poly`` / ``input_poly`` (>= 2); the degrees added by
        ``poly_degree``.
    width : int
        Hidden tanh units of ``mlp_output`` / ``mlp_state``; the units added by ``nl_width``.
    seed : int
        Seed of an MLP's first layer (its output layer starts at 0).
    prior_std : float or None
        Std of the zero-mean Gaussian prior on an MLP's weights (scaled units; None: no prior).

    Raises
    ------
    OptionsError
        An unknown kind, a degree below 2, a width below 1 or a seed below 0.

    Examples
    --------
    >>> from ceem_casadi.workflow import Augmentation
    >>> Augmentation("output_poly", degree=5).label
    'output_poly(5)'
    """

    kind: str
    degree: int = 3
    width: int = 8
    seed: int = 0
    prior_std: float | None = 0.1

    def __post_init__(self):
        kind, sd = self.kind, self.prior_std
        require(kind in AUGMENTATIONS, f"augmentation kind must be one of {sorted(AUGMENTATIONS)}, got {kind!r}")
        require(sd is None or (is_number(sd) and sd > 0), f"prior_std must be None or > 0, got {sd!r}")
        for name, low in (("degree", 2), ("width", 1), ("seed", 0)):
            v = getattr(self, name)
            require(is_integer(v) and v >= low, f"{name} must be an int >= {low}, got {v!r}")

    @property
    def label(self) -> str:
        """The move's name in the search table, e.g. ``"output_poly(3)"`` or ``"mlp_state(8, sd=0.1)"``."""
        k = self.kind
        if k.endswith("_poly"):
            return f"{k}({self.degree})"
        sd = "" if self.prior_std is None else f", sd={self.prior_std:g}"
        return {"poly_degree": f"poly_degree(+{self.degree})", "nl_width": f"nl_width(+{self.width})",
                "order": "order(+1)"}.get(k, f"{k}({self.width}{sd})" if "mlp" in k else k)

    def applicable(self, model) -> bool:
        """Whether the move makes sense for ``model`` (input moves need inputs; the block moves a
        block-oriented model of `bla_initialise`: ``poly_degree`` a polynomial, ``nl_width`` an MLP ``f``)."""
        if self.kind in BLOCK_MOVES:
            kw = _FAMILIES[model][1] if model in _FAMILIES else None
            need = {"poly_degree": "poly", "nl_width": "mlp"}.get(self.kind)
            return kw is not None and need in (None, kw.get("nonlinearity", "poly"))
        return not (self.kind in ("input_poly", "lowpass_input") and model.nu == 0)


def _cheb(z, degree: int, coef):
    """``sum_{k=0..degree} coef[k] T_k(z)`` (z a scalar symbol)."""
    t_prev, t_cur = 1, z
    out = coef[0] + coef[1] * z
    for k in range(2, degree + 1):
        t_prev, t_cur = t_cur, 2 * z * t_cur - t_prev
        out = out + coef[k] * t_cur
    return out


def _extend(parent, new: list, tag: str, step, observe, extra_states: int = 0) -> StateSpaceModel:
    """The model with parameters ``parent.params + new`` and ``step(x, u, pp, q)``, ``observe(x, u, pp, q)``
    (``pp`` the parent's parameter vector, ``q`` the namespace of the new ones)."""
    sub = Parameters(*new)
    params = Parameters(*list(parent.params), *new)
    n0, nx = parent.params.size, parent.nx + extra_states
    x, u, pv = ca.SX.sym("x", nx), ca.SX.sym("u", parent.nu), ca.SX.sym("p", params.size)
    pp, q = pv[:n0], sub.symbols(pv[n0:])
    f = ca.Function("f", [x, u, pv], [ca.vec(step(x, u, pp, q))], ["x", "u", "p"], ["x_next"])
    g = ca.Function("g", [x, u, pv], [ca.vec(observe(x, u, pp, q))], ["x", "u", "p"], ["y"])
    ns = parent.noise
    ps = np.r_[ns.process_std, np.full(extra_states, float(np.min(ns.process_std)))]
    x1m = None if ns.x1_mean is None else np.r_[ns.x1_mean, np.zeros(extra_states)]
    x1s = None if ns.x1_std is None else np.r_[ns.x1_std, np.full(extra_states, 1e6)]
    return StateSpaceModel.from_functions(f, g, params=params, dt=parent.dt, name=f"{parent.name}_{tag}",
                                          process_std=ps, measurement_std=ns.measurement_std, x1_mean=x1m,
                                          x1_std=x1s)


def _static(parent, theta, x0, data, new, tag, step, observe, first=None) -> Grown:
    """A `Grown` whose new parameters start at their ``Param`` values; ``first`` (``"output"`` or
    ``"input"``): extra low-pass states started at that signal's first sample per trajectory."""
    n_extra = {None: 0, "output": parent.ny, "input": parent.nu}[first]
    model = _extend(parent, new, tag, step, observe, n_extra)
    init = {p.name: np.array(p.array("value")) for p in new}

    def lift(th, x, data):
        x = np.asarray(x, float).reshape(len(data), parent.nx)
        if n_extra:
            tv = parent.params.to_vector(th)
            z0 = [parent.g(x[b], data.inputs(b)[0], tv) if first == "output" else data.inputs(b)[0] for b in range(len(data))]
            x = np.hstack([x, np.array([np.asarray(z, float).ravel() for z in z0])])
        return {**parent.params.validate(th), **init}, x

    th0, x00 = lift(theta, x0, data)
    if is_block_oriented(parent):
        _GROWN_FROM_BLOCKS.add(model)
    return Grown(model, th0, x00, lift, sum(p.size for p in new))


def augment(aug: Augmentation, parent, theta, x0, data, ctx: Context, tag: str) -> Grown:
    """Grow ``parent`` at its optimum ``(theta, x0)`` by ``aug`` (docs/own_data.md); the child's start
    is ``lift(theta, x0, data)``. ``tag`` prefixes the new parameter names (unique per search)."""
    k, ny, nu, nx = aug.kind, parent.ny, parent.nu, parent.nx
    if k in BLOCK_MOVES:
        return _rebuild(aug, parent, theta, x0, data)
    fp, gp = parent.f, parent.g
    yc, yh, uc, uh = (ca.DM(v) for v in (ctx.yc, ctx.yh, ctx.uc, ctx.uh))
    xc, xh, dxh = ca.DM(ctx.xc), ca.DM(ctx.xh), ca.DM(ctx.dxh)
    same_f = lambda x, u, pp, q: fp(x, u, pp)  # noqa: E731

    def scaled(x, u):
        return ca.vertcat((x[:nx] - xc) / xh, (u - uc) / uh) if nu else (x[:nx] - xc) / xh

    if k == "offset":
        new = [Param(f"{tag}_offset", np.zeros(ny))]
        return _static(parent, theta, x0, data, new, tag, same_f, lambda x, u, pp, q: gp(x, u, pp) + getattr(q, new[0].name))
    if k == "gain":
        new = [Param(f"{tag}_gain", np.zeros(ny))]

        def obs(x, u, pp, q):
            y = gp(x, u, pp)
            return y + getattr(q, new[0].name) * (y - yc)
        return _static(parent, theta, x0, data, new, tag, same_f, obs)
    if k == "output_poly":
        new = [Param(f"{tag}_ypoly", np.zeros((ny, aug.degree + 1)))]

        def obs(x, u, pp, q):
            y, c = gp(x, u, pp), getattr(q, new[0].name)
            z = (y - yc) / yh
            return ca.vertcat(*[y[j] + yh[j] * _cheb(z[j], aug.degree, c[j, :].T) for j in range(ny)])
        return _static(parent, theta, x0, data, new, tag, same_f, obs)
    if k == "input_poly":
        new = [Param(f"{tag}_upoly", np.zeros((nu, aug.degree + 1)))]

        def warp(u, q):
            c, z = getattr(q, new[0].name), (u - uc) / uh
            return ca.vertcat(*[u[i] + uh[i] * _cheb(z[i], aug.degree, c[i, :].T) for i in range(nu)])
        return _static(parent, theta, x0, data, new, tag, lambda x, u, pp, q: fp(x, warp(u, q), pp),
                       lambda x, u, pp, q: gp(x, warp(u, q), pp))
    if k == "state_output":
        new = [Param(f"{tag}_cx", np.zeros((ny, nx)))]
        return _static(parent, theta, x0, data, new, tag, same_f,
                       lambda x, u, pp, q: gp(x, u, pp) + yh * ca.mtimes(getattr(q, new[0].name), (x - xc) / xh))
    if k in ("lowpass_output", "lowpass_input"):
        out = k == "lowpass_output"
        n = ny if out else nu
        new = [Param(f"{tag}_pole", np.full(n, 0.5), lower=0.0, upper=0.99), Param(f"{tag}_mix", np.zeros(n))]

        def parts(x, u, q):
            return x[:nx], x[nx:], getattr(q, new[0].name), getattr(q, new[1].name)

        if out:
            def step(x, u, pp, q):
                xs, z, a, c = parts(x, u, q)
                return ca.vertcat(fp(xs, u, pp), a * z + (1 - a) * gp(xs, u, pp))

            def obs(x, u, pp, q):
                xs, z, _, c = parts(x, u, q)
                y = gp(xs, u, pp)
                return y + c * (z - y)
        else:
            def step(x, u, pp, q):
                xs, z, a, c = parts(x, u, q)
                return ca.vertcat(fp(xs, u + c * (z - u), pp), a * z + (1 - a) * u)

            def obs(x, u, pp, q):
                xs, z, _, c = parts(x, u, q)
                return gp(xs, u + c * (z - u), pp)
        return _static(parent, theta, x0, data, new, tag, step, obs, "output" if out else "input")
    # MLPs on the scaled states and inputs: output layer at zero
    net = MLP((nx + nu, aug.width, ny if k == "mlp_output" else nx), name=f"{tag}_mlp")
    prior = {} if aug.prior_std is None else dict(prior_mean=0.0, prior_std=float(aug.prior_std))
    new = net.params(np.random.default_rng([aug.seed, 31]), last_scale=0.0, **prior)
    if k == "mlp_output":
        return _static(parent, theta, x0, data, new, tag, same_f,
                       lambda x, u, pp, q: gp(x, u, pp) + yh * net(q, scaled(x, u)))
    return _static(parent, theta, x0, data, new, tag, lambda x, u, pp, q: fp(x, u, pp) + dxh * net(q, scaled(x, u)),
                   lambda x, u, pp, q: gp(x, u, pp))


def _grow_blocks(th: dict, x: np.ndarray, kw: dict) -> tuple[dict, np.ndarray, dict]:
    """Every linear block of order n raised to n + 1: an odd n's first-order section becomes second
    order with ``den = 0`` (a delayed state), an even n gets a first-order section (pole 0.5); the new
    output weight and state (inserted after the block's states) at 0."""
    th, x, kw, at = dict(th), np.asarray(x, float), dict(kw), 0
    for block, key in (("g1", "n1"), ("g2", "n2")) if "n1" in kw else (("g", "n"),):
        n = int(kw[key])
        th[f"{block}_den"] = np.r_[np.asarray(th[f"{block}_den"], float), 0.0 if n % 2 else -0.5]
        th[f"{block}_num"] = np.r_[np.asarray(th[f"{block}_num"], float), 0.0]
        at += n
        x = np.insert(x, at, 0.0, axis=1)
        at, kw[key] = at + 1, n + 1
    return th, x, kw


def _widen(th: dict, x: np.ndarray, kw: dict, width: int, seed: int) -> tuple[dict, np.ndarray, dict]:
    """The MLP nonlinearity ``f`` with ``width`` more tanh units, their output weights at 0."""
    w = MLP((1, width, 1), name="f").init(np.random.default_rng([seed, 33, int(kw["hidden"])]), last_scale=0.0)
    th = {**th, "f_W0": np.vstack([th["f_W0"], w["f_W0"]]), "f_b0": np.r_[th["f_b0"], w["f_b0"]],
          "f_W1": np.hstack([th["f_W1"], w["f_W1"]])}
    return th, x, {**kw, "hidden": int(kw["hidden"]) + width}


def _rebuild(aug: Augmentation, parent, theta, x0, data) -> Grown:
    """A block-oriented ``parent`` rebuilt by its factory with a higher polynomial degree
    (``poly_degree``), MLP width (``nl_width``) or block orders (``order``), the new terms at 0."""
    factory, kw = _FAMILIES[parent]

    def change(th, x):
        th, x = {k: np.asarray(v, float) for k, v in parent.params.validate(th).items()}, np.asarray(x, float)
        if aug.kind == "poly_degree":
            return {**th, "f_coef": np.r_[th["f_coef"], np.zeros(aug.degree)]}, x, \
                {**kw, "degree": int(kw["degree"]) + aug.degree}
        if aug.kind == "nl_width":
            return _widen(th, x, kw, aug.width, aug.seed)
        return _grow_blocks(th, x, kw)

    th0, x00, kw_child = change(theta, np.asarray(x0, float).reshape(len(data), parent.nx))
    model = factory(**{**kw_child, "theta0": th0})
    register_family(model, factory, kw_child)
    return Grown(model, model.params.validate(th0), x00, lambda th, x, data: change(th, x)[:2],
                 model.params.size - parent.params.size)


#: the moves of block-oriented models (`bla_initialise`), each rebuilt by its factory
BLOCK_MOVES = ("poly_degree", "nl_width", "order")
#: generic moves the default search does not offer a block-oriented model: in its span (offset, gain) or too
#: costly for no better tail (MLP residuals; docs/own_data.md); a user who lists them explicitly gets them
NOT_FOR_BLOCKS = ("offset", "gain", "mlp_output", "mlp_state")
#: every kind of `Augmentation` (docs/own_data.md)
AUGMENTATIONS = ("offset", "gain", "output_poly", "input_poly", "state_output", "lowpass_output", "lowpass_input",
                 "mlp_output", "mlp_state", "poly_degree", "order", "nl_width")
