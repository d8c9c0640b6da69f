"""Processes that end with their parent: `die_with_parent` for pool workers and, run as a script
(stdlib only), the supervisor of one compiler command; docs/runtime.md explains both::

    python -S _supervise.py PARENT_PID CLEANUP_DIR -- cc -O1 ... -o lib.so
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading

PR_SET_PDEATHSIG = 1


def watch_parent(parent_pid: int, on_orphan, sig: int, poll_s: float) -> None:
    """Call ``on_orphan()`` once the process ``parent_pid`` ends: the kernel sends ``sig`` on Linux
    (``prctl``), and a daemon thread polls ``os.getppid()`` every ``poll_s`` seconds."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # no prctl: the watchdog still works
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the guard was in place
        on_orphan()

    def watch():
        while not threading.Event().wait(poll_s):
            if os.getppid() != parent_pid:
                on_orphan()

    threading.Thread(target=watch, name="ceem-parent-watchdog", daemon=True).start()


def die_with_parent(parent_pid: int, poll_s: float = 0.5) -> None:
    """End this process (a pool worker) when the process ``parent_pid`` ends, however it ends."""
    watch_parent(parent_pid, lambda: os._exit(1), signal.SIGKILL, poll_s)


def _abort(cleanup: str) -> None:
    if cleanup:
        shutil.rmtree(cleanup, ignore_errors=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # the compiler's processes, and this one
    finally:
        os._exit(1)


def main(argv: list[str]) -> int:
    parent, cleanup, sep, *cmd = argv
    if sep != "--" or not cmd:
        print("usage: _supervise.py PARENT_PID CLEANUP_DIR -- command ...", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: _abort(cleanup))
    watch_parent(int(parent), lambda: _abort(cleanup), signal.SIGTERM, 0.2)
    return subprocess.Popen(cmd).wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
