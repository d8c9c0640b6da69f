"""The integrity-checked ``.npz`` archive of model files and checkpoints: ``__meta__`` JSON with its SHA-256
and numeric arrays, written atomically, read without pickle (docs/usage_cli.md, "Model files")."""
from __future__ import annotations

import hashlib
import io
import json
import zipfile
from contextlib import contextmanager
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path

import numpy as np

from ..errors import CeemError
from ..runtime._atomic import atomic_write_bytes
from ._limits import (
    MAX_GRAPH_INSTRUCTIONS,
    InputLimitError,
    check_file_size,
    check_npz,
    check_records,
    check_strings,
    loads_json,
    max_archive_bytes,
)


class ModelFileError(CeemError, ValueError):
    """A model file is corrupted, edited, from a newer format version, or its model source cannot be rebuilt.

    Examples
    --------
    >>> import tempfile, pathlib, ceem_casadi as cc
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "m.npz"
    >>> _ = path.write_bytes(b"not a model file")
    >>> try:
    ...     cc.load_model(path)
    ... except cc.deploy.ModelFileError as err:
    ...     print(type(err).__name__)
    ModelFileError
    """


def to_jsonable(obj):
    """Plain JSON types of dataclasses, numpy arrays/scalars, dicts, lists, paths."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in a model file (JSON types, numpy arrays, "
                    f"dataclasses only)")


def record_dict(rec, offset: int = 0) -> dict:
    """JSON-ready dict of an [`IterationRecord`][ceem_casadi.em.IterationRecord] (or a dict of one) without its
    states ``x``, the iteration shifted by ``offset``; an old record's ``decrease`` is read as ``increase``."""
    d = dict(rec) if isinstance(rec, dict) else {f.name: getattr(rec, f.name) for f in fields(rec)}
    if "decrease" in d and "increase" not in d:
        d["increase"] = d.pop("decrease")
    d.pop("x", None)
    d["iteration"] = int(d["iteration"]) + offset
    return to_jsonable(d)


def _digest(meta: dict, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    body = {k: v for k, v in meta.items() if k != "sha256"}
    h.update(json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def write_archive(path, meta: dict, arrays: dict[str, np.ndarray]) -> Path:
    """Atomically write an integrity-checked ``.npz`` of ``meta`` (JSON) and numeric ``arrays``."""
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    for k, a in arrays.items():
        if a.dtype == object:
            raise TypeError(f"array {k!r} has dtype object; only numeric arrays are stored (no pickle)")
    meta = dict(meta)
    meta["sha256"] = _digest(meta, arrays)
    blob = np.frombuffer(json.dumps(meta, sort_keys=True, allow_nan=True).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, a in [("__meta__", blob), *sorted(arrays.items())]:
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w") as fh:
                np.lib.format.write_array(fh, a, allow_pickle=False)
        zf.comment = b"0" * 64
    raw = buf.getvalue()[:-64]
    return atomic_write_bytes(path, raw + hashlib.sha256(raw).hexdigest().encode())


@contextmanager
def _as_model_file_error():
    """An `InputLimitError` of the resource policy raised as a `ModelFileError` (same message)."""
    try:
        yield
    except InputLimitError as exc:
        raise ModelFileError(str(exc)) from None


def read_archive(path, *, expected_format: str, max_version: int) -> tuple[dict, dict[str, np.ndarray]]:
    """``(meta, arrays)`` of a file written by `write_archive`, verified (else `ModelFileError`)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    with _as_model_file_error():  # the file's size before it is read: a padded archive with valid digests
        check_file_size(path, str(path), max_archive_bytes() + 2 ** 20)
    raw = path.read_bytes()
    if not raw.startswith(b"PK\x03\x04") or len(raw) < 64:
        raise ModelFileError(f"{path}: not a readable {expected_format} file (corrupted or wrong type)")
    if hashlib.sha256(raw[:-64]).hexdigest().encode() != raw[-64:]:
        raise ModelFileError(f"{path}: integrity check failed (SHA-256 mismatch of the file): the file "
                             f"was corrupted or edited; refusing to load it")
    with _as_model_file_error():  # dtypes, sizes and graph instructions from the headers, before any allocation
        check_npz(raw, str(path), max_rows={"/code": MAX_GRAPH_INSTRUCTIONS})
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # any parse failure of a verified file is a bad file
        raise ModelFileError(f"{path}: not a readable {expected_format} file "
                             f"(corrupted or wrong type): {type(exc).__name__}: {exc}") from None
    if "__meta__" not in arrays:
        raise ModelFileError(f"{path}: not a {expected_format} file (no metadata)")
    try:
        with _as_model_file_error():
            meta = loads_json(arrays.pop("__meta__").tobytes().decode(), f"{path}: metadata", max_archive_bytes())
            if isinstance(meta, dict):
                check_records(meta.get("history"), f"{path}: iteration history")
            check_strings(meta, f"{path}: metadata")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{path}: corrupted metadata ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != expected_format:
        raise ModelFileError(f"{path}: expected a {expected_format!r} file, got format "
                             f"{meta.get('format') if isinstance(meta, dict) else None!r}")
    version = meta.get("format_version")
    if not isinstance(version, int) or version > max_version:
        raise ModelFileError(f"{path}: format version {version} is newer than this ceem_casadi supports "
                             f"({max_version}); upgrade ceem_casadi to read it")
    if meta.get("sha256") != _digest(meta, arrays):
        raise ModelFileError(f"{path}: integrity check failed (SHA-256 mismatch of the content): the file was "
                             f"corrupted or edited; refusing to load it")
    return meta, arrays
