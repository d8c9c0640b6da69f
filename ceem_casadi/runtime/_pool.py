"""The one process layer: every pool of worker processes of the library is a `WorkerPool`, whose workers end
with their parent however it ends (docs/runtime.md, "Worker processes")."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor

from ._supervise import die_with_parent

__all__ = ["WorkerPool"]


def _init_worker(parent_pid: int, initializer, initargs) -> None:
    die_with_parent(parent_pid)  # SIGKILL / SIGTERM of the parent: no orphaned worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (it kills the workers)
    if initializer is not None:
        initializer(*initargs)


class WorkerPool:
    """``n_jobs`` forked worker processes that never outlive the call that uses them; ``initializer(*initargs)``
    runs once in each (after the parent-death guard). Create and close it in one thread; as a context manager it
    is closed when the block ends and terminated when an exception leaves it (docs/runtime.md)."""

    def __init__(self, n_jobs: int, initializer: Callable | None = None, initargs: tuple = ()):
        ctx = multiprocessing.get_context("fork")
        self.executor = ProcessPoolExecutor(int(n_jobs), mp_context=ctx, initializer=_init_worker,
                                            initargs=(os.getpid(), initializer, tuple(initargs)))

    def map(self, fn: Callable, items: Iterable) -> list:
        """``[fn(x) for x in items]`` computed by the workers, in order; on any exception or
        interruption while waiting, the workers are killed before it propagates."""
        try:
            return list(self.executor.map(fn, items))
        except BaseException:
            self.terminate()
            raise

    def _processes(self) -> list:
        return list((getattr(self.executor, "_processes", None) or {}).values())  # the stdlib keeps them there

    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [p.pid for p in self._processes() if p.pid is not None and p.is_alive()]

    def terminate(self) -> None:
        """Kill every worker now (SIGKILL) and drop pending tasks; returns without waiting for tasks."""
        procs = self._processes()
        for p in procs:
            with contextlib.suppress(OSError, ValueError):
                p.kill()
        self.executor.shutdown(wait=False, cancel_futures=True)
        for p in procs:  # reap them (no zombies); SIGKILL ends them at once
            with contextlib.suppress(OSError, ValueError, AssertionError):
                p.join(1.0)

    def close(self) -> None:
        """Shut down after the submitted tasks (the normal end)."""
        self.executor.shutdown(wait=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.terminate()
