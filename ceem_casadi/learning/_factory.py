"""The one factory of learning steps: the [`LearningStep`][ceem_casadi.learning.LearningStep] of a fit."""
from __future__ import annotations

from ..model._nn import AdamOptions
from ..runtime import _policy as policy
from ._adam import AdamLearner
from ._learner import Learner
from ._pieces import PieceLearner
from ._protocol import LearningStep

__all__ = ["learner_for"]


def learner_for(model, lengths, options, stages=None) -> LearningStep:
    """The default learning step of a fit: an [`AdamLearner`][ceem_casadi.learning.AdamLearner] for
    `AdamOptions`; for [`LearnerOptions`][ceem_casadi.LearnerOptions] a `PieceLearner` when a trajectory
    has `policy.PIECE_FROM` samples or more, else a [`Learner`][ceem_casadi.learning.Learner].

    Parameters
    ----------
    model : StateSpaceModel
    lengths : sequence of int
        Trajectory lengths T_b.
    options : LearnerOptions or AdamOptions
    stages : StageFunctions, optional
        Shared with the smoother.

    Returns
    -------
    LearningStep

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x, lambda x, u, p: x, nx=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5)))
    >>> from ceem_casadi.learning import learner_for
    >>> type(learner_for(model, (50,), cc.LearnerOptions())).__name__
    'Learner'
    >>> type(learner_for(model, (50,), cc.learning.AdamOptions())).__name__
    'AdamLearner'
    """
    if isinstance(options, AdamOptions):
        return AdamLearner(model, options)
    if max(lengths) >= policy.PIECE_FROM:
        return PieceLearner(model, options, stages, columns=sum(lengths))
    return Learner(model, lengths, options, stages)
