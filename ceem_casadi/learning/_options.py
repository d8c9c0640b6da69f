"""Options of the learning step (M-step)."""
from __future__ import annotations

from dataclasses import dataclass

from ..runtime._checks import is_integer
from ..runtime._schema import HESSIANS, check_fields, renamed, require


@renamed(max_iter="max_iters")
@dataclass(frozen=True)
class LearnerOptions:
    """Learning step (M-step): IPOPT over the free parameters for fixed states.

    Parameters
    ----------
    rho_theta : float
        Trust-region weight of ``rho_theta * ||theta - theta_prev||^2``, >= 0.
    hessian : str
        ``"exact"``, ``"gauss-newton"`` (J^T J by BLAS), ``"limited-memory"`` (L-BFGS in IPOPT) or
        ``"auto"`` (default): exact when the per-stage exact Hessian program is short, else
        Gauss-Newton (docs/choosing.md).
    max_iters : int
        IPOPT iteration limit (``max_iter``: its deprecated name).
    tol : float
        IPOPT (scaled) tolerance.
    use_prior : bool
        Include the parameters' Gaussian priors ``log p(theta)``.
    compile : bool, optional
        As in [`SmootherOptions`][ceem_casadi.SmootherOptions].

    Raises
    ------
    OptionsError
        A value out of range (also a ``ValueError``).

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> opts = cc.LearnerOptions(hessian="gauss-newton", max_iters=50)
    >>> opts.hessian, opts.max_iters, opts.use_prior
    ('gauss-newton', 50, True)
    >>> try:
    ...     cc.LearnerOptions(hessian="newton")
    ... except cc.OptionsError as err:
    ...     print(type(err).__name__)
    OptionsError
    """

    rho_theta: float = 0.0
    hessian: str = "auto"
    max_iters: int = 200
    tol: float = 1e-9
    use_prior: bool = True
    compile: bool | None = None

    def __post_init__(self):
        check_fields(self)
        require(self.rho_theta >= 0, f"rho_theta must be >= 0, got {self.rho_theta}")
        allowed = (*HESSIANS, "limited-memory", "auto")
        require(self.hessian in allowed, f"hessian must be one of {allowed}, got {self.hessian!r}")
        require(is_integer(self.max_iters) and self.max_iters > 0 and self.tol > 0,
                f"max_iters and tol must be positive (max_iters an integer), got {self.max_iters!r} and {self.tol!r}")
