"""The EM loop (Algorithm 1 of the paper), its accelerations, results and checkpoints."""
from ._ceem import ceem
from ._checkpoint import CheckpointError, ceem_checkpointed
from ._options import CEEMOptions
from ._results import CEEMResult, IterationRecord

__all__ = ["CEEMOptions", "CEEMResult", "CheckpointError", "IterationRecord", "ceem", "ceem_checkpointed"]
