"""Per-iteration checkpoints of a CE-EM fit, written atomically, and resuming from them.

A checkpoint is an integrity-checked ``.npz`` (see :mod:`ceem_casadi.modelfile`) with the
current theta, the iteration history, the smoothed states when available and a fingerprint of
the model and data. :class:`CheckpointWriter` is a ``ceem`` callback that rewrites it after every
iteration by writing a temporary file and renaming it over the old one, so a process killed at
any moment (SIGINT or SIGKILL) leaves the previous complete checkpoint: at most the current
iteration is lost. :func:`resume` restarts :func:`ceem_casadi.ceem` from the checkpointed theta
(and states) and prepends the saved history; the fixed point is the same to solver tolerance.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .modelfile import ModelFileError, read_archive, record_dict, to_jsonable, write_archive

log = logging.getLogger(__name__)

FORMAT = "ceem_casadi.checkpoint"
FORMAT_VERSION = 1
KILL_ENV = "CEEM_CASADI_TEST_KILL_AFTER"   # testing aid: SIGKILL self after this many iterations


class CheckpointError(ModelFileError):
    """A checkpoint is unreadable or belongs to another model / data set."""


def fingerprint(model, data, source: dict | None = None) -> str:
    """SHA-256 of the data (y, u, lengths), the model sizes and parameter names, and ``source``."""
    h = hashlib.sha256()
    h.update(json.dumps({"nx": model.nx, "nu": model.nu, "ny": model.ny, "params": list(model.params.names),
                         "source": to_jsonable(source or {})}, sort_keys=True).encode())
    for b, y in enumerate(data.y):
        h.update(np.ascontiguousarray(y, float).tobytes())
        h.update(np.ascontiguousarray(data.inputs(b), float).tobytes())
    return h.hexdigest()


@dataclass
class Checkpoint:
    """theta (dict), history (list of dicts), x (list of (T_b, nx) or None), meta (JSON dict)."""

    theta: dict
    history: list
    x: list | None
    meta: dict = field(default_factory=dict)

    @property
    def iterations(self) -> int:
        return len(self.history)

    @property
    def status(self) -> str | None:
        """Final status when the fit that wrote it finished, else None."""
        return self.meta.get("status")


def write_checkpoint(path, theta: dict, history: list, *, x=None, meta: dict | None = None) -> Path:
    """Atomically (write, fsync, rename) write a checkpoint."""
    names = list(theta)
    arrays = {f"theta/{n}": np.asarray(theta[n], float) for n in names}
    if x is not None:
        for b, xb in enumerate(x):
            arrays[f"x/{b}"] = np.asarray(xb, float)
    body = {"format": FORMAT, "format_version": FORMAT_VERSION, "theta_names": names,
            "n_x": 0 if x is None else len(x), "history": to_jsonable(history), **to_jsonable(meta or {})}
    return write_archive(path, body, arrays)


def read_checkpoint(path) -> Checkpoint:
    """Read and verify a checkpoint (raises :class:`CheckpointError`)."""
    try:
        meta, arrays = read_archive(path, expected_format=FORMAT, max_version=FORMAT_VERSION)
    except ModelFileError as exc:
        raise CheckpointError(str(exc)) from None
    theta = {n: arrays[f"theta/{n}"] for n in meta["theta_names"]}
    x = [arrays[f"x/{b}"] for b in range(meta["n_x"])] if meta.get("n_x") else None
    history = meta.pop("history")
    return Checkpoint(theta, history, x, meta)


class CheckpointWriter:
    """``ceem`` callback writing a checkpoint after every iteration.

    Parameters
    ----------
    path : checkpoint file.
    theta0 : theta at the start (kept until an accepted iteration replaces it).
    meta : JSON-able metadata stored in every checkpoint (e.g. the fingerprint).
    history : records of earlier runs (dicts; a resumed fit) kept in front of the new ones.

    The states are stored when the records carry them (an ``x`` attribute); otherwise a resumed
    fit starts from the EKF/RTS states at the checkpointed theta.
    """

    def __init__(self, path, theta0: dict, *, meta: dict | None = None, history: list | None = None):
        self.path, self.meta = Path(path), dict(meta or {})
        self.history = list(history or [])
        self.offset = len(self.history)
        self.theta = {k: np.asarray(v, float) for k, v in theta0.items()}
        self.x = None
        kill = os.environ.get(KILL_ENV)
        self.kill_after = int(kill) if kill else None

    def __call__(self, rec) -> None:
        self.history.append(record_dict(rec, self.offset))
        if getattr(rec, "accepted", True):
            self.theta = {k: np.asarray(v, float) for k, v in rec.theta.items()}
            self.x = getattr(rec, "x", None)
        write_checkpoint(self.path, self.theta, self.history, x=self.x, meta=self.meta)
        log.debug("checkpoint %s: %d iterations", self.path, len(self.history))
        if self.kill_after is not None and len(self.history) >= self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)  # testing aid: die like a killed process

    def finish(self, status: str, message: str = "", theta: dict | None = None, x=None) -> Path:
        """Write the final checkpoint with the fit's status (a later resume returns it as is)."""
        if theta is not None:
            self.theta = {k: np.asarray(v, float) for k, v in theta.items()}
        return write_checkpoint(self.path, self.theta, self.history, x=x if x is not None else self.x,
                                meta={**self.meta, "status": status, "message": message})


def resume(path, model, data, *, fingerprint_value: str | None = None):
    """Checkpoint at ``path``, checked against the model/data ``fingerprint_value``.

    Returns the :class:`Checkpoint`; restart with
    ``ceem(model, data, ckpt.theta, x_init=ckpt.x, options=replace(options, max_iters=left))``
    and a :class:`CheckpointWriter` given ``history=ckpt.history``.
    """
    ckpt = read_checkpoint(path)
    if fingerprint_value is not None and ckpt.meta.get("fingerprint") != fingerprint_value:
        raise CheckpointError(f"{path}: the checkpoint belongs to another model or data set (fingerprint "
                              f"mismatch); delete it or fit without --resume")
    if ckpt.x is not None and (len(ckpt.x) != len(data) or
                               any(x.shape != (T, model.nx) for x, T in zip(ckpt.x, data.lengths))):
        raise CheckpointError(f"{path}: stored states do not fit the data")
    return ckpt
