"""Error measures between recorded and predicted outputs (RMSE, NRMSE, fit %), NaN-aware: the
measures of the validation report and of the real benchmarks' protocols."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError


def _pair(y, yhat) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """``y``, ``yhat`` as (N, ny), the mask of entries valid in both, and whether the input was 1-D."""
    y, yhat = np.asarray(y, float), np.asarray(yhat, float)
    if y.shape != yhat.shape:
        raise ShapeError(f"y and yhat must have the same shape, got {y.shape} and {yhat.shape}")
    if y.ndim == 0:
        raise ShapeError("y: expected an array (T,), (T, ny) or (B, T, ny), got a scalar")
    vector = y.ndim == 1
    ny = 1 if vector else y.shape[-1]
    y, yhat = y.reshape(-1, ny), yhat.reshape(-1, ny)
    ok = ~(np.isnan(y) | np.isnan(yhat))
    return y, yhat, ok, vector


def _measure(y, yhat, formula):
    """``formula(sse, sst, n)`` per output where it has a valid entry (else NaN): a float for 1-D input, else (ny,)."""
    sse, sst, n, vector = error_stats(y, yhat)
    with np.errstate(invalid="ignore", divide="ignore"):
        val = np.where(n > 0, formula(sse, sst, np.maximum(n, 1)), np.nan)
    return float(val[0]) if vector else val


def error_stats(y, yhat):
    """Per output: sum of squared errors, sum of squared deviations from the mean, count."""
    y, yhat, ok, vector = _pair(y, yhat)
    n = ok.sum(axis=0)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(ok, y - yhat, 0.0)
        sse = np.sum(err * err, axis=0)
        mean = np.where(n > 0, np.sum(np.where(ok, y, 0.0), axis=0) / np.maximum(n, 1), np.nan)
        dev = np.where(ok, y - mean, 0.0)
        sst = np.sum(dev * dev, axis=0)
    return sse, sst, n, vector


def rmse(y, yhat):
    """Root-mean-square error per output (last axis), ignoring entries where ``y`` or ``yhat`` is NaN.

    Parameters
    ----------
    y, yhat : numpy.ndarray
        Observations and predictions, (T,), (T, ny) or (B, T, ny), same shape and units.

    Returns
    -------
    float or numpy.ndarray
        A float for 1-D input, else (ny,), in the units of ``y``; NaN for an output without a valid entry.

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.workflow import rmse
    >>> rmse(np.array([[1.0], [2.0], [np.nan]]), np.array([[1.0], [4.0], [0.0]]))   # the NaN entry is ignored
    array([1.41421356])
    """
    return _measure(y, yhat, lambda sse, sst, n: np.sqrt(sse / n))


def nrmse(y, yhat):
    """RMSE divided by the (population) standard deviation of ``y`` over the same valid entries.

    Parameters
    ----------
    y, yhat : numpy.ndarray
        As for [`rmse`][ceem_casadi.workflow.rmse].

    Returns
    -------
    float or numpy.ndarray
        As for [`rmse`][ceem_casadi.workflow.rmse], dimensionless; a constant output gives ``inf`` (NaN if also exact).

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.workflow import nrmse
    >>> nrmse(np.array([[1.0], [3.0]]), np.array([[2.0], [2.0]]))                  # RMSE 1, std 1
    array([1.])
    """
    return _measure(y, yhat, lambda sse, sst, n: np.sqrt(sse / sst))


def fit_percent(y, yhat):
    """Fit in percent, ``100 (1 - ||y - yhat|| / ||y - mean(y)||)`` per output (NaN entries ignored).

    Parameters
    ----------
    y, yhat : numpy.ndarray
        As for [`rmse`][ceem_casadi.workflow.rmse].

    Returns
    -------
    float or numpy.ndarray
        As for [`rmse`][ceem_casadi.workflow.rmse], in percent (100 = exact; negative = worse than the mean).

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.workflow import fit_percent
    >>> fit_percent(np.array([[1.0], [3.0]]), np.array([[1.5], [2.5]]))
    array([50.])
    """
    return _measure(y, yhat, lambda sse, sst, n: 100.0 * (1.0 - np.sqrt(sse / sst)))
