"""The one validation of data against a model, shared by every public entry point and the CLI.

[`check_data`][ceem_casadi.io._validate.check_data] is called by `ceem`, `ceem_checkpointed`,
`refine_output_error`, `estimate_initial_state`, `calibrate_noise`, `parameter_uncertainty` and
`validation_report`, and by the data-file reader of the command line, so that the same data
give the same message whichever way they come in (issue 23, item 5).
"""
from __future__ import annotations

import numpy as np

from ..errors import DataError, ShapeError
from ._data import Trajectories

__all__ = ["check_data", "check_outputs"]


def check_outputs(ys, names=None, error: type[Exception] = DataError) -> None:
    """Raise ``error`` when a trajectory has no observed output at all, or when an output column is
    missing (NaN) in every row of every trajectory.

    Parameters
    ----------
    ys : list of numpy.ndarray
        Outputs (T_b, ny) per trajectory, NaN = missing.
    names : list of str, optional
        Output names for the message (default ``y[:, j]``).
    error : type
        The exception raised ([`DataError`][ceem_casadi.errors.DataError]; the file reader passes
        its own subclass).

    Examples
    --------
    >>> import numpy as np
    >>> check_outputs([np.array([[1.0, np.nan], [2.0, np.nan]])])
    Traceback (most recent call last):
    ...
    ceem_casadi.errors.DataError: all outputs missing: output(s) ['y[:, 1]'] are NaN in every row of every trajectory; check the data or choose the observed outputs (--outputs)
    """
    for b, y in enumerate(ys):
        if np.all(np.isnan(y)):
            raise error(f"trajectory {b}: every output is missing (NaN); nothing to fit there: drop the "
                        "trajectory or give its observed outputs")
    ny = ys[0].shape[1] if ys else 0
    empty = [j for j in range(ny) if all(np.all(np.isnan(y[:, j])) for y in ys)]
    if empty:
        cols = [names[j] for j in empty] if names else [f"y[:, {j}]" for j in empty]
        raise error(f"all outputs missing: output(s) {cols} are NaN in every row of every trajectory; check "
                    f"the data or choose the observed outputs (--outputs)")


def check_data(model, data, *, what: str = "data") -> Trajectories:
    """Raise a clear error unless ``data`` can be fitted with ``model``; return it.

    Checks: ``data`` is a [`Trajectories`][ceem_casadi.Trajectories] (its constructor already
    refused inf outputs, NaN inputs, mismatched lengths and fewer than 2 samples), its output
    and input dimensions match the model (`ShapeError`), and every trajectory and every output
    column has at least one observed value ([`DataError`][ceem_casadi.errors.DataError]).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.5 * x, lambda x, u, p: x, nx=1,
    ...                                          params=cc.Parameters())
    >>> check_data(model, cc.Trajectories([np.full((5, 1), np.nan)]))
    Traceback (most recent call last):
    ...
    ceem_casadi.errors.DataError: trajectory 0: every output is missing (NaN); nothing to fit there: drop the trajectory or give its observed outputs
    """
    if not isinstance(data, Trajectories):
        raise TypeError(f"{what} must be a Trajectories (cc.Trajectories(y, u)), got {type(data).__name__}")
    if data.ny != model.ny:
        raise ShapeError(f"data has ny={data.ny} output columns, the model observes ny={model.ny}")
    if data.nu != model.nu:
        raise ShapeError(f"data has nu={data.nu} input columns, the model expects nu={model.nu}")
    check_outputs(data.y)
    return data
