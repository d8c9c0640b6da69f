"""The model: structure (states, inputs, outputs, named parameters), integrators, neural-network
terms, noise-free simulation and the plain-array form of the model functions.

    StateSpaceModel, Noise      gray-box model x+ = f(x, u, t; theta) + w, y = g(x, u, t; theta) + v
    Param, Parameters           named parameters: shapes, bounds, free masks, priors
    MLP                         a small neural network as CasADi expressions
    simulate_output, rollout    noise-free free run
"""
from ._model import Noise, StateSpaceModel
from ._nn import MLP
from ._params import Param, Parameters
from ._simulation import rollout, simulate_output

__all__ = ["MLP", "Noise", "Param", "Parameters", "StateSpaceModel", "rollout", "simulate_output"]
