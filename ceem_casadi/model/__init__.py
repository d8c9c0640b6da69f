"""The model: ``StateSpaceModel`` and its ``Noise``, named parameters (``Param``, ``Parameters``), ``MLP``
terms, the noise-free free run (``simulate_output``, ``rollout``), the block-oriented families (``wiener``,
``hammerstein``, ``wiener_hammerstein``) and ``check_columnwise`` for maps written for sample columns.
"""
from ._block_oriented import hammerstein, wiener, wiener_hammerstein
from ._columns import check_columnwise
from ._model import Noise, StateSpaceModel
from ._nn import MLP
from ._params import Param, Parameters
from ._simulation import rollout, simulate_output

__all__ = ["MLP", "Noise", "Param", "Parameters", "StateSpaceModel", "check_columnwise", "hammerstein", "rollout",
           "simulate_output", "wiener", "wiener_hammerstein"]
