"""Limit the threads of the BLAS library (OpenBLAS/MKL behind numpy and scipy) during a fit.

CE-EM's dense work is many medium-sized products and banded factorisations. With several
processes on few cores, multi-threaded BLAS spins and degrades badly: six coupled Lorenz,
B = 8, on a 2-core machine with three other jobs took 194 s with two BLAS threads and 7.5 s
with one (``scripts/bench_lorenz.py``). Parallelism across trajectories comes from
``CEEMOptions(n_jobs=...)`` instead.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from threadpoolctl import threadpool_limits


def blas_threads(n: int | None) -> AbstractContextManager:
    """Context limiting BLAS to ``n`` threads (restored on exit); ``None`` leaves them as they are."""
    if n is None:
        return nullcontext()
    return threadpool_limits(limits=int(n), user_api="blas")
