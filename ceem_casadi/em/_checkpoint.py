"""Per-iteration checkpoints of a CE-EM fit, written atomically, and resuming from them (docs/algorithms.md)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..io._archive import ModelFileError, read_archive, record_dict, to_jsonable, write_archive
from ..runtime._result import Result
from ..runtime._status import Status
from ._ceem import ceem
from ._options import CEEMOptions

log = logging.getLogger(__name__)

FORMAT = "ceem_casadi.checkpoint"
FORMAT_VERSION = 1


def in_finaliser(frame) -> bool:
    """Whether ``frame`` (a signal handler's) or a caller of it is a ``__del__``, where an exception is
    printed as "Exception ignored" and lost."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


class CheckpointError(ModelFileError):
    """A checkpoint is unreadable or belongs to another model / data set.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> issubclass(cc.em.CheckpointError, cc.CeemError)
    True
    """


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
    arrays.update({f"x/{b}": np.asarray(xb, float) for b, xb in enumerate([] if x is None else x)})
    body = {"format": FORMAT, "format_version": FORMAT_VERSION, "theta_names": names,
            "n_x": 0 if x is None else len(x), "history": to_jsonable(history), **to_jsonable(meta or {})}
    return write_archive(path, body, arrays)


def read_checkpoint(path) -> Checkpoint:
    """Read and verify a checkpoint (raises [`CheckpointError`][ceem_casadi.em.CheckpointError])."""
    try:
        meta, arrays = read_archive(path, expected_format=FORMAT, max_version=FORMAT_VERSION)
    except ModelFileError as exc:
        raise CheckpointError(str(exc)) from None
    check_checkpoint(path, meta, arrays)
    theta = {n: arrays[f"theta/{n}"] for n in meta["theta_names"]}
    x = [arrays[f"x/{b}"] for b in range(meta["n_x"])] if meta.get("n_x") else None
    history = [record_dict(h) for h in meta.pop("history")]  # older files: "decrease" -> "increase"
    return Checkpoint(theta, history, x, meta)


def check_checkpoint(path, meta: dict, arrays: dict) -> None:
    """Raise `CheckpointError` unless ``meta`` and ``arrays`` have the layout `write_checkpoint` writes (a
    crafted or truncated file is refused in one line instead of a ``KeyError`` on resume)."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {what}; the checkpoint is damaged or not written by ceem_casadi (delete "
                               f"it, or start again with --overwrite)")

    names = meta.get("theta_names")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise bad("'theta_names' is not a list of parameter names")
    for n in names:
        a = arrays.get(f"theta/{n}")
        if a is None:
            raise bad(f"the array of parameter {n!r} is missing")
        if a.dtype.kind not in "iuf" or not np.all(np.isfinite(a)):
            raise bad(f"the array of parameter {n!r} is not finite real numbers")
    n_x = meta.get("n_x", 0)
    if not isinstance(n_x, int) or isinstance(n_x, bool) or n_x < 0:
        raise bad(f"'n_x' is {n_x!r}, not a count of state arrays")
    for b in range(n_x):
        a = arrays.get(f"x/{b}")
        if a is None or a.ndim != 2 or a.dtype.kind != "f":
            raise bad(f"state array x/{b} is missing or not a (T, nx) array")
    history = meta.get("history")
    if not (isinstance(history, list) and all(isinstance(h, dict) and isinstance(h.get("iteration"), int)
                                              for h in history)):
        raise bad("'history' is not a list of iteration records with an 'iteration' number")


class CheckpointWriter:
    """``ceem`` callback writing a checkpoint to ``path`` after every iteration: ``theta0`` until an accepted
    iteration replaces it, the records' states when they carry them, ``meta`` (JSON-able, e.g. the
    fingerprint) in every checkpoint, the ``history`` of earlier runs (dicts) in front of the new records."""

    def __init__(self, path, theta0: dict, *, meta: dict | None = None, history: list | None = None):
        self.path, self.meta = Path(path), dict(meta or {})
        self.history = list(history or [])
        self.offset = len(self.history)
        self.theta = {k: np.asarray(v, float) for k, v in theta0.items()}
        self.x = None

    def __call__(self, rec) -> None:
        self.history.append(record_dict(rec, self.offset))
        if getattr(rec, "accepted", True):
            self.theta = {k: np.asarray(v, float) for k, v in rec.theta.items()}
            self.x = getattr(rec, "x", None)
        write_checkpoint(self.path, self.theta, self.history, x=self.x, meta=self.meta)
        log.debug("checkpoint %s: %d iterations", self.path, len(self.history))

    def finish(self, status: str, message: str = "", theta: dict | None = None, x=None) -> Path:
        """Write the final checkpoint with the fit's status (a later resume returns it as is)."""
        if theta is not None:
            self.theta = {k: np.asarray(v, float) for k, v in theta.items()}
        return write_checkpoint(self.path, self.theta, self.history, x=x if x is not None else self.x,
                                meta={**self.meta, "status": status, "message": message})


def resume(path, model, data, *, fingerprint_value: str | None = None) -> Checkpoint:
    """The checkpoint at ``path``, checked against the model/data ``fingerprint_value`` and the data's shapes."""
    ckpt = read_checkpoint(path)
    if fingerprint_value is not None and ckpt.meta.get("fingerprint") != fingerprint_value:
        raise CheckpointError(f"{path}: the checkpoint belongs to another model or data set (fingerprint "
                              f"mismatch); delete it or fit without --resume")
    if ckpt.x is not None and (len(ckpt.x) != len(data) or
                               any(x.shape != (T, model.nx) for x, T in zip(ckpt.x, data.lengths))):
        raise CheckpointError(f"{path}: stored states do not fit the data")
    return ckpt


@dataclass(repr=False)
class CheckpointedFit(Result):
    """Outcome of `ceem_checkpointed`: ``status``, ``message``, ``theta``, ``x`` as in `CEEMResult`, the ``history``
    of every run (dicts of `IterationRecord` fields) and ``resumed_from``, the iterations taken from the checkpoint."""

    SUMMARY = ('status', 'theta', 'resumed_from')

    status: str
    message: str
    theta: dict
    x: list | None
    history: list
    resumed_from: int = 0

    def __post_init__(self):
        self.status = Status(self.status)


def ceem_checkpointed(model, data, theta0: dict, path, *, options=None, resume_fit: bool = False,
                      source: dict | None = None, callback=None) -> CheckpointedFit:
    """[`ceem_casadi.ceem`][ceem_casadi.ceem] with a checkpoint at ``path`` after every iteration.

    Parameters
    ----------
    model, data : StateSpaceModel, Trajectories
        As for [`ceem_casadi.ceem`][ceem_casadi.ceem].
    theta0 : dict
        Initial parameters (replaced by the checkpoint's when resuming).
    path : str or pathlib.Path
        Checkpoint file, written atomically after every iteration and with the final status.
    options : CEEMOptions, optional
        As for [`ceem_casadi.ceem`][ceem_casadi.ceem]; ``max_iters`` counts the iterations of all runs together.
    resume_fit : bool
        Continue from ``path`` when it exists (and belongs to this model, data and ``source``): theta and states from
        the checkpoint, the saved history in front; a finished one (converged or solver failure) is returned as is.
    source : dict, optional
        JSON-able description of the model source, part of the fingerprint.
    callback : callable, optional
        Called with each new [`IterationRecord`][ceem_casadi.em.IterationRecord], its ``iteration`` counted
        over all runs; return ``False`` to stop.

    Returns
    -------
    CheckpointedFit

    Raises
    ------
    CheckpointError
        ``path`` belongs to another model, data set or source, or is damaged.
    KeyboardInterrupt
        On SIGINT, also inside IPOPT (main thread only); the checkpoint of the last complete iteration is kept.

    Examples
    --------
    A second call with ``resume_fit=True`` returns the finished fit from the file:

    >>> import tempfile, pathlib, numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(60, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [0.0], 60, u=u, process_std=0.1, measurement_std=0.1, seed=1)
    >>> options = cc.CEEMOptions(smoother=cc.SmootherOptions(compile=False), learner=cc.LearnerOptions(compile=False))
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "fit.ckpt.npz"
    >>> run = cc.ceem_checkpointed(model, data, {"a": 0.5}, path, options=options)
    >>> round(float(run.theta["a"]), 2), path.exists()
    (0.8, True)
    >>> again = cc.ceem_checkpointed(model, data, {"a": 0.5}, path, options=options, resume_fit=True)
    >>> float(again.theta["a"]) == float(run.theta["a"])
    True
    """
    options = CEEMOptions() if options is None else options
    if not isinstance(options, CEEMOptions):
        raise TypeError(f"options must be a CEEMOptions, got {type(options).__name__}")
    path = Path(path)
    fp = fingerprint(model, data, source)
    history, x_init, done = [], None, None
    if resume_fit and path.exists():
        ckpt = resume(path, model, data, fingerprint_value=fp)
        history, theta0, x_init = ckpt.history, ckpt.theta, ckpt.x
        done = ckpt.status if ckpt.status in ("converged", "solver_failed") else None  # max_iters: go on
        log.info("resuming from %s after %d iterations", path, len(history))
    writer = CheckpointWriter(path, theta0, meta={"fingerprint": fp}, history=history)
    left = options.max_iters - len(history)
    if done is not None or left <= 0:
        status = done or "max_iters"
        writer.finish(status, "taken from the finished checkpoint", theta=theta0, x=x_init)
        return CheckpointedFit(status, "taken from the finished checkpoint", dict(theta0), x_init,
                               writer.history, len(history))

    offset = len(history)

    interrupted = []

    def on_record(rec):
        writer(rec)
        out = None if callback is None else callback(dataclasses.replace(rec, iteration=rec.iteration + offset))
        if interrupted:  # the handler could not raise (a finaliser was running): stop at this iteration's end
            raise KeyboardInterrupt
        return out

    def on_sigint(signum, frame):  # IPOPT turns KeyboardInterrupt into a solver failure: remember it
        interrupted.append(signum)
        if not in_finaliser(frame):  # raised in a __del__, it would be printed and lost
            raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_sigint) if main else None
    try:
        result = ceem(model, data, theta0, options=dataclasses.replace(options, max_iters=left),
                      x_init=x_init, callback=on_record)
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    if interrupted:  # keep the last per-iteration checkpoint (no final status)
        raise KeyboardInterrupt
    writer.finish(result.status, result.message, theta=result.theta, x=result.x)
    return CheckpointedFit(result.status, result.message, result.theta, result.x, writer.history, offset)
