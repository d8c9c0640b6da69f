"""What every learning step provides: the `LearningStep` protocol (``solve``) and `CurvatureLearningStep`
(``hessian_matrix``); a user's class needs no base class, a ``solve`` of this signature is enough."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from ..io._data import Trajectories
    from ._learner import LearnResult

__all__ = ["CurvatureLearningStep", "LearningStep"]


@runtime_checkable
class LearningStep(Protocol):
    """A learning step: the free parameters that maximise J for fixed states; anything with this
    ``solve`` can be passed as ``ceem(..., learner=...)``.

    Attributes
    ----------
    solve : callable
        ``solve(theta_vec, data, xs, rho_theta=None, weights=None) -> LearnResult``: one learning
        step from ``theta_vec`` (np,) for the states ``xs`` (B arrays (T_b, nx)) of ``data``.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> from ceem_casadi.learning import LearningStep
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x, lambda x, u, p: x, nx=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5)))
    >>> isinstance(cc.learning.Learner(model, (20,)), LearningStep)
    True
    """

    def solve(self, theta_vec: np.ndarray, data: Trajectories, xs: list[np.ndarray],
              rho_theta: float | None = None, weights=None) -> LearnResult:
        """One learning step (see the class's ``solve`` attribute); ``rho_theta`` overrides the
        trust-region weight, ``weights`` (B,) weights the trajectories (particle EM)."""
        ...


@runtime_checkable
class CurvatureLearningStep(LearningStep, Protocol):
    """A [`LearningStep`][ceem_casadi.learning.LearningStep] that also gives the Hessian of its
    objective (data terms and prior, no trust region) at fixed states.

    Attributes
    ----------
    hessian_matrix : callable
        ``hessian_matrix(theta_vec, data, xs) -> (n_free, n_free) array or None``.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> from ceem_casadi.learning import CurvatureLearningStep
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x, lambda x, u, p: x, nx=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5)))
    >>> isinstance(cc.learning.Learner(model, (20,)), CurvatureLearningStep)
    True
    """

    def hessian_matrix(self, theta_vec: np.ndarray, data: Trajectories, xs: list[np.ndarray]) -> np.ndarray | None:
        """(n_free, n_free) Hessian at ``theta_vec``, or None where it cannot be formed."""
        ...
