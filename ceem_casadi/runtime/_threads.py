"""Limit the threads of the BLAS library (OpenBLAS/MKL behind numpy and scipy) during a fit: one
thread degrades far less on shared cores (docs/runtime.md, "Worker processes")."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from threadpoolctl import threadpool_limits


def blas_threads(n: int | None) -> AbstractContextManager:
    """Context limiting BLAS to ``n`` threads (restored on exit); ``None`` leaves them as they are."""
    if n is None:
        return nullcontext()
    return threadpool_limits(limits=int(n), user_api="blas")
