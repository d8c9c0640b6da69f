"""The one validation of data against a model, shared by every public entry point and the CLI's data
reader (the same data give the same message whichever way they come in)."""
from __future__ import annotations

import numpy as np

from ..errors import CeemError, DataError
from ..runtime._checks import check_argument_order
from ._data import Trajectories, check_outputs

__all__ = ["check_candidate", "check_data", "check_excitation", "check_outputs"]


def check_data(model, data, *, what: str = "data") -> Trajectories:
    """``data`` unless it is not a `Trajectories` (TypeError), not of the model's ny and nu (`ShapeError`), or has
    a trajectory or an output column observed nowhere (`DataError`)."""
    check_argument_order(data=data)  # a theta dict where the data go: name the order (model, data, theta)
    if not isinstance(data, Trajectories):
        raise TypeError(f"{what} must be a Trajectories (cc.Trajectories(y, u)), got {type(data).__name__}")
    data.check_model(model)
    return data


def check_candidate(name: str, model, data, theta) -> dict:
    """``theta`` of a user's candidate structure ``name`` (None: the model's initial values) validated, and ``data``
    checked against its model, before any fit; an error names the candidate."""
    try:
        check_data(model, data)
        return model.params.initial() if theta is None else model.params.validate(theta)
    except CeemError as exc:
        raise type(exc)(f"candidate {name!r}: {exc}") from None


def check_excitation(data, *, what: str = "data") -> Trajectories:
    """``data`` unless an input of some trajectory is constant (`DataError`: nothing excites the system, so no
    BLA, FRF or block-oriented initialisation can be estimated)."""
    for b in range(len(data)):
        u = data.inputs(b)
        flat = np.flatnonzero(np.ptp(u, axis=0) == 0) if len(u) else np.arange(u.shape[1])
        if flat.size:
            raise DataError(f"{what}: input {flat[0]} of trajectory {b} is constant ({u[0, flat[0]]:g}): nothing "
                            f"excites the system; give data recorded with a varying input")
    return data
