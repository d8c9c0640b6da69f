"""The one validation of data against a model, shared by every public entry point and the CLI's data
reader (the same data give the same message whichever way they come in)."""
from __future__ import annotations

import numpy as np

from ..runtime._checks import check_argument_order
from ._data import Trajectories, check_outputs

__all__ = ["check_data", "check_excitation", "check_outputs"]


def check_data(model, data, *, what: str = "data") -> Trajectories:
    """Raise a clear error unless ``data`` can be fitted with ``model``; return it.

    ``data`` must be a [`Trajectories`][ceem_casadi.Trajectories] (whose constructor refused inf outputs, NaN
    inputs and short trajectories) of the model's ny and nu (`ShapeError`) with every trajectory and output column
    observed somewhere ([`DataError`][ceem_casadi.errors.DataError]).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.5 * x, lambda x, u, p: x, nx=1,
    ...                                          params=cc.Parameters())
    >>> check_data(model, cc.Trajectories([np.full((5, 1), np.nan)]))
    Traceback (most recent call last):
    ...
    ceem_casadi.errors.DataError: trajectory 0: every output is missing (NaN); nothing to fit there: ...
    """
    check_argument_order(data=data)  # a theta dict where the data go: name the order (model, data, theta)
    if not isinstance(data, Trajectories):
        raise TypeError(f"{what} must be a Trajectories (cc.Trajectories(y, u)), got {type(data).__name__}")
    data.check_model(model)
    return data


def check_excitation(data, *, what: str = "data") -> Trajectories:
    """Raise [`DataError`][ceem_casadi.errors.DataError] when an input of some trajectory of
    ``data`` is constant (all zeros included): nothing excites the system, so no input-output
    model (a BLA, an FRF, a block-oriented initialisation) can be estimated from it.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> check_excitation(cc.Trajectories([np.ones((5, 1))], [np.zeros((5, 1))]))
    Traceback (most recent call last):
    ...
    ceem_casadi.errors.DataError: data: input 0 of trajectory 0 is constant (0): nothing excites the system; ...
    """
    from ..errors import DataError

    for b in range(len(data)):
        u = data.inputs(b)
        flat = np.flatnonzero(np.ptp(u, axis=0) == 0) if len(u) else np.arange(u.shape[1])
        if flat.size:
            j = int(flat[0])
            raise DataError(f"{what}: input {j} of trajectory {b} is constant ({u[0, j]:g}): nothing excites the "
                            f"system; give data recorded with a varying input")
    return data
