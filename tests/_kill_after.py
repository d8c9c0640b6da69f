"""Test helper: run the command line and SIGKILL this process right after the N-th iteration's
checkpoint is written (a fit killed like ``kill -9``), for the kill-and-resume tests.

    python tests/_kill_after.py N fit --model ... --out m.npz
"""
import os
import signal
import sys

from ceem_casadi.cli import main
from ceem_casadi.em import _checkpoint


def _install(n: int) -> None:
    write = _checkpoint.CheckpointWriter.__call__

    def write_then_die(self, rec):
        write(self, rec)
        if len(self.history) >= n:
            os.kill(os.getpid(), signal.SIGKILL)  # nothing after the checkpoint runs

    _checkpoint.CheckpointWriter.__call__ = write_then_die


if __name__ == "__main__":
    _install(int(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
