"""The runtime under every step: the solve layer, the option schema, native compilation, worker processes,
numpy evaluation of MX Functions and the one cache of objects compiled from a model (docs/runtime.md)."""
from ._compile import compile_cache_usage
from ._model_cache import clear_model_cache
from ._numpy_eval import NumpyFunction
from ._status import Status

__all__ = ["NumpyFunction", "Status", "clear_model_cache", "compile_cache_usage"]
