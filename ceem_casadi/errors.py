"""Typed exceptions of ceem_casadi.

Every exception subclasses a builtin so that callers who do not know the
library can still catch it as ``ValueError`` / ``KeyError`` / ``RuntimeError``.
Messages say what was expected, what was given, and (where possible) how to fix it.
"""
from __future__ import annotations


class CeemError(Exception):
    """Base class of every error raised on purpose by ceem_casadi."""


class ShapeError(CeemError, ValueError):
    """An array has the wrong shape (expected vs given shapes in the message)."""


class NonFiniteError(CeemError, ValueError):
    """An input contains NaN or inf where only finite values are allowed."""


class DataError(CeemError, ValueError):
    """Data that cannot be fitted (every output of a trajectory or an output column missing, NaN
    inputs, wrong lengths or dimensions); the message names the trajectory or column and the fix."""


class ParameterError(CeemError, KeyError):
    """Unknown or missing parameter names, or values outside their bounds."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class OptionsError(CeemError, ValueError):
    """An option value is invalid (wrong type, out of range, unknown name); the message names the
    option, what was expected and what was given."""


class ModelError(CeemError, ValueError):
    """A user model function returns the wrong shape or non-finite values."""


class SolverError(CeemError, RuntimeError):
    """A numerical solver failed and the caller asked for an exception.

    ``result`` holds the outcome up to the failure (e.g. the :class:`~ceem_casadi.CEEMResult`
    with the last good iterate), or None.
    """

    def __init__(self, message: str = "", result=None):
        super().__init__(message)
        self.result = result
