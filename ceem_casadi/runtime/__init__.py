"""The runtime under every step: the solve layer (IPOPT calls, deadlines, status), the option
schema, native compilation with its on-disk cache, worker processes and BLAS threads, and the
numpy (BLAS) evaluation of matrix-valued MX Functions, and the one cache of objects compiled from a
model (`clear_model_cache` empties it)."""
from ._model_cache import clear_model_cache
from ._numpy_eval import NumpyFunction
from ._status import Status

__all__ = ["NumpyFunction", "Status", "clear_model_cache"]
