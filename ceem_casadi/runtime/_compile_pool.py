"""One background pool of compiler processes for the whole Python process, served biggest first; every
command runs in its own process group under a supervisor, so cancellation and death never leave
compilers behind (docs/runtime.md, "The pool")."""
from __future__ import annotations

import atexit
import contextlib
import errno
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

POLL_S = 0.005  # how often the scheduler looks for finished processes
SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_supervise.py")
FORKED = "started by the parent process before a fork"
# a compiler failing with one of these met a full, read-only or unusable folder: a cache problem
DISK_ERRORS = tuple(os.strerror(e) for e in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG,
                                             errno.EACCES, errno.EIO))


class CompileJob:
    """One compiler command; ``finish(ok)`` runs once when it ends, in the scheduler thread (moves the
    result into place when ``ok``, cleans up always); ``size`` orders the queue (biggest first)."""

    def __init__(self, cmd: list[str], label: str, size: int, finish: Callable[[bool], None] | None = None,
                 cleanup: str | None = None):
        self.cmd, self.label, self.size, self.finish = cmd, label, size, finish
        self.cleanup = cleanup  # the build folder (the supervisor removes it if this process dies)
        self.done = threading.Event()
        self.error: str | None = None
        self.disk_error = False  # the failure was the folder's (full, read-only, name too long), not the compiler's
        self.proc: subprocess.Popen | None = None
        self.log = None  # the compiler's stderr (a temporary file)

    def wait(self, deadline: float) -> None:
        """Block until done; ``RuntimeError`` on failure, on cancellation, or after ``deadline``
        (``time.monotonic()``), when the job is killed. Any interruption (Ctrl-C) kills it too."""
        try:
            while not self.done.wait(min(max(deadline - time.monotonic(), 0.0), 0.5)):
                if time.monotonic() >= deadline:
                    POOL.cancel([self], "took longer than its time limit")
                    break
        except BaseException:
            POOL.cancel([self], "interrupted")
            raise
        if self.error is not None:
            raise RuntimeError(f"compiling {self.label} failed: {self.error}")


class CompilePool:
    def __init__(self):
        self._lock = threading.Condition()
        self._pending: list[CompileJob] = []
        self._running: list[CompileJob] = []
        self._thread: threading.Thread | None = None
        self.jobs = 1

    def submit(self, new: list[CompileJob], jobs: int) -> None:
        """Queue ``new``, biggest first among all queued jobs; at most ``jobs`` run at once."""
        with self._lock:
            self.jobs = max(1, int(jobs))
            self._pending.extend(new)
            self._pending.sort(key=lambda j: -j.size)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="ceem-compile", daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def cancel(self, jobs: list[CompileJob] | None = None, why: str = "cancelled") -> None:
        """Drop ``jobs`` (default all) from the queue and kill the running ones' process groups."""
        with self._lock:
            chosen = list(self._pending) + list(self._running) if jobs is None else list(jobs)
            for job in chosen:
                if job in self._pending:
                    self._pending.remove(job)
                if job in self._running:
                    self._running.remove(job)
                    _kill(job.proc)
                    job.log.close()
                if not job.done.is_set():
                    _end(job, False, why)

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._running:
                    if not self._lock.wait(timeout=5.0) and not self._pending and not self._running:
                        self._thread = None  # idle: the next submit starts a new thread
                        return
                while self._pending and len(self._running) < self.jobs:
                    job = self._pending.pop(0)
                    try:
                        job.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed when the job ends
                        cmd = [sys.executable, "-S", SUPERVISOR, str(os.getpid()), job.cleanup or "", "--", *job.cmd]
                        # the compiler's temporaries (cc*.s, cc*.o) go into the build folder, removed with it
                        env = {**os.environ, "TMPDIR": job.cleanup} if job.cleanup else None
                        job.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                    stderr=job.log, start_new_session=True, env=env)
                    except OSError as exc:
                        job.disk_error = True
                        _end(job, False, str(exc))
                        continue
                    self._running.append(job)
                finished = [j for j in self._running if j.proc.poll() is not None]
                for job in finished:
                    self._running.remove(job)
            for job in finished:
                self._complete(job)
            if not finished:
                time.sleep(POLL_S)

    @staticmethod
    def _complete(job: CompileJob) -> None:
        proc = job.proc
        if job.done.is_set():  # cancelled meanwhile
            job.log.close()
            return
        job.log.seek(0)
        err = job.log.read().decode(errors="replace")  # a file, not a pipe: a chatty compiler never blocks
        job.log.close()
        ok = proc.returncode == 0
        job.disk_error = not ok and any(text in err for text in DISK_ERRORS)
        _end(job, ok, None if ok else f"exit status {proc.returncode}: {err[-2000:]}")

    def _after_fork(self) -> None:
        """In a forked child: the parent's jobs end with ``FORKED`` (their waiters compile again)."""
        for job in self._pending + self._running:
            if not job.done.is_set():
                job.error = FORKED
                job.done.set()
        self._lock = threading.Condition()
        self._pending, self._running, self._thread = [], [], None


def _end(job: CompileJob, ok: bool, error: str | None = None) -> None:
    """Record ``error``, run the job's ``finish(ok)`` and wake its waiter."""
    job.error = error if error is not None else job.error
    if job.finish is not None:
        try:
            job.finish(ok)
        except Exception as exc:  # reported to the waiter, never lost in the scheduler thread
            job.error = job.error or f"{type(exc).__name__}: {exc}"
            job.disk_error = job.disk_error or isinstance(exc, OSError)
    job.done.set()


def _kill(proc: subprocess.Popen) -> None:
    """Kill the process group of ``proc`` (the compiler driver with its cc1 and as) and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


POOL = CompilePool()
atexit.register(POOL.cancel, None, "the interpreter exited")
os.register_at_fork(after_in_child=POOL._after_fork)
