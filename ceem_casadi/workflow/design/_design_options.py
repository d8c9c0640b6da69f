"""Options and result of [`design_input`][ceem_casadi.design_input] (the design itself:
`ceem_casadi.workflow.design._experiment_design`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...runtime._result import Result, format_table
from ...runtime._schema import check_fields, renamed, require
from ...runtime._status import Status

__all__ = ["DesignOptions", "InputDesign"]


@renamed(max_iter="max_iters")
@dataclass(frozen=True)
class DesignOptions:
    """Options of [`design_input`][ceem_casadi.design_input].

    Parameters
    ----------
    hold : int
        Samples each input value is held (1: a new value every sample).
    max_iters : int
        IPOPT iterations per start.
    tol : float
        IPOPT tolerance.
    regularisation : float
        ``I_s + regularisation * trace(I_s) / n * eye(n)`` enters the criterion (a singular start stays finite).

    Raises
    ------
    OptionsError
        A value out of range.

    Examples
    --------
    >>> from ceem_casadi.workflow import DesignOptions
    >>> DesignOptions(hold=5).hold
    5
    """

    hold: int = 1
    max_iters: int = 300
    tol: float = 1e-6
    regularisation: float = 1e-9

    def __post_init__(self):
        check_fields(self)  # the types: int hold and max_iters, finite float tol and regularisation
        require(self.hold >= 1, f"hold: expected an int >= 1 (samples per input value), got {self.hold!r}")
        require(self.max_iters >= 1, f"max_iters: expected an int >= 1, got {self.max_iters!r}")
        require(self.tol > 0, f"tol: expected a finite value > 0, got {self.tol!r}")
        require(self.regularisation >= 0, f"regularisation: expected a finite value >= 0, got {self.regularisation!r}")


@dataclass(repr=False)
class InputDesign(Result):
    """Outcome of [`design_input`][ceem_casadi.design_input].

    Attributes
    ----------
    u : numpy.ndarray
        (T, nu) the best input sequence found (units of the model's input).
    criterion : str
        ``"D"`` or ``"A"``.
    value : float
        The criterion at ``u`` on the relative-parameter information: ``log det I_s`` (D) or ``trace I_s^{-1}`` (A).
    information : numpy.ndarray
        (n, n) Fisher information ``I(u)`` of the free parameters (units 1 / theta^2).
    names : list of str
        (n,) the free parameters' entry names.
    status : Status
        The status of the best start.
    starts : list of dict
        Per start: ``start``, ``initial``, ``final``, ``status``, ``iterations``, ``seconds``.
    x0 : numpy.ndarray
        (nx,) the initial state of the designed record.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from ceem_casadi.workflow import design_input
    >>> m = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.5 * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("b", 1.0)), measurement_std=0.1)
    >>> d = design_input(m, {"b": 1.0}, 5, u_bounds=(-1, 1), starts=1)
    >>> d.names, d.information.shape, len(d.table().splitlines())       # header, rule, one start
    (['b'], (1, 1), 3)
    """

    SUMMARY = ("criterion", "value", "status", "u")
    u: np.ndarray
    criterion: str
    value: float
    information: np.ndarray
    names: list
    status: Status
    starts: list = field(default_factory=list)
    x0: np.ndarray | None = None

    @property
    def std_errors(self) -> np.ndarray:
        """(n,) Cramér-Rao standard errors ``sqrt(diag(I^{-1}))`` of the free parameters (units of theta);
        ``inf`` where the information is singular."""
        try:
            var = np.diag(np.linalg.inv(self.information))
        except np.linalg.LinAlgError:
            return np.full(self.information.shape[0], np.inf)
        return np.where(var > 0, np.sqrt(np.abs(var)), np.inf)

    def table(self) -> str:
        """One line per start: initial and final criterion, status, iterations, seconds."""
        keys = ("start", "initial", "final", "status", "iterations", "seconds")
        return format_table([*keys[:1], f"initial {self.criterion}", f"final {self.criterion}", *keys[3:]],
                            [[s[k] for k in keys] for s in self.starts])

    def to_dict(self) -> dict:
        """JSON-ready dict of the fields and ``std_errors``."""
        return {**super().to_dict(), "std_errors": self.std_errors.tolist()}
