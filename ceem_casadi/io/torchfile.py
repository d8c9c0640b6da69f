"""Restricted reader (and writer) of PyTorch ``torch.save`` files without torch: unpickling allows only tensors
and plain containers (else [`UnsafePickleError`][ceem_casadi.io.torchfile.UnsafePickleError]); tensors as arrays."""
from __future__ import annotations

import io
import pickle
import struct
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..errors import CeemError
from ..runtime._atomic import atomic_path
from ._limits import max_archive_bytes

__all__ = ["UnsafePickleError", "TorchFileError", "load", "save"]

_MAGIC = 0x1950A86A20F9469CFC6C
_PROTOCOL = 1001

_STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16,
    "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


class TorchFileError(CeemError, ValueError):
    """The file is not a torch.save file this reader understands."""


class UnsafePickleError(TorchFileError):
    """The pickle asks for a callable outside the tensor/storage whitelist."""


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if storage.size == 0 or not size:
        return storage[offset:offset + 1].reshape(size).copy() if not size else np.zeros(size, storage.dtype)
    return np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=tuple(s * storage.itemsize for s in stride)).copy()


_ALLOWED = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor_v2,  # the legacy form: v2 without its optional arguments
    ("collections", "OrderedDict"): OrderedDict,
    ("torch", "device"): str,
}


class _SafeUnpickler(pickle.Unpickler):
    def __init__(self, fh, load_storage):
        super().__init__(fh)
        self._load_storage = load_storage

    def find_class(self, module, name):
        if module == "torch" and name in _STORAGE_DTYPES:
            return np.dtype(_STORAGE_DTYPES[name])  # a storage type stands for its element type
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        raise UnsafePickleError(
            f"refusing to load {module}.{name}: only tensor/storage reconstruction "
            f"(torch._utils._rebuild_tensor_v2, torch.*Storage, collections.OrderedDict) is allowed")

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or not pid or pid[0] != "storage":
            raise TorchFileError(f"expected persistent id ('storage', ...), got {pid!r}")
        return self._load_storage(pid)


def _load_zip(path: Path):
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
        if not pkl:
            raise TorchFileError(f"{path}: zip file without data.pkl (entries: {names[:5]})")
        prefix = pkl[0][: -len("data.pkl")]
        cache = {}

        def load_storage(pid):
            _, stype, key, _loc, numel = pid[:5]
            if key not in cache:
                _check_bytes(path, zf.getinfo(f"{prefix}data/{key}").file_size)  # from the zip directory
                raw = zf.read(f"{prefix}data/{key}")
                cache[key] = np.frombuffer(raw, dtype=stype.newbyteorder("<"))
            return cache[key]

        return _SafeUnpickler(io.BytesIO(zf.read(pkl[0])), load_storage).load()


def _load_legacy(path: Path):
    def no_storage(pid):
        raise TorchFileError(f"{path}: unexpected storage in header")

    with open(path, "rb") as fh:
        magic = _SafeUnpickler(fh, no_storage).load()
        if magic != _MAGIC:
            raise TorchFileError(f"{path}: expected torch magic number {_MAGIC:#x}, got {magic!r}")
        proto = _SafeUnpickler(fh, no_storage).load()
        if proto != _PROTOCOL:
            raise TorchFileError(f"{path}: expected legacy protocol {_PROTOCOL}, got {proto!r}")
        _SafeUnpickler(fh, no_storage).load()  # sys_info dict
        start = fh.tell()
        storages = {}

        def load_storage(pid):
            _, stype, key, _loc, numel = pid[:5]
            if key not in storages:  # the declared size, before it is allocated
                _check_bytes(path, int(numel) * stype.itemsize + sum(a.nbytes for a in storages.values()))
            arr = storages.setdefault(key, np.zeros(int(numel), stype))
            view = pid[5] if len(pid) > 5 else None
            if view is not None:
                _vkey, off, vsize = view
                return arr[int(off):int(off) + int(vsize)]
            return arr

        _SafeUnpickler(fh, load_storage).load()  # first pass: learn the storages
        keys = _SafeUnpickler(fh, no_storage).load()
        for key in keys:
            arr = storages[key]
            (n,) = struct.unpack("<q", fh.read(8))
            if n != arr.size:
                raise TorchFileError(f"{path}: storage {key}: expected {arr.size} elements, file has {n}")
            arr[:] = np.frombuffer(fh.read(n * arr.itemsize), dtype=arr.dtype.newbyteorder("<"))
        fh.seek(start)
        return _SafeUnpickler(fh, load_storage).load()  # second pass: storages now filled


def load(path) -> object:
    """Load a ``torch.save`` file without torch and without executing pickled code.

    Parameters
    ----------
    path : str or Path
        A file written by ``torch.save`` (zip or legacy format).

    Returns
    -------
    object
        The saved object with every tensor replaced by a numpy array.

    Raises
    ------
    UnsafePickleError
        The pickle references a callable outside the whitelist (e.g. ``os.system``).
    TorchFileError
        The file is neither format.
    """
    path = Path(path)
    _check_bytes(path, path.stat().st_size)
    if zipfile.is_zipfile(path):
        return _load_zip(path)
    return _load_legacy(path)


def _check_bytes(path, nbytes: int) -> None:
    """`TorchFileError` when a file, or the tensors it declares, exceed `max_archive_bytes` (the
    resource policy of `ceem_casadi.io._limits`), before anything is read or allocated."""
    limit = max_archive_bytes()
    if not 0 <= nbytes <= limit:
        raise TorchFileError(f"{path}: {nbytes} bytes of file or tensors, more than the limit of {limit} bytes "
                             f"(raise $CEEM_MAX_ARCHIVE_MB only for a file you trust)")


_NP2STORAGE = {np.dtype(v): k for k, v in _STORAGE_DTYPES.items()}  # the writer's tables
_CONTAINER_OPCODES = {tuple: (b"(", b"t"), list: (b"](", b"e"), dict: (b"}(", b"u")}


class _PickleWriter:
    """Minimal protocol-2 pickle writer for the restricted vocabulary (no torch import needed)."""

    def __init__(self, legacy: bool):
        self.legacy, self.out, self.arrays = legacy, bytearray(), []

    def global_(self, module, name):
        self.out += b"c" + f"{module}\n{name}\n".encode()

    def dump(self, obj):
        self.out += b"\x80\x02"
        self.obj(obj)
        self.out += b"."
        return bytes(self.out)

    def obj(self, o):
        out = self.out
        if o is None or isinstance(o, (bool, int, float, str, np.integer, np.floating)):  # the pickle of a scalar
            out += pickle.dumps(o.item() if isinstance(o, np.generic) else o, protocol=2)[2:-1]  # minus PROTO, STOP
        elif isinstance(o, np.ndarray):
            self.tensor(o)
        elif isinstance(o, (tuple, list, dict)):  # MARK (after an empty list / dict), items, TUPLE / APPENDS / SETITEMS
            start, end = _CONTAINER_OPCODES[next(t for t in (tuple, list, dict) if isinstance(o, t))]
            out += start
            for x in (v for kv in o.items() for v in kv) if isinstance(o, dict) else o:
                self.obj(x)
            out += end
        else:
            raise TypeError(f"torchfile.save: unsupported type {type(o).__name__}")

    def tensor(self, a):
        a = np.ascontiguousarray(a)
        if a.dtype not in _NP2STORAGE:
            raise TypeError(f"torchfile.save: unsupported dtype {a.dtype}")
        key = str(len(self.arrays))
        self.arrays.append((key, a))
        stride = tuple(int(s // a.itemsize) for s in a.strides) if a.size else (1,) * a.ndim
        self.global_("torch._utils", "_rebuild_tensor_v2")
        self.out += b"(("  # MARK of the call's arguments, MARK of the persistent id tuple
        self.obj("storage")
        self.global_("torch", _NP2STORAGE[a.dtype])
        for v in (key, "cpu", int(a.size), *([None] if self.legacy else [])):  # key, location, numel[, view]
            self.obj(v)
        self.out += b"tQ"  # TUPLE, BINPERSID
        for v in (0, tuple(int(s) for s in a.shape), stride, False):  # offset, size, stride, requires_grad
            self.obj(v)
        self.global_("collections", "OrderedDict")
        self.out += b")RtR"  # EMPTY_TUPLE, REDUCE -> OrderedDict() (the hooks); TUPLE, REDUCE -> the tensor


def save(obj, path, *, legacy: bool = False) -> None:
    """Write numpy arrays (inside tuples/lists/dicts) as a ``torch.save`` file, without torch.

    Parameters
    ----------
    obj : object
        Nested tuples/lists/dicts of numpy arrays and plain Python scalars/strings.
    path : str or Path
        Output file.
    legacy : bool
        Write the pre-1.6 pickle-stream format instead of the zip format.
    """
    path = Path(path)
    w = _PickleWriter(legacy)
    data = w.dump(obj)
    with atomic_path(path) as tmp:  # never through a symlink
        _write(tmp, name=path.stem or "archive", w=w, data=data, legacy=legacy)


def _write(path, *, name, w, data, legacy) -> None:
    if legacy:
        with open(path, "wb") as fh:
            sys_info = {"protocol_version": _PROTOCOL, "little_endian": True,
                        "type_sizes": {"short": 2, "int": 4, "long": 4}}
            for part in (_MAGIC, _PROTOCOL, sys_info):
                fh.write(pickle.dumps(part, protocol=2))
            fh.write(data)
            fh.write(pickle.dumps([k for k, _ in w.arrays], protocol=2))
            for _, a in w.arrays:
                fh.write(struct.pack("<q", a.size))
                fh.write(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
        return
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{name}/data.pkl", data)
        zf.writestr(f"{name}/byteorder", "little")
        for key, a in w.arrays:
            zf.writestr(f"{name}/data/{key}", a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
        zf.writestr(f"{name}/version", "3\n")
