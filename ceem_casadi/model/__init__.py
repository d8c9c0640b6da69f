"""The model: structure (states, inputs, outputs, named parameters), integrators, neural-network
terms, noise-free simulation and the plain-array form of the model functions.

    StateSpaceModel, Noise      gray-box model x+ = f(x, u, t; theta) + w, y = g(x, u, t; theta) + v
    Param, Parameters           named parameters: shapes, bounds, free masks, priors
    MLP                         a small neural network as CasADi expressions
    simulate_output, rollout    noise-free free run
    wiener, hammerstein,        block-oriented model families (linear blocks in companion form, a
    wiener_hammerstein          static nonlinearity between them), conditioned for real records
    check_columnwise            a map written for sample columns agrees with the model's own
"""
from ._block_oriented import hammerstein, wiener, wiener_hammerstein
from ._columns import check_columnwise
from ._model import Noise, StateSpaceModel
from ._nn import MLP
from ._params import Param, Parameters
from ._simulation import rollout, simulate_output

__all__ = ["MLP", "Noise", "Param", "Parameters", "StateSpaceModel", "check_columnwise", "hammerstein", "rollout",
           "simulate_output", "wiener", "wiener_hammerstein"]
