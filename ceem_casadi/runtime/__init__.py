"""The runtime under every step: the solve layer (IPOPT calls, deadlines, status), the option
schema, native compilation with its on-disk cache, worker processes and BLAS threads."""
from ._status import Status

__all__ = ["Status"]
