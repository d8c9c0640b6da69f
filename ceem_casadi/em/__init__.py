"""The EM loop (Algorithm 1 of the paper), its accelerations (strategy objects), results and checkpoints."""
from ._accelerations import Acceleration, Joint, Newton, Plain, Squarem, acceleration_of
from ._ceem import ceem
from ._checkpoint import CheckpointError, ceem_checkpointed
from ._options import CEEMOptions
from ._results import CEEMResult, IterationRecord

__all__ = ["Acceleration", "CEEMOptions", "CEEMResult", "CheckpointError", "IterationRecord", "Joint", "Newton",
           "Plain", "Squarem", "acceleration_of", "ceem", "ceem_checkpointed"]
