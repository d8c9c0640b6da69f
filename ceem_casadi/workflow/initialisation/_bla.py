"""Initialise a block-oriented model (`ceem_casadi.model.wiener` and its siblings) from its best linear
approximation: poles and zeros split over the linear blocks, each split's nonlinearity fitted by linear least squares,
the lowest simulation RMS kept (docs/block_oriented.md, "Initialisation from the best linear approximation")."""
from __future__ import annotations

import itertools
import logging

import numpy as np

from ...baselines._n4sid import N4SIDResult, n4sid
from ...errors import OptionsError, ShapeError
from ...io._data import Trajectories
from ...io._validate import check_excitation
from ...model._block_oriented import block_system, hammerstein, sections, wiener, wiener_hammerstein
from ...runtime import _policy as policy
from ...runtime._schema import require
from .._augment import register_family
from ..output_error._output_error import refine_output_error
from ._bla_result import BLAInit, SplitFit
from ._frf import FRF
from ._frf_fit import FRFFit, frf_bla

logger = logging.getLogger(__name__)
KINDS = ("wiener", "hammerstein", "wiener_hammerstein")
_IMAG_TOL = 1e-8


def _signal():
    """``scipy.signal``, imported on first use: it costs about 1 s of CPU at start-up (with scipy.stats)."""
    import scipy.signal

    return scipy.signal


def _groups(roots) -> list[np.ndarray]:
    """Real roots and complex-conjugate pairs (one group each)."""
    out = []
    for r in np.asarray(roots, complex):
        if abs(r.imag) <= _IMAG_TOL * max(1.0, abs(r)):
            out.append(np.array([complex(r.real, 0.0)]))
        elif r.imag > 0:
            out.append(np.array([r, np.conj(r)]))
    return out


def _subsets(groups, size: int):
    """Index sets of groups whose sizes add up to ``size``."""
    for k in range(len(groups) + 1):
        for idx in itertools.combinations(range(len(groups)), k):
            if sum(len(groups[i]) for i in idx) == size:
                yield set(idx)


def _splittable(groups, size: int, two: bool, what: str) -> tuple[list, list]:
    """The groups and their index sets of ``size`` roots for G1 (all of them for one block); while
    there is none (size odd, only complex pairs left), the pair closest to the real axis becomes a
    double real root at its real part."""
    sets = list(_subsets(groups, size)) if two else [set(range(len(groups)))]
    while not sets:
        k = min((j for j, g in enumerate(groups) if len(g) == 2), key=lambda j: abs(np.angle(groups[j][0])))
        logger.info("bla_initialise: no split with %d %s in G1; pair %s taken as a double real root", size, what,
                    groups[k][0])
        groups = groups[:k] + [np.array([complex(groups[k][0].real)])] * 2 + groups[k + 1:]
        sets = list(_subsets(groups, size))
    return groups, sets


def _cat(groups, idx) -> np.ndarray:
    parts = [groups[i] for i in sorted(idx)]
    return np.concatenate(parts) if parts else np.zeros(0, complex)


def _bla_roots(bla: N4SIDResult, n_zeros: int) -> tuple[np.ndarray, np.ndarray]:
    poles = np.linalg.eigvals(bla.A)
    num, _ = _signal().ss2tf(bla.A, bla.B, bla.C, bla.D)
    num = np.trim_zeros(np.real(num[0]), "f")
    zeros = np.roots(num) if num.size > 1 else np.zeros(0, complex)
    zeros = zeros[np.argsort(np.abs(zeros), kind="stable")][:n_zeros]
    if np.sum(zeros.imag > _IMAG_TOL) != np.sum(zeros.imag < -_IMAG_TOL):        # a pair cut in two
        zeros = np.where(np.abs(zeros.imag) > _IMAG_TOL, zeros.real, zeros)
    zeros = np.concatenate([zeros, np.zeros(n_zeros - zeros.size)])            # too few: zeros at 0
    return poles, zeros.astype(complex)


def _tf(poles, zeros, feedthrough: bool, gain: str = "markov") -> tuple[np.ndarray, np.ndarray]:
    """``(b, a)`` in powers of q^-1 with a unit leading Markov coefficient (b[0] = 1, or b[1] = 1), or
    (``gain="dc"``) a unit static gain ``sum b / sum a = 1``."""
    b = np.real(np.poly(zeros)) if len(zeros) else np.ones(1)
    a = np.real(np.poly(poles))
    b = b if feedthrough else np.concatenate([[0.0], b])
    if gain == "dc":
        k = float(np.sum(b) / np.sum(a))
        if not np.isfinite(k) or abs(k) < 1e-12:
            raise OptionsError("gain='dc' needs blocks with a nonzero static gain; this split has a zero at z = 1: "
                                  "use gain='markov'")
        b = b / k
    return b, a


def _features(z, kind: str, degree: int, hidden, basis: str = "monomial") -> np.ndarray:
    """Basis (T, k) of f at ``z = (v - center) / scale``: monomials z^0..z^degree, Chebyshev polynomials
    T_0(z)..T_degree(z), or 1 and tanh(W0 z + b0)."""
    if kind == "poly":
        if basis == "chebyshev":
            return np.polynomial.chebyshev.chebvander(z, degree)
        return z[:, None] ** np.arange(degree + 1)
    W0, b0 = hidden
    return np.column_stack([np.ones_like(z), np.tanh(z[:, None] * W0[:, 0] + b0)])


def _hidden_layer(hidden: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Fixed hidden layer of the ``"mlp"`` least squares: unit i has slope ``W0_i`` of random sign and
    modulus U(1, 2) on the unit-variance input, and its centre ``-b0_i / W0_i`` at the i-th of
    ``hidden`` points evenly spread over [-2, 2] (the bulk of the input), jittered by U(-0.2, 0.2)."""
    centres = np.linspace(-2.0, 2.0, hidden) + rng.uniform(-0.2, 0.2, hidden) if hidden > 1 else np.zeros(1)
    W0 = rng.choice([-1.0, 1.0], hidden) * rng.uniform(1.0, 2.0, hidden)
    return W0.reshape(-1, 1), -W0 * centres


def _fit_split(kind, data, skip, blocks, feedthrough, nl, degree, hidden, gain="markov", basis="monomial",
               out_scale=1.0) -> tuple[float, np.ndarray, float, float]:
    """RMS, coefficients, scale and center of the least-squares nonlinearity for given block transfer
    functions (coefficients of ``f / out_scale``)."""
    us = [data.inputs(b)[:, 0] for b in range(len(data))]
    vs = us if kind == "hammerstein" else [_signal().lfilter(*_tf(*blocks[0], feedthrough[0], gain), u) for u in us]
    used = np.concatenate([v[skip:] for v in vs])
    if basis == "chebyshev":     # [-1, 1] = the input range of f on the data, widened by 10 %
        center = 0.5 * float(np.max(used) + np.min(used))
        scale = 0.55 * float(np.max(used) - np.min(used)) or 1.0
    else:
        center, scale = 0.0, float(np.std(used)) or 1.0
    rows = []
    for v in vs:
        phi = _features((v - center) / scale, nl, degree, hidden, basis)
        if kind != "wiener":                         # the output block filters every basis signal
            phi = _signal().lfilter(*_tf(*blocks[-1], feedthrough[-1], gain), phi, axis=0)
        rows.append(phi[skip:])
    Phi = np.vstack(rows)
    y = np.concatenate([yb[skip:, 0] for yb in data.y])
    ok = np.isfinite(y)
    Phi, y = Phi[ok], y[ok]
    if nl == "mlp":  # a ridge of 1e-6 of the mean diagonal keeps redundant tanh units from cancelling with huge weights
        G = Phi.T @ Phi
        coef = np.linalg.solve(G + (1e-6 * np.trace(G) / G.shape[0]) * np.eye(G.shape[0]), Phi.T @ y)
    else:
        coef = np.linalg.lstsq(Phi, y, rcond=1e-10)[0]
    rms = float(np.sqrt(np.mean((y - Phi @ coef) ** 2)))
    return rms, coef / out_scale, scale, center


def _den_from_poles(poles, n: int) -> np.ndarray:
    """``<g>_den`` of the sections: complex pairs first, then real poles (descending) paired, one left for
    the first-order section when n is odd."""
    pairs = [g for g in _groups(poles) if len(g) == 2]
    reals = sorted((g[0].real for g in _groups(poles) if len(g) == 1), reverse=True)
    quads = [np.real(np.poly(p))[1:] for p in pairs]
    while len(reals) >= 2 and len(quads) < n // 2:
        quads.append(np.real(np.poly(reals[:2]))[1:])
        reals = reals[2:]
    den = np.concatenate(quads + [[-reals[0]]] if n % 2 else quads)
    assert den.size == n and len(sections(n)) == len(quads) + n % 2
    return den


def _block_theta(prefix, poles, zeros, feedthrough) -> dict:
    """``<g>_den``, ``<g>_num`` realising the unit-leading-Markov transfer function of the given roots."""
    n = len(poles)
    den = _den_from_poles(poles, n)
    b, a = _tf(poles, zeros, feedthrough)
    K = 4 * n + 20
    impulse = np.zeros(K)
    impulse[0] = 1.0
    h = _signal().lfilter(b, a, impulse)
    A, B, _, _ = block_system(den, np.zeros(n), 0.0)
    X = np.empty((K, n))
    x = np.zeros(n)
    for t in range(K):                               # state response to the impulse: x_0 = 0, x_1 = B, ...
        X[t] = x
        x = A @ x + B * impulse[t]
    num = np.linalg.lstsq(X[1:], h[1:], rcond=None)[0]
    if not feedthrough:
        num[0] = 1.0                                 # C B = h_1 = 1 exactly (fixed entry)
    return {f"{prefix}_den": den, f"{prefix}_num": num}


def _nl_theta(nl, coef, hidden) -> dict:
    if nl == "poly":
        return {"f_coef": np.asarray(coef, float)}
    W0, b0 = hidden
    return {"f_W0": W0, "f_b0": b0, "f_W1": coef[1:].reshape(1, -1), "f_b1": coef[:1].copy()}


def _as_bla(bla, n: int):
    """A user BLA as ``(A, B, C, D)``: an object with A, B, C, D (an N4SIDResult) or a transfer function
    ``(b, a)`` in powers of q^-1."""
    if all(hasattr(bla, k) for k in "ABCD"):
        A, B, C, D = (np.atleast_2d(np.asarray(getattr(bla, k), float)) for k in "ABCD")
    elif isinstance(bla, (tuple, list)) and len(bla) == 2:
        b, a = (np.asarray(x, float).ravel() for x in bla)
        A, B, C, D = _signal().tf2ss(b, a)
    else:
        raise ShapeError("bla: expected an object with A, B, C, D (e.g. an N4SIDResult) or a transfer function "
                            f"(b, a) in powers of q^-1, got {type(bla).__name__}")
    if A.shape[0] != n:
        raise ShapeError(f"bla: expected order n1 + n2 = {n} (the model's total order), got {A.shape[0]}")
    return A, B, C, D


def _bla_rms(A, B, C, D, data, skip: int, y_mean: float, u_mean: float) -> float:
    """Simulation RMS (units of y) of the BLA from rest on ``data`` (first ``skip`` samples left out)."""
    err = []
    for b in range(len(data)):
        u = data.inputs(b)[:, 0] - u_mean
        _, yb, _ = _signal().dlsim((A, B, C, D, 1.0), u)
        e = data.y[b][skip:, 0] - (yb[skip:, 0] + y_mean)
        err.append(e[np.isfinite(e)])
    return float(np.sqrt(np.mean(np.concatenate(err) ** 2)))


def _split_table(bla, source, kind, data, skip, orders, fts, nonlinearity, degree, hidden_layer, gain, basis,
                 out_scale, max_splits) -> list:
    """Every split of one BLA's poles and zeros across the blocks, each with its least-squares
    nonlinearity (steps 2-3 of docs/block_oriented.md)."""
    two, n1 = kind == "wiener_hammerstein", orders[0]
    n_zeros = [k - 1 + f for k, f in zip(orders, fts)]
    poles, zeros = _bla_roots(bla, sum(n_zeros))
    pg, zg = _groups(poles), _groups(zeros)
    pg, pole_sets = _splittable(pg, n1, two, "poles")
    zg, zero_sets = _splittable(zg, n_zeros[0], two, "zeros")
    require(len(pole_sets) * len(zero_sets) <= max_splits, f"{len(pole_sets) * len(zero_sets)} splits to try, more "
            f"than max_splits={max_splits}; raise max_splits or lower the orders")
    table, seen = [], set()
    for ps, zs in itertools.product(pole_sets, zero_sets):
        rest_p, rest_z = set(range(len(pg))) - ps, set(range(len(zg))) - zs
        blocks = [(_cat(pg, ps), _cat(zg, zs))] + ([(_cat(pg, rest_p), _cat(zg, rest_z))] if two else [])
        key = tuple(tuple(np.round(np.sort_complex(r), 12)) for r in blocks[0])
        if key in seen:                              # equal roots in different groups (a double pole)
            continue
        seen.add(key)
        rms, coef, scale, center = _fit_split(kind, data, skip, blocks, fts, nonlinearity, degree, hidden_layer,
                                              gain, basis, out_scale)
        g2 = blocks[1] if two else (np.zeros(0, complex), np.zeros(0, complex))
        table.append(SplitFit(blocks[0][0], blocks[0][1], g2[0], g2[1], rms, coef, scale, center, source))
    return table


def bla_initialise(kind: str, data: Trajectories, n1: int, n2: int = 0, *, feedthrough=None,
                   nonlinearity: str = "poly", degree: int = 3, hidden: int = 8, seed: int = 0,
                   skip: int | None = None, max_splits: int = 5000, gain: str = "markov",
                   basis: str = "monomial", bla=None, n4sid_options: dict | None = None,
                   period: int | str | None = None, refine: bool = False, **model_kwargs) -> BLAInit:
    """Initial theta of a block-oriented model from the best linear approximation (docs/block_oriented.md).

    Parameters
    ----------
    kind : ``"wiener"``, ``"hammerstein"`` or ``"wiener_hammerstein"``.
    data : Trajectories with one input and one output (NaN outputs skipped in the least squares).
    n1, n2 : block orders (Wiener / Hammerstein: ``n1`` only).
    feedthrough : the factory's (a bool; a pair for Wiener-Hammerstein); default the factory's.
    nonlinearity, degree, hidden, seed : the factory's (``seed`` also draws the fixed hidden layer of ``"mlp"``).
    skip : samples left out at the start of every trajectory (default ``min(10 n, T_min // 4)``).
    max_splits : refuse to try more splits than this (the count grows combinatorially with n).
    gain, basis : the factory's conditioning (see `ceem_casadi.model.wiener`).
    bla : a BLA of order n1 + n2 instead of N4SID's: an object with ``A, B, C, D``, a transfer function
        ``(b, a)`` in powers of q^-1, or ``"frf"``, an [`FRF`][ceem_casadi.workflow.FRF] or an
        [`FRFFit`][ceem_casadi.workflow.FRFFit] of periodic data.
    n4sid_options : more keyword arguments of N4SID (e.g. ``{"horizon": 30}``).
    period : samples per period of a periodic input (or ``"auto"``): the FRF's BLA joins N4SID's, or replaces
        it with ``bla="frf"``; without it, at most the first ``INIT_SAMPLES`` samples are used.
    refine : polish theta by output error on the first ``REFINE_SAMPLES`` samples (``result.refinement``).
    model_kwargs : passed to the factory (noise levels, ``dt``).

    Returns
    -------
    BLAInit
        ``model``, ``theta``, ``table`` (best first), the ``bla`` used and its simulation RMS ``bla_rms``.

    Raises
    ------
    OptionsError, ShapeError
        An unknown kind, orders below 1, data that are not SISO, a BLA of the wrong form or order.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from scipy.signal import lfilter
    >>> u = np.random.default_rng(0).normal(size=(400, 1))       # Wiener: a first-order filter, then tanh
    >>> y = np.tanh(lfilter([0, 0.5], [1, -0.6], u[:, 0]))[:, None]
    >>> init = cc.workflow.bla_initialise("wiener", cc.Trajectories([y], [u]), 1)
    >>> init.model.nx
    1
    """
    orders, fts = _orders(kind, data, n1, n2, feedthrough)
    n = sum(orders)
    if period is None:
        data = data.leading(policy.INIT_SAMPLES)
    skip = min(10 * n, min(data.lengths) // 4) if skip is None else int(skip)
    hidden_layer = _hidden_layer(hidden, np.random.default_rng(seed)) if nonlinearity == "mlp" else None
    y_mean = np.nanmean(np.concatenate(data.y))
    u_mean = np.mean(np.concatenate([data.inputs(b) for b in range(len(data))]))
    out_scale = (float(np.nanstd(np.concatenate([yb[:, 0] for yb in data.y]))) if gain == "dc" else 1.0) or 1.0
    frf, candidates = _candidates(bla, data, period, n, fts, y_mean, u_mean, n4sid_options)
    table, blas = [], {}
    for source, cand in candidates:
        A_b, B_b, C_b, D_b = _as_bla(cand, n)
        if not all(hasattr(cand, k) for k in "ABCD"):
            cand = type("BLA", (), {"A": A_b, "B": B_b, "C": C_b, "D": D_b})()
        blas[source] = (cand, _bla_rms(A_b, B_b, C_b, D_b, data, skip, y_mean, u_mean))
        table += _split_table(cand, source, kind, data, skip, orders, fts, nonlinearity, degree, hidden_layer,
                              gain, basis, out_scale, max_splits)
    table.sort(key=lambda s: s.rms)
    best = table[0]
    bla, bla_rms = blas[best.bla]
    logger.info("bla_initialise: %d splits tried, best simulation RMS %.4g (BLA: %s)", len(table), best.rms, best.bla)
    conditioning = dict(gain=gain, basis=basis, center=best.center, out_scale=out_scale)
    opts = dict(nonlinearity=nonlinearity, degree=degree, hidden=hidden, scale=best.scale,
                theta0=_split_theta(best, fts, nonlinearity, hidden_layer), seed=seed, **conditioning, **model_kwargs)
    model, theta = _build(kind, n1, n2, fts, opts)
    refinement = None
    if refine:  # never worse than the split's theta (the LM engine returns its best iterate)
        part = data.leading(policy.REFINE_SAMPLES)
        refinement = refine_output_error(model, part, theta, x0=np.zeros((len(part), model.nx)))
        theta = model.params.validate(refinement.theta)
        logger.info("bla_initialise: output-error polish on %d samples: %s after %d iterations", part.lengths[0],
                    refinement.status, refinement.iterations)
    return BLAInit(model=model, theta=theta, table=table, bla=bla, x0=np.zeros((len(data), model.nx)),
                   bla_rms=bla_rms, conditioning=conditioning, frf=frf, refinement=refinement)


def _orders(kind, data, n1: int, n2: int, feedthrough) -> tuple[tuple, tuple]:
    """Validated block orders and feedthrough flags, one per block (the factory's default flags)."""
    require(kind in KINDS, f"kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(data, Trajectories) or data.nu != 1 or data.ny != 1:
        raise ShapeError("data: expected a Trajectories with one input and one output (nu = ny = 1)")
    check_excitation(data)  # a constant (or all-zero) input: refused, as estimate_frf refuses it
    two = kind == "wiener_hammerstein"
    if n1 < 1 or (two and n2 < 1):
        raise ShapeError(f"{kind} needs block orders >= 1 (n1{', n2' if two else ''}), got n1={n1}, n2={n2}")
    if feedthrough is None:
        feedthrough = (False, True) if two else False
    if not two:
        return (n1,), (bool(feedthrough),)
    if np.ndim(feedthrough) != 1 or len(feedthrough) != 2:
        raise ShapeError(f"feedthrough: expected a pair (G1, G2) of bools for wiener_hammerstein, got {feedthrough!r}")
    return (n1, n2), tuple(bool(f) for f in feedthrough)


def _candidates(bla, data, period, n: int, fts, y_mean, u_mean, n4sid_options) -> tuple:
    """The FRF fit (or None) and the BLAs to split, ``[(source, BLA)]``: the FRF's with ``period=``,
    N4SID's without a ``bla``, or the user's."""
    frf, out = None, []
    if period is not None or isinstance(bla, (str, FRF, FRFFit)):
        if (isinstance(bla, str) and bla != "frf") or not (bla is None or isinstance(bla, (str, FRF, FRFFit))):
            raise OptionsError(f"bla: with period= expected None, 'frf', an FRF or an FRFFit, got {bla!r}"
                               if not isinstance(bla, str) else f"bla: expected 'frf' or a BLA object, got {bla!r}")
        frf = frf_bla(bla, data, period, n, all(fts))
        if frf is not None:
            out.append(("frf", (np.trim_zeros(frf.b, "f"), frf.a)))
    if bla is None:
        centred = Trajectories([data.y[b] - y_mean for b in range(len(data))],
                               [data.inputs(b) - u_mean for b in range(len(data))], dt=data.dt)
        out.append(("n4sid", n4sid(centred, **{"order": n, "feedthrough": all(fts), "stable": True,
                                               **(n4sid_options or {})})))
    elif not isinstance(bla, (str, FRF, FRFFit)):
        out.append(("user", bla))
    return frf, out


def _split_theta(best: SplitFit, fts, nonlinearity: str, hidden_layer) -> dict:
    """theta of the best split: each block's sections and output row, then f's coefficients."""
    if len(fts) == 2:
        theta = {**_block_theta("g1", best.g1_poles, best.g1_zeros, fts[0]),
                 **_block_theta("g2", best.g2_poles, best.g2_zeros, fts[1])}
    else:
        theta = _block_theta("g", best.g1_poles, best.g1_zeros, fts[0])
    return {**theta, **_nl_theta(nonlinearity, best.coef, hidden_layer)}


def _build(kind: str, n1: int, n2: int, fts, opts: dict):
    """The factory's model with ``opts`` (registered for the search's degree move) and its theta."""
    two = kind == "wiener_hammerstein"
    factory = wiener_hammerstein if two else (wiener if kind == "wiener" else hammerstein)
    args = dict(n1=n1, n2=n2, feedthrough=fts) if two else dict(n=n1, feedthrough=fts[0])
    model = factory(**args, **opts)
    register_family(model, factory, {**args, **opts})  # the structure search's degree move (_augment.py)
    return model, model.params.validate(opts["theta0"])
