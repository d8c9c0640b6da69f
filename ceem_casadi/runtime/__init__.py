"""The runtime under every step: the solve layer (IPOPT calls, deadlines, status), the option
schema, native compilation with its on-disk cache, worker processes and BLAS threads, and the
numpy (BLAS) evaluation of matrix-valued MX Functions."""
from ._numpy_eval import NumpyFunction
from ._status import Status

__all__ = ["NumpyFunction", "Status"]
