"""``G(z) = B(z^-1) / A(z^-1)`` fitted to an [`FRF`][ceem_casadi.workflow.FRF] by weighted nonlinear least
squares from Sanathanan-Koerner and subspace starts (docs/block_oriented.md, "Periodic inputs")."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ...errors import DataError, ShapeError
from ...io._data import Trajectories
from ...runtime._best import BestIterate
from ...runtime._checks import is_integer
from ...runtime._result import Result
from ...runtime._schema import require
from ._frf import FRF, detect_period, estimate_frf

logger = logging.getLogger(__name__)
__all__ = ["FRFFit", "fit_frf"]


@dataclass(repr=False)
class FRFFit(Result):
    """A discrete-time transfer function ``G(z) = B(z^-1) / A(z^-1)``, ``a[0] = 1``, fitted to an
    [`FRF`][ceem_casadi.workflow.FRF] (`fit_frf`).

    Attributes
    ----------
    b, a : numpy.ndarray
        Numerator and denominator coefficients in powers of z^-1 (``scipy.signal.lfilter``'s).
    poles, zeros : numpy.ndarray
        Their roots in z (complex).
    cost : float
        ``sum_k |(G_k - B/A) / sigma_k|^2`` over the bins.
    dof : int
        2 K minus the number of fitted coefficients (``cost / dof`` near 1: fitted within the FRF's noise).
    iterations : int
        Sanathanan-Koerner iterations.
    stabilised : bool
        Whether unstable poles were reflected into the unit circle.
    dt : float
        Sample time, s.

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.workflow import FRFFit
    >>> fit = FRFFit(np.array([0.0, 0.5]), np.array([1.0, -0.5]), np.array([0.5 + 0j]), np.zeros(0, complex),
    ...              0.0, 10, 1, False, 1.0)
    >>> complex(np.round(fit.response(0.0), 12))    # static gain 0.5 / (1 - 0.5)
    (1+0j)
    """

    SUMMARY = ("poles", "cost", "dof", "stabilised")

    b: np.ndarray
    a: np.ndarray
    poles: np.ndarray
    zeros: np.ndarray
    cost: float
    dof: int
    iterations: int
    stabilised: bool
    dt: float

    def response(self, freqs) -> np.ndarray:
        """Frequency response (complex, shape of ``freqs``) at ``freqs`` in Hz."""
        zi = np.exp(-2j * np.pi * np.asarray(freqs, float) * self.dt)
        return np.polyval(self.b[::-1], zi) / np.polyval(self.a[::-1], zi)


def _basis(frf: FRF, nb: int, na: int, first: int):
    zi = np.exp(-2j * np.pi * frf.freqs * frf.dt)                       # z^-1 on the bins
    Zb = zi[:, None] ** np.arange(first, nb + 1)
    Za = zi[:, None] ** np.arange(1, na + 1)
    return Zb, Za


def _ri(x):
    return np.concatenate([x.real, x.imag])


def _numerator(G, w, Zb, A):
    """Weighted least-squares B for fixed A: min sum |w (G A - B)|^2 / |A|^2 = sum |w (G - B/A)|^2."""
    M = Zb * (w / A)[:, None]
    return np.linalg.lstsq(np.vstack([M.real, M.imag]), _ri(w * G), rcond=None)[0]


def _subspace_poles(freqs, G, w, dt, n: int, q: int) -> np.ndarray:
    """Poles of the frequency-domain subspace estimate (McKelvey, Akcay and Ljung 1996; docs/block_oriented.md)
    with ``q`` block rows and order ``n``."""
    z = np.exp(2j * np.pi * freqs * dt)
    Wm = z[None, :] ** np.arange(q)[:, None] * w
    Gm = Wm * G
    Wr, Gr = np.hstack([Wm.real, Wm.imag]), np.hstack([Gm.real, Gm.imag])
    Qw = np.linalg.qr(Wr.T)[0]
    obs = np.linalg.svd(Gr - (Gr @ Qw) @ Qw.T, full_matrices=False)[0][:, :n]
    return np.linalg.eigvals(np.linalg.lstsq(obs[:-1], obs[1:], rcond=None)[0])


def _sk_denominator(G, w, Zb, Za, iterations: int, tol: float) -> tuple[np.ndarray, int]:
    """Sanathanan-Koerner iterations from Levy's (A_prev = 1): denominator coefficients a[1:], iterations."""
    nbp = Zb.shape[1]
    A_prev = np.ones(G.size, complex)
    theta = np.zeros(nbp + Za.shape[1])
    it = 0
    for it in range(1, iterations + 1):  # noqa: B007 (the count is returned)
        Mx = np.hstack([Zb, -G[:, None] * Za]) * (w / A_prev)[:, None]     # (B - G (A - 1)) w / A_prev = G w / A_prev
        Mr = np.vstack([Mx.real, Mx.imag])
        scale = np.linalg.norm(Mr, axis=0)
        scale[scale == 0] = 1.0
        new = np.linalg.lstsq(Mr / scale, _ri(G * w / A_prev), rcond=None)[0] / scale
        change = np.linalg.norm(new - theta) / max(np.linalg.norm(new), 1e-300)
        theta = new
        A_prev = 1.0 + Za @ theta[nbp:]
        if change < tol:
            break
    return theta[nbp:], it


def _weights(sd: np.ndarray, smooth: int) -> np.ndarray:
    """1 / std, the variance averaged over ``2 smooth + 1`` bins; unit weights when some bin has no usable std."""
    usable = np.isfinite(sd) & (sd > 0)
    if not np.all(usable):
        return np.ones(sd.shape)
    v, k = sd ** 2, np.ones(2 * smooth + 1)
    v = np.convolve(v, k, "same") / np.convolve(np.ones_like(v), k, "same")
    return 1.0 / np.sqrt(v)


def fit_frf(frf: FRF, order: int, *, n_b: int | None = None, feedthrough: bool = True, smooth: int = 5,
            iterations: int = 50, tol: float = 1e-10) -> FRFFit:
    """Fit ``B(z^-1) / A(z^-1)`` of order ``order`` to an FRF: ``sum_k |(G_k - B/A) / sigma_k|^2`` by
    Levenberg-Marquardt from several starts, unstable poles reflected, the lowest cost kept.

    Parameters
    ----------
    frf : FRF
        From `estimate_frf` (its ``std`` weights the bins).
    order : int
        Degree of A (number of poles), >= 1.
    n_b : int, optional
        Degree of B in z^-1 (default ``order``).
    feedthrough : bool
        Fit ``b[0]``; False fixes it to 0 (a strictly proper BLA).
    smooth : int
        The variance of G is averaged over ``2 smooth + 1`` neighbouring bins before weighting.
    iterations, tol : int, float
        Largest number of Sanathanan-Koerner iterations, and their relative tolerance on the coefficients.

    Returns
    -------
    FRFFit

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.workflow import FRF, fit_frf
    >>> f = np.arange(1, 40) / 128
    >>> zi = np.exp(-2j * np.pi * f)
    >>> G = (0.2 * zi + 0.1 * zi ** 2) / (1 - 1.2 * zi + 0.5 * zi ** 2)
    >>> frf = FRF(f, np.arange(1, 40), G, np.full(39, 1e-3), np.full(39, np.nan), 128, 2, 1, 1.0)
    >>> fit = fit_frf(frf, 2, feedthrough=False)
    >>> np.round(fit.a, 6).tolist(), np.round(fit.b, 6).tolist()
    ([1.0, -1.2, 0.5], [0.0, 0.2, 0.1])
    """
    from scipy.optimize import least_squares  # imported on use: scipy.optimize costs 0.6 s of start-up

    nb, first = _checked_orders(frf, order, n_b, feedthrough, smooth)
    nbp = nb + 1 - first
    w = _weights(np.asarray(frf.std, float), int(smooth))
    G = frf.G
    Zb, Za = _basis(frf, nb, order, first)

    def resid(p):
        return _ri(w * (G - (Zb @ p[:nbp]) / (1.0 + Za @ p[nbp:])))

    def jac(p):                  # d/db_i = -w z^-i / A, d/da_i = w B z^-i / A^2
        A, B = 1.0 + Za @ p[nbp:], Zb @ p[:nbp]
        J = np.hstack([-Zb * (w / A)[:, None], Za * (w * B / A ** 2)[:, None]])
        return np.vstack([J.real, J.imag])

    a_sk, it = _sk_denominator(G, w, Zb, Za, iterations, tol)
    starts = [a_sk] + _subspace_starts(frf, G, w, order)
    # the guard (runtime/_best.py): each start's LM result is never worse than the start, and the
    # lowest cost over the starts is returned (the first start when none is finite)
    overall, kept = None, None
    for k, a0 in enumerate(starts):
        theta = np.concatenate([_numerator(G, w, Zb, 1.0 + Za @ a0), a0])
        sol = least_squares(resid, theta, jac=jac, method="lm", xtol=1e-12, ftol=1e-12, gtol=1e-12)
        theta, _, _ = BestIterate(theta, np.sum(resid(theta) ** 2), rtol=0.0).choose(sol.x, np.sum(sol.fun ** 2))
        theta, poles, unstable = _stabilised(theta, nbp, G, w, Zb, Za)
        cost = float(np.sum(resid(theta) ** 2))
        if overall is None:
            overall, kept = BestIterate(theta, cost, label="start 0"), (poles, unstable)
        elif overall.offer(theta, cost, label=f"start {k}"):
            kept = (poles, unstable)
    cost, theta, (poles, stabilised) = overall.f, overall.x, kept
    if stabilised:
        logger.info("fit_frf: unstable poles of the best fit reflected into the unit circle")
    a = np.concatenate([[1.0], theta[nbp:]])
    b = np.concatenate([np.zeros(first), theta[:nbp]])
    bt = np.trim_zeros(b, "f")
    zeros = np.roots(bt) if bt.size > 1 else np.zeros(0, complex)
    return FRFFit(b, a, poles.astype(complex), zeros.astype(complex), cost, int(2 * G.size - nbp - order), it,
                  stabilised, frf.dt)


def _checked_orders(frf, order, n_b, feedthrough: bool, smooth) -> tuple[int, int]:
    """The arguments of `fit_frf` checked: B's degree and its first power of z^-1 (0 or 1)."""
    require(isinstance(frf, FRF), f"frf: expected an FRF (estimate_frf), got {type(frf).__name__}")
    require(is_integer(order) and order >= 1, f"order: expected an int >= 1, got {order!r}")
    nb, first = (int(order) if n_b is None else n_b), (0 if feedthrough else 1)
    require(is_integer(nb) and nb >= first, f"n_b: expected an int >= {first}, got {n_b!r}")
    require(is_integer(smooth) and smooth >= 0, f"smooth: expected an int >= 0, got {smooth!r}")
    n_par = nb + 1 - first + order
    if 2 * frf.G.size < n_par:
        raise ShapeError(f"the FRF has {frf.G.size} bins (2 x {frf.G.size} real equations) for {n_par} coefficients: "
                         "lower the order or excite more bins")
    return nb, first


def _subspace_starts(frf, G, w, order: int) -> list:
    """Denominators a[1:] of the subspace estimates with 2, 3 and 4 x order block rows (fewer than the bins),
    unstable poles reflected; non-finite ones left out."""
    out = []
    for q in range(2 * order, 4 * order + 1, order):
        if q < frf.G.size:
            with np.errstate(all="ignore"):
                p = _subspace_poles(frf.freqs, G, w, frf.dt, order, q)
            if np.all(np.isfinite(p)):
                out.append(np.real(np.poly(np.where(np.abs(p) >= 1, 1 / np.conj(p), p)))[1:])
    return out


def _stabilised(theta, nbp: int, G, w, Zb, Za):
    """``(theta, poles, reflected)``: unstable poles of A reflected into the unit circle (1 / conj(p)), B refitted."""
    poles = np.roots(np.concatenate([[1.0], theta[nbp:]]))
    if not np.any(np.abs(poles) >= 1.0):
        return theta, poles, False
    poles = np.where(np.abs(poles) >= 1.0, 1.0 / np.conj(poles), poles)
    a = np.real(np.poly(poles))[1:]
    return np.concatenate([_numerator(G, w, Zb, 1.0 + Za @ a), a]), poles, True


def frf_bla(bla, data: Trajectories, period, order: int, feedthrough: bool) -> FRFFit | None:
    """The FRF's BLA of `bla_initialise` from ``bla`` = ``"frf"`` or None (the FRF of ``data`` with ``period``;
    None when ``"auto"`` finds none), an `FRF` (fitted) or an `FRFFit` (used)."""
    if isinstance(bla, FRFFit):
        return bla
    if isinstance(bla, FRF):
        frf = bla
    else:
        require(period is not None, "bla='frf' needs the input's period: give period= (samples per period, or 'auto')")
        if isinstance(period, str) and period == "auto":
            period = detect_period(data)
            if period is None:
                if bla == "frf":
                    raise DataError("bla='frf', period='auto': the input is not periodic (no period found)")
                logger.info("bla_initialise: period='auto' found no period; the BLA is N4SID's only")
                return None
            logger.info("bla_initialise: period='auto' found a period of %d samples", period)
        frf = estimate_frf(data, period)
    return fit_frf(frf, order, feedthrough=feedthrough)
