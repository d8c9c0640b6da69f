"""Run one compiler command so that it never outlives the Python process that asked for it.

Started by the compile pool (`runtime/_compile_pool.py`) as a script, stdlib only, as the leader
of its own process group::

    python -S _supervise.py PARENT_PID CLEANUP_DIR -- cc -O1 ... -o lib.so

It runs the command in its group and exits with its status. When the parent ends, however it
ends (SIGKILL included: the kernel's parent-death signal, and a watchdog on ``getppid``), or when
it is sent SIGTERM / SIGINT / SIGHUP itself, it kills the whole group (the driver, ``cc1``,
``as``, ``ld``) and removes ``CLEANUP_DIR`` (the job's temporary folder), so that no compiler
process and no temporary folder is left behind.
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
POLL_S = 0.2


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
    parent = int(parent)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: _abort(cleanup))
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the guard was in place
        _abort(cleanup)

    def watch():
        while not threading.Event().wait(POLL_S):
            if os.getppid() != parent:
                _abort(cleanup)

    threading.Thread(target=watch, daemon=True).start()
    proc = subprocess.Popen(cmd)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
