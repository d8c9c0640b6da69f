"""ceem_casadi: certainty-equivalent EM for partially observed nonlinear systems on CasADi.

Public API::

    Param, Parameters                 named parameters (structure)
    StateSpaceModel                   gray-box model (from_ode / from_discrete)
    Trajectories, simulate            data
    ceem, CEEMOptions, CEEMResult     the EM loop
    Smoother, Learner                 the two steps, reusable
"""
from .ceem import CEEMResult, IterationRecord, ceem
from .data import Trajectories, simulate
from .errors import CeemError, ModelError, NonFiniteError, ParameterError, ShapeError, SolverError
from .learner import Learner, LearnResult
from .model import Noise, StateSpaceModel
from .objective import joint_log_density
from .options import CEEMOptions, LearnerOptions, SmootherOptions
from .params import Param, Parameters
from .smoother import Smoother, SmoothResult

__version__ = "0.1.0"

__all__ = [
    "CEEMOptions", "CEEMResult", "CeemError", "IterationRecord", "LearnResult", "Learner",
    "LearnerOptions", "ModelError", "Noise", "NonFiniteError", "Param", "ParameterError",
    "Parameters", "ShapeError", "SmoothResult", "Smoother", "SmootherOptions", "SolverError",
    "StateSpaceModel", "Trajectories", "ceem", "joint_log_density", "simulate", "__version__",
]
