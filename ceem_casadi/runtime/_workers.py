"""Worker processes that end with their parent.

A pool worker blocked on its task queue does not notice that its parent was killed (it holds its
own copy of the pipe, so it never reads end-of-file): after ``kill -9`` of a fit, the workers
would live on with parent pid 1. `die_with_parent`, called first in each worker, asks the
Linux kernel to send SIGKILL when the parent dies (``prctl(PR_SET_PDEATHSIG)``) and, on every
platform, starts a daemon thread that exits the worker once ``os.getppid()`` changes.

The kernel's parent-death signal fires when the *thread* that forked the worker ends: the pool
must be created and closed by the same thread (``ceem`` does both inside one call).
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1
POLL_S = 0.5


def _exit_if_orphaned(parent_pid: int) -> None:
    if os.getppid() != parent_pid:
        os._exit(1)


def _watch(parent_pid: int, poll_s: float) -> None:
    event = threading.Event()
    while not event.wait(poll_s):
        _exit_if_orphaned(parent_pid)


def die_with_parent(parent_pid: int, poll_s: float = POLL_S) -> None:
    """End this process when the process ``parent_pid`` (its parent) ends, however it ends."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the watchdog below still works
            pass
    _exit_if_orphaned(parent_pid)  # the parent may have died before prctl took effect
    threading.Thread(target=_watch, args=(parent_pid, poll_s), name="ceem-parent-watchdog", daemon=True).start()
