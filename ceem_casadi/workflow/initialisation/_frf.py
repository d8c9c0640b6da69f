"""Nonparametric best linear approximation from periodic data (`estimate_frf`; Pintelon and Schoukens 2012, the
robust method) with its noise and total standard deviations (docs/block_oriented.md, "Periodic inputs")."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ...errors import DataError, ShapeError
from ...io._data import Trajectories
from ...runtime._checks import is_integer
from ...runtime._result import Result
from ...runtime._schema import require

logger = logging.getLogger(__name__)
__all__ = ["FRF", "estimate_frf"]


@dataclass(repr=False)
class FRF(Result):
    """A frequency response estimated from periodic data (`estimate_frf`).

    Attributes
    ----------
    freqs : numpy.ndarray
        (K,) frequencies of the excited bins, Hz (``bins / (period dt)``; dt = 1 when the data have none).
    bins : numpy.ndarray
        (K,) their DFT bin indices k (1 <= k < period / 2).
    G : numpy.ndarray
        (K,) complex frequency response, units of y per unit of u.
    std_noise : numpy.ndarray
        (K,) standard deviation of ``G`` due to the noise (over periods; NaN with one period).
    std_total : numpy.ndarray
        (K,) standard deviation of ``G`` over realisations (noise + nonlinear distortions; NaN with one).
    period, periods, realisations : int
        Samples per period N, periods used per realisation P (after the transient), realisations M.
    dt : float
        Sample time, s.

    Examples
    --------
    >>> import numpy as np, scipy.signal as ss, ceem_casadi as cc
    >>> from ceem_casadi.workflow import estimate_frf
    >>> k = np.arange(1, 32)
    >>> t = np.arange(128)
    >>> u = np.cos(2 * np.pi * np.outer(t, k) / 128 + np.random.default_rng(0).uniform(0, 6.3, 31)).sum(1)
    >>> u = np.tile(u, 3)[:, None]
    >>> y = ss.lfilter([0.0, 0.5], [1.0, -0.5], u, axis=0)
    >>> frf = estimate_frf(cc.Trajectories([y], [u]), period=128)
    >>> G = 0.5 * np.exp(-2j * np.pi * frf.freqs) / (1 - 0.5 * np.exp(-2j * np.pi * frf.freqs))
    >>> frf.bins.size, bool(np.allclose(frf.G, G))
    (31, True)
    """

    SUMMARY = ("period", "periods", "realisations", "bins")

    freqs: np.ndarray
    bins: np.ndarray
    G: np.ndarray
    std_noise: np.ndarray
    std_total: np.ndarray
    period: int
    periods: int
    realisations: int
    dt: float

    @property
    def std(self) -> np.ndarray:
        """(K,) the total standard deviation where there are several realisations, else the noise's."""
        return self.std_total if self.realisations > 1 else self.std_noise

    @property
    def distortion_std(self) -> np.ndarray:
        """(K,) standard deviation of ``G`` due to the stochastic nonlinear distortions,
        ``sqrt(max(std_total^2 - std_noise^2, 0))`` (NaN with one realisation or one period)."""
        return np.sqrt(np.maximum(self.std_total ** 2 - self.std_noise ** 2, 0.0))


def _periods(x: np.ndarray, period: int, transient: int, b: int, what: str) -> np.ndarray:
    T = x.shape[0]
    if T % period:
        raise ShapeError(f"period={period} does not divide the length {T} of trajectory {b}: expected a whole "
                         f"number of periods (trim the record or give the right period)")
    n = T // period - transient
    if n < 1:
        raise ShapeError(f"trajectory {b} has {T // period} period(s) of {period} samples; expected more than "
                         f"transient_periods={transient} ({what})")
    return x[transient * period:].reshape(n, period)


def detect_period(data: Trajectories, input_tol: float = 1e-6) -> int | None:
    """The smallest N >= 4 dividing every trajectory's length at least twice with every input periodic
    (``max |u[t + N] - u[t]| <= input_tol`` times its RMS about its mean); None when there is none."""
    common: set | None = None
    for b in range(len(data)):
        u = data.inputs(b)[:, 0]
        T, rms = u.size, float(np.std(u))
        if rms == 0.0:
            return None
        ok = {N for N in range(4, T // 2 + 1)
              if T % N == 0 and float(np.max(np.abs(u[N:] - u[:-N]))) <= input_tol * rms}
        common = ok if common is None else common & ok
        if not common:
            return None
    return min(common)


def estimate_frf(data: Trajectories, period: int, *, transient_periods: int = 1, input_tol: float = 1e-6,
                 excitation_tol: float = 1e-6) -> FRF:
    """Frequency response of the best linear approximation from periodic data (docs/block_oriented.md).

    Parameters
    ----------
    data : Trajectories
        SISO, no missing outputs; every trajectory one realisation, its length a multiple of ``period``.
    period : int or "auto"
        Samples per period, N (>= 4); ``"auto"``: detected (`detect_period`).
    transient_periods : int
        Periods left out at the start of every trajectory.
    input_tol : float
        Largest deviation of one period's input from the mean period, relative to the input's RMS.
    excitation_tol : float
        A bin is excited when its input power exceeds this times the largest (in every realisation).

    Returns
    -------
    FRF

    Raises
    ------
    ShapeError
        Not SISO, or ``period`` does not divide a trajectory's length, or no period is left.
    DataError
        Missing outputs, an input or output that is not periodic, no excited bin.

    Examples
    --------
    A random input of period 64, repeated three times, given the wrong period is refused:

    >>> import numpy as np, ceem_casadi as cc
    >>> from ceem_casadi.workflow import estimate_frf
    >>> u = np.tile(np.random.default_rng(0).normal(size=64), 3)[:, None]
    >>> for period in (48, 50):
    ...     try:
    ...         estimate_frf(cc.Trajectories([u], [u]), period=period)
    ...     except ValueError as err:
    ...         print(type(err).__name__, str(err)[:36])
    DataError the input of trajectory 0 is not per
    ShapeError period=50 does not divide the length
    """
    N = _checked_period(data, period, transient_periods, input_tol, excitation_tol)
    kmax = (N - 1) // 2
    per = [_realisation(data, b, N, transient_periods, input_tol) for b in range(len(data))]
    Gm, var_n, powers, P = (list(v) for v in zip(*per))
    excited = np.all([p > excitation_tol * p.max() for p in powers], axis=0)
    if not np.any(excited):
        raise DataError(f"no bin 1..{kmax} is excited in every realisation (excitation_tol={excitation_tol:g})")
    Gm, var_n = np.array(Gm)[:, excited], np.array(var_n)[:, excited]
    M = Gm.shape[0]
    G = Gm.mean(axis=0)
    std_noise = np.sqrt(var_n.sum(axis=0)) / M
    std_total = np.sqrt(np.sum(np.abs(Gm - G) ** 2, axis=0) / (M * (M - 1))) if M > 1 else np.full(G.shape, np.nan)
    dt = 1.0 if data.dt is None else float(data.dt)
    bins = np.arange(1, kmax + 1)[excited]
    return FRF(bins / (N * dt), bins, G, std_noise, std_total, N, int(min(P)), M, dt)


def _checked_period(data, period, transient_periods, input_tol, excitation_tol) -> int:
    """The arguments of `estimate_frf` checked; the period N (detected with ``"auto"``)."""
    if not isinstance(data, Trajectories) or data.nu != 1 or data.ny != 1:
        raise ShapeError("data: expected a Trajectories with one input and one output (nu = ny = 1)")
    if isinstance(period, str) and period == "auto":
        found = detect_period(data, input_tol if isinstance(input_tol, (int, float)) else 1e-6)
        if found is None:
            raise DataError("period='auto': no period N >= 4 dividing every trajectory's length twice makes every "
                            f"input periodic within input_tol={input_tol!r} of its RMS: the input is not periodic")
        period = found
    require(is_integer(period) and period >= 4, f"period: expected an int >= 4 (samples per period), got {period!r}")
    require(is_integer(transient_periods) and transient_periods >= 0,
            f"transient_periods: expected an int >= 0, got {transient_periods!r}")
    for name, v in (("input_tol", input_tol), ("excitation_tol", excitation_tol)):
        require(isinstance(v, (int, float)) and np.isfinite(v) and v > 0,
                f"{name}: expected a finite number > 0, got {v!r}")
    return int(period)


def _realisation(data, b: int, N: int, transient: int, input_tol: float) -> tuple:
    """Trajectory ``b`` as one realisation: ``G_m``, its noise variance (NaN with one period), the input power
    per bin (each (kmax,)) and the periods P used; refused when not periodic."""
    kmax = (N - 1) // 2
    y, u = data.y[b][:, 0], data.inputs(b)[:, 0]
    if not np.all(np.isfinite(y)):
        raise DataError(f"trajectory {b} has missing outputs; the FRF needs complete periods")
    U, Y = _periods(u, N, transient, b, "input"), _periods(y, N, transient, b, "output")
    rms = float(np.sqrt(np.mean((U - U.mean()) ** 2)))
    if rms == 0.0:
        raise DataError(f"the input of trajectory {b} is constant: nothing excites the system")
    dev = float(np.max(np.abs(U - U.mean(axis=0)))) / rms
    if dev > input_tol:
        raise DataError(f"the input of trajectory {b} is not periodic with period={N}: its periods differ by "
                        f"{dev:.3g} of its RMS (input_tol={input_tol:g}); give the right period, or a periodic input")
    P = U.shape[0]
    if P > 1:
        noise, signal = float(np.mean(np.var(Y, axis=0, ddof=1))), float(np.var(Y.mean(axis=0)))
        if noise > signal:
            raise DataError(f"the output of trajectory {b} is not periodic with period={N}: its period-to-period "
                            f"variance {noise:.3g} exceeds the variance {signal:.3g} of its mean period (still in "
                            f"its transient? raise transient_periods; or the wrong period)")
    Uf = np.fft.rfft(U, axis=1)[:, 1:kmax + 1]
    Yf = np.fft.rfft(Y, axis=1)[:, 1:kmax + 1]
    Ub, Yb = Uf.mean(axis=0), Yf.mean(axis=0)
    with np.errstate(all="ignore"):
        var_n = (np.sum(np.abs(Yf - Yb) ** 2, axis=0) / (P * (P - 1)) / np.abs(Ub) ** 2 if P > 1
                 else np.full(kmax, np.nan))
        return Yb / Ub, var_n, np.abs(Ub) ** 2, P
