"""The learning step (M-step): the parameters that maximise J for fixed states, by IPOPT over all
stages, by Adam on mini-batches, piece by piece on long records, or map-reduced over shards."""
from ._adam import AdamLearner, AdamLearnerOptions, AdamOptions
from ._factory import learner_for
from ._learner import Learner, LearnResult
from ._options import LearnerOptions
from ._protocol import CurvatureLearningStep, LearningStep

__all__ = ["AdamLearner", "AdamLearnerOptions", "AdamOptions", "CurvatureLearningStep", "LearnResult", "Learner", "LearnerOptions",
           "LearningStep", "learner_for"]
