"""Options of the smoothing step (E-step)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..runtime._schema import BOUND, HESSIANS, SMOOTHER_SOLVERS, check_bounds, check_fields, renamed, require


@renamed(max_iter="max_iters")
@dataclass(frozen=True)
class SmootherOptions:
    """Smoothing step (E-step): IPOPT over x_{1:T} of each trajectory.

    Parameters
    ----------
    rho_x : float
        Trust-region weight of ``rho_x * ||x - x_prev||^2`` (paper: rho_x), >= 0.
    hessian : str
        ``"gauss-newton"`` (default; fastest in ``scripts/bench_lorenz.py``) or ``"exact"``.
    max_iters : int
        Iteration limit of the step's solver (IPOPT or the Newton steps); ``max_iter`` is its deprecated name.
    tol : float
        IPOPT (scaled) tolerance.
    x_lower, x_upper : float or sequence of float, optional
        Bounds on every hidden state (a scalar or nx values).
    compile : bool, optional
        Compile the stage Functions to native code (cached on disk); ``None``: when a C compiler exists
        and the stage programs are long enough to pay off.
    chunk : int, optional
        Evaluate cost, gradient and Hessian in chunks of this many steps (memory, same numbers); ``None``:
        the long-record policy, 0: never.
    solver : str, optional
        ``"ipopt"`` (IPOPT + MUMPS), ``"banded"`` (damped Newton steps on the block-tridiagonal Hessian with
        LAPACK's banded Cholesky; no state bounds), ``"batched"`` (those steps for all trajectories of a
        length at once) or ``None`` (default: the long-record policy, docs/choosing.md).

    Raises
    ------
    OptionsError
        A value out of range (also a ``ValueError``).

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> opts = cc.SmootherOptions(solver="banded", compile=False)
    >>> opts.solver, opts.hessian
    ('banded', 'gauss-newton')
    >>> try:
    ...     cc.SmootherOptions(max_iters=0)
    ... except cc.OptionsError as err:
    ...     print(type(err).__name__)
    OptionsError
    """

    rho_x: float = 0.0
    hessian: str = "gauss-newton"
    max_iters: int = 100
    tol: float = 1e-8
    x_lower: object = field(default=None, metadata=BOUND)
    x_upper: object = field(default=None, metadata=BOUND)
    compile: bool | None = None
    chunk: int | None = None
    solver: str | None = None

    def __post_init__(self):
        check_fields(self)  # types, incl. the bounds (a number or a list of numbers, no NaN)
        check_bounds(self.x_lower, self.x_upper)
        require(self.solver is None or self.solver in SMOOTHER_SOLVERS,
                f"solver must be None or one of {SMOOTHER_SOLVERS}, got {self.solver!r}")
        require(self.solver not in ("banded", "batched") or (self.x_lower is None and self.x_upper is None),
                f"solver={self.solver!r} solves the smoothing problem without state bounds, but x_lower / x_upper "
                f"were given ({self.x_lower!r}, {self.x_upper!r}): use solver='ipopt' (or None) with bounds, "
                "or drop the bounds")
        require(self.chunk is None or self.chunk >= 0, f"chunk must be None or an int >= 0, got {self.chunk!r}")
        require(self.rho_x >= 0, f"rho_x must be >= 0, got {self.rho_x}")
        require(self.hessian in HESSIANS, f"hessian must be one of {HESSIANS}, got {self.hessian!r}")
        require(self.max_iters > 0 and self.tol > 0,
                f"max_iters and tol must be positive, got {self.max_iters!r} and {self.tol!r}")

    def state_bounds(self, nx: int) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) state bounds as (nx,) arrays (infinite where none is given); raises
        `OptionsError` when ``x_lower`` / ``x_upper`` is a list of another length than ``nx``.

        Examples
        --------
        >>> SmootherOptions(x_lower=0.0).state_bounds(2)[0]
        array([0., 0.])
        """
        out = []
        for name, default in (("x_lower", -np.inf), ("x_upper", np.inf)):
            v = np.asarray(default if getattr(self, name) is None else getattr(self, name), float)
            require(v.size in (1, nx), f"{name}: expected a number or a list of nx = {nx} numbers (one per state), "
                                       f"got {v.size} numbers {v.tolist()}")
            out.append(np.broadcast_to(v.reshape(-1) if v.size == nx else v.reshape(()), (nx,)).copy())
        return out[0], out[1]
