"""Typed exceptions of ceem_casadi, each also a builtin (``ValueError`` / ``KeyError`` / ``RuntimeError``);
messages say what was expected, what was given, and (where possible) how to fix it."""
from __future__ import annotations


class CeemError(Exception):
    """Base class of every error raised on purpose by ceem_casadi (each also a builtin).

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> try:
    ...     cc.Param("not a name")
    ... except cc.CeemError as err:
    ...     print(type(err).__name__, isinstance(err, KeyError))
    ParameterError True
    """


class ShapeError(CeemError, ValueError):
    """An array has the wrong shape (expected vs given shapes in the message).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> try:
    ...     cc.Trajectories(np.zeros((5, 1)), u=np.zeros((4, 1)))
    ... except cc.ShapeError as err:
    ...     print(type(err).__name__, isinstance(err, ValueError))
    ShapeError True
    """


class NonFiniteError(CeemError, ValueError):
    """An input contains NaN or inf where only finite values are allowed.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> try:
    ...     cc.Trajectories(np.zeros((3, 1)), u=np.array([[0.0], [np.inf], [1.0]]))
    ... except cc.NonFiniteError as err:
    ...     print(type(err).__name__, isinstance(err, ValueError))
    NonFiniteError True
    """


class DataError(CeemError, ValueError):
    """Data that cannot be fitted (every output of a trajectory or an output column missing, NaN
    inputs, wrong lengths or dimensions); the message names the trajectory or column and the fix."""


class ParameterError(CeemError, KeyError, ValueError):
    """Unknown or missing parameter names (e.g. a theta with a name the model does not have), or values outside
    their bounds; also a ``ValueError``, as every input error of the library.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> try:
    ...     cc.Parameters(cc.Param("a", 0.5)).validate({"b": 0.8})
    ... except cc.ParameterError as err:
    ...     print(type(err).__name__, isinstance(err, KeyError))
    ParameterError True
    """

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class OptionsError(CeemError, ValueError):
    """An option value is invalid (wrong type, out of range, unknown name): the message names the option.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> try:
    ...     cc.CEEMOptions(max_iters=-1)
    ... except cc.OptionsError as err:
    ...     print(type(err).__name__, isinstance(err, ValueError))
    OptionsError True
    """


class ModelError(CeemError, ValueError):
    """A user model function returns the wrong shape or non-finite values."""


class SolverError(CeemError, RuntimeError):
    """A numerical solver failed and the caller asked for an exception (``raise_on_failure=True``); ``result``
    holds the outcome up to the failure (e.g. the [`CEEMResult`][ceem_casadi.CEEMResult] of the last good iterate).

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> err = cc.SolverError("smoother failed at iteration 3", result=None)
    >>> isinstance(err, RuntimeError), isinstance(err, cc.CeemError), err.result is None
    (True, True, True)
    """

    def __init__(self, message: str = "", result=None):
        super().__init__(message)
        self.result = result
