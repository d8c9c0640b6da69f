"""Options and result of the parameter uncertainty ([`parameter_uncertainty`][ceem_casadi.parameter_uncertainty])."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...runtime._result import Result
from ...runtime._schema import HESSIANS, check_fields, require

__all__ = ["ParameterUncertainty", "UncertaintyOptions"]


@dataclass(frozen=True)
class UncertaintyOptions:
    """Options of [`parameter_uncertainty`][ceem_casadi.parameter_uncertainty].

    Parameters
    ----------
    hessian : str
        ``"exact"`` (the observed information) or ``"gauss-newton"`` (J^T J).
    level : float
        Confidence level of the intervals.
    identifiability_tol : float
        Relative eigenvalue below which a direction is non-identifiable (docs/uncertainty.md).
    use_prior : bool
        Include the parameters' Gaussian priors.
    compile : bool, optional
        Compile the stage Functions (as in [`SmootherOptions`][ceem_casadi.SmootherOptions]).

    Raises
    ------
    OptionsError
        A value out of range.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> opts = cc.UncertaintyOptions(hessian="gauss-newton", level=0.9)
    >>> opts.hessian, opts.level
    ('gauss-newton', 0.9)
    """

    hessian: str = "exact"
    level: float = 0.95
    identifiability_tol: float = 1e-10
    use_prior: bool = True
    compile: bool | None = None

    def __post_init__(self):
        check_fields(self)
        require(self.hessian in HESSIANS, f"hessian must be one of {HESSIANS}, got {self.hessian!r}")
        require(0 < self.level < 1, f"level must be in (0, 1), e.g. 0.95, got {self.level!r}")
        require(0 < self.identifiability_tol < 1,
                f"identifiability_tol must be in (0, 1), got {self.identifiability_tol!r}")


@dataclass(repr=False)
class ParameterUncertainty(Result):
    """Uncertainty of the free parameters (n of them) at a fit.

    Attributes
    ----------
    names : list of str
        (n,) entry names (``"sigma"``, ``"H[0,1]"``).
    index : numpy.ndarray
        (n,) positions in the flat parameter vector.
    estimate, std_error, lower, upper : numpy.ndarray
        (n,) values, standard errors (``inf`` if non-identifiable, ``nan`` at a bound) and the interval.
    information, covariance, correlation : numpy.ndarray
        (n, n) reduced Hessian I, its pseudo-inverse on the identifiable subspace and the correlations.
    at_bound : list of str
        Parameters at a bound (held fixed).
    identifiable : numpy.ndarray
        (n,) bool.
    directions : list of Direction
        The non-identifiable directions.
    relative_eigenvalues : numpy.ndarray
        (n_inactive,) ascending relative eigenvalues of the scaled information.
    hessian, level
        As in the options.
    warnings : list of str
        Messages also logged.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [1.0], 40, u=np.random.default_rng(0).normal(size=(40, 1)), seed=1)
    >>> unc = cc.parameter_uncertainty(model, data, {"a": 0.8}, options=cc.UncertaintyOptions(compile=False))
    >>> unc.names, unc.hessian, unc.level, unc.covariance.shape
    (['a'], 'exact', 0.95, (1, 1))
    """

    SUMMARY = ('names', 'std_error', 'level', 'hessian')

    names: list
    index: np.ndarray
    estimate: np.ndarray
    information: np.ndarray
    covariance: np.ndarray
    std_error: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    correlation: np.ndarray
    at_bound: list
    identifiable: np.ndarray
    directions: list
    relative_eigenvalues: np.ndarray
    hessian: str
    level: float
    warnings: list = field(default_factory=list)

    def std_errors(self, params) -> dict:
        """Standard errors as a theta-shaped dict (name -> array, ``nan`` for fixed entries) of the model's
        ``params``."""
        vec = np.full(params.size, np.nan)
        vec[self.index] = self.std_error
        return params.from_vector(vec)

    def table(self) -> str:
        """One line per parameter: ``name  estimate ± std_error  [lower, upper]``."""
        w = max((len(n) for n in self.names), default=4)
        rows = []
        for i, n in enumerate(self.names):
            flag = "  (at bound)" if n in self.at_bound else ("  (not identifiable)" if not self.identifiable[i] else "")
            rows.append(f"{n:<{w}}  {self.estimate[i]:.6g} ± {self.std_error[i]:.3g}  "
                        f"[{self.lower[i]:.6g}, {self.upper[i]:.6g}]{flag}")
        rows += [f"not identifiable: {d.combination} (relative eigenvalue {d.relative_eigenvalue:.1e})"
                 for d in self.directions]
        return "\n".join(rows)

    def to_dict(self) -> dict:
        """JSON-ready dict (inf/nan become strings "inf"/"nan" only through json's allow_nan)."""
        return {"names": list(self.names), "estimate": self.estimate.tolist(), "std_error": self.std_error.tolist(),
                "lower": self.lower.tolist(), "upper": self.upper.tolist(), "level": self.level,
                "covariance": self.covariance.tolist(), "correlation": self.correlation.tolist(),
                "at_bound": list(self.at_bound), "identifiable": self.identifiable.tolist(),
                "directions": [d.to_dict() for d in self.directions], "hessian": self.hessian,
                "warnings": list(self.warnings)}
