"""Save and load identified models: open formats, integrity-checked, never pickle, never code.

A model file is a NumPy ``.npz`` archive (a zip of ``.npy`` arrays, read with
``allow_pickle=False``) holding

* ``__meta__``: UTF-8 JSON (as a uint8 array) with the format name and version, the library and
  CasADi versions, the model source reference ``package.module:factory`` (or
  ``path/to/file.py:factory``) and its keyword arguments, the parameter declarations (names,
  shapes, initial values, bounds, free masks, priors), the noise settings, the fit options, a
  description of the data, the iteration history and free-form user metadata;
* ``theta``: the flat parameter vector; ``noise/<field>``: noise arrays; ``extra/<name>``:
  user arrays (e.g. initial states);
* ``sx/f/*``, ``sx/g/*`` (and ``sx/rhs/*``): the model functions as plain expression graphs
  (:mod:`ceem_casadi.sxgraph`: instruction rows of elementary operations on x, u, p).

The JSON holds ``sha256``, the SHA-256 over the canonical JSON (without that field) and every
array's name, dtype, shape and bytes: a corrupted or edited file is refused with
:class:`ModelFileError`. The digest protects against corruption and accidental edits, not
against a forger who recomputes it.

Trust model: by default :func:`load_model` runs no code from the file. It rebuilds the model
from the stored expression graphs (a whitelist of arithmetic operations; calls to other
Functions, CasADi's own deserialiser, ``External`` libraries and imports are never used), so
a crafted file can at worst give a wrong model, not run a command. The factory named in the
file is imported and called only with ``trust_source=True`` (CLI ``--trust-source``): only for
files you made. Files of format 1 (before expression graphs were stored) need that opt-in.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import logging
import os
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from types import SimpleNamespace

import casadi as ca
import numpy as np

from . import sxgraph
from .errors import CeemError
from .modelsource import ModelSourceError, build_model, is_file_ref, load_factory  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

FORMAT = "ceem_casadi.model"
FORMAT_VERSION = 2
_NOISE_FIELDS = ("process_std", "measurement_std", "x1_mean", "x1_std")


class ModelFileError(CeemError, ValueError):
    """A model file is corrupted, edited, from a newer format version, or its model source
    cannot be rebuilt."""


# --- JSON helpers -------------------------------------------------------------------------
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
    """JSON-ready dict of an :class:`~ceem_casadi.IterationRecord` (or a dict of one), without
    any state trajectories (``x``), its iteration shifted by ``offset``. A record written before
    ``decrease`` was renamed ``increase`` (same value: objective minus the previous one) is read
    under the new name."""
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


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to a temporary file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_archive(path, meta: dict, arrays: dict[str, np.ndarray]) -> Path:
    """Atomically write an integrity-checked ``.npz`` (``meta`` JSON + numeric ``arrays``).

    The zip comment (the file's last 64 bytes) is the hex SHA-256 of all bytes before it; the
    metadata's ``sha256`` is the digest of the content (JSON + arrays).
    """
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


def read_archive(path, *, expected_format: str, max_version: int) -> tuple[dict, dict[str, np.ndarray]]:
    """Read and verify a file written by :func:`write_archive`; raise :class:`ModelFileError`."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    raw = path.read_bytes()
    if not raw.startswith(b"PK\x03\x04") or len(raw) < 64:
        raise ModelFileError(f"{path}: not a readable {expected_format} file (corrupted or wrong type)")
    if hashlib.sha256(raw[:-64]).hexdigest().encode() != raw[-64:]:
        raise ModelFileError(f"{path}: integrity check failed (SHA-256 mismatch of the file): the file "
                             f"was corrupted or edited; refusing to load it")
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # any parse failure of a verified file is a bad file
        raise ModelFileError(f"{path}: not a readable {expected_format} file "
                             f"(corrupted or wrong type): {type(exc).__name__}: {exc}") from None
    if "__meta__" not in arrays:
        raise ModelFileError(f"{path}: not a {expected_format} file (no metadata)")
    try:
        meta = json.loads(arrays.pop("__meta__").tobytes().decode())
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
        raise ModelFileError(f"{path}: integrity check failed (SHA-256 mismatch of the content): the file was corrupted "
                             f"or edited; refusing to load it")
    return meta, arrays


# --- model files ----------------------------------------------------------------------------
@dataclass
class SavedModel:
    """An identified model loaded from a file.

    model : the :class:`~ceem_casadi.StateSpaceModel`, rebuilt from the stored expression graphs
        (or, with ``trust_source=True``, by its factory); its noise settings are those saved.
    theta : dict name -> array. source, kwargs : the model factory reference (text only unless
        loaded with ``trust_source=True``).
    meta : the whole JSON metadata (options, data, history, versions, user metadata).
    extra : user arrays saved with the model.
    """

    model: object
    theta: dict
    source: str | None
    kwargs: dict
    meta: dict
    extra: dict = field(default_factory=dict)
    uncertainty: dict | None = None  # saved parameter uncertainty (JSON fields + "covariance" array)

    @property
    def theta_vector(self) -> np.ndarray:
        return np.concatenate([np.ravel(self.theta[n]) for n in self.meta["theta_names"]]) \
            if self.theta else np.zeros(0)

    @property
    def history(self) -> list:
        return [record_dict(h) for h in self.meta.get("history", [])]

    def predict(self, y, u=None, *, x0=None, Sigma0=None, Q=None, R=None, engine: str = "python"):
        """EKF one-step predictions on one trajectory ``y`` (T, ny) (NaN = missing).

        Defaults: ``x0`` = ``extra['x0']`` if saved, else the noise ``x1_mean``, else zeros;
        ``Sigma0`` = ``x1_std**2`` (else ``process_std**2``); ``Q = process_std**2``;
        ``R = measurement_std**2``. Returns :class:`~ceem_casadi.filtering.FilterResult`.
        """
        from .filtering import EKF

        m, noise = self.model, self.model.noise
        if x0 is None:
            x0 = self.extra.get("x0", noise.x1_mean if noise.x1_mean is not None else np.zeros(m.nx))
            x0 = np.asarray(x0, float).reshape(-1, m.nx)[0]
        if Sigma0 is None:
            Sigma0 = (noise.x1_std if noise.x1_std is not None else noise.process_std) ** 2
        Q = noise.process_std ** 2 if Q is None else Q
        R = noise.measurement_std ** 2 if R is None else R
        return EKF(m).run(self.theta_vector, y, u, x0=x0, Sigma0=Sigma0, Q=Q, R=R, engine=engine)


def save_model(path, model, theta, *, source: str | None = None, kwargs: dict | None = None,
               options=None, data: dict | None = None, history=None, extra: dict | None = None,
               metadata: dict | None = None, uncertainty=None) -> Path:
    """Write an identified model to ``path`` (``.npz``; written atomically).

    Parameters
    ----------
    model : the :class:`~ceem_casadi.StateSpaceModel` (its noise settings are saved).
    theta : identified parameters, dict name -> array.
    source, kwargs : ``"package.module:factory"`` and its keyword arguments (JSON types) that
        rebuild ``model`` (used only by ``load_model(..., trust_source=True)``); None stores only
        the expression graphs.
    options : fit options (a dataclass such as :class:`~ceem_casadi.CEEMOptions`, or a dict).
    data : description of the training data (JSON types: files, columns, lengths, dt, ...).
    history : list of :class:`~ceem_casadi.IterationRecord` (or dicts).
    extra : numeric arrays to keep with the model (e.g. ``{"x0": (B, nx)}`` initial states).
    metadata : free-form JSON-able user metadata.
    uncertainty : optional :class:`~ceem_casadi.uncertainty.ParameterUncertainty` of the fit: its
        covariance is stored as the array ``uncertainty/covariance``, the rest (names, estimates,
        standard errors, intervals, identifiability) in the JSON field ``uncertainty``.
    """
    from . import __version__

    theta = model.params.validate(theta) if hasattr(model.params, "validate") else dict(theta)
    names = list(model.params.names)
    theta_vec = np.concatenate([np.ravel(np.asarray(theta[n], float)) for n in names]) if names else np.zeros(0)
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "library_version": __version__,
        "casadi_version": ca.__version__, "numpy_version": np.__version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "source": source, "kwargs": to_jsonable(kwargs or {}),
        "model_name": getattr(model, "name", "model"), "nx": model.nx, "nu": model.nu, "ny": model.ny,
        "dt": model.dt, "theta_names": names, "theta_shapes": [list(np.shape(theta[n])) for n in names],
        "options": to_jsonable(options) if options is not None else None,
        "data": to_jsonable(data or {}), "history": [record_dict(h) for h in (history or [])],
        "metadata": to_jsonable(metadata or {}),
    }
    meta["params"] = _param_spec(model.params) if hasattr(model.params, "validate") else None
    try:
        arrays = {"theta": theta_vec, **sxgraph.to_arrays("sx/f", model.f), **sxgraph.to_arrays("sx/g", model.g)}
        if getattr(model, "rhs", None) is not None:
            arrays.update(sxgraph.to_arrays("sx/rhs", model.rhs))
    except sxgraph.GraphError as exc:
        raise ModelFileError(f"cannot save the model: {exc}") from None
    for k in _NOISE_FIELDS:
        v = getattr(model.noise, k)
        if v is not None:
            arrays[f"noise/{k}"] = np.asarray(v, float)
    for k, v in (extra or {}).items():
        arrays[f"extra/{k}"] = np.asarray(v)
    if uncertainty is not None:
        unc = uncertainty.to_dict()
        arrays["uncertainty/covariance"] = np.asarray(unc.pop("covariance"), float)
        unc.pop("correlation", None)
        meta["uncertainty"] = to_jsonable(unc)
    if source is not None:
        build_model(source, kwargs)  # fail now, not in six months, if the reference is wrong
    return write_archive(path, meta, arrays)


def _same_function(a: ca.Function, b: ca.Function, nx: int, nu: int, n_p: int, theta_vec) -> bool:
    rng = np.random.default_rng(0)
    for scale in (0.5, 2.0):
        args = (scale * rng.standard_normal(nx), scale * rng.standard_normal(nu),
                theta_vec * (1 + 0.01 * rng.standard_normal(n_p)))
        va, vb = np.asarray(a(*args)), np.asarray(b(*args))
        if va.shape != vb.shape or not np.allclose(va, vb, rtol=1e-12, atol=1e-12, equal_nan=True):
            return False
    return True


def _param_spec(params) -> list[dict]:
    """JSON-able declarations of a :class:`~ceem_casadi.Parameters` (values, bounds, masks, priors)."""
    keys = ("value", "lower", "upper", "free", "prior_mean", "prior_std")
    return [{"name": p.name, "shape": list(p.shape), **{k: to_jsonable(p.array(k)) for k in keys}} for p in params]


def _params_from_spec(spec, meta: dict, theta_vec: np.ndarray):
    """Parameters of the stored declarations (or, without them, unbounded ones at the saved theta)."""
    from .params import Param, Parameters

    if spec is None:
        spec, off = [], 0
        for name, shape in zip(meta["theta_names"], meta["theta_shapes"]):
            n = int(np.prod(shape, dtype=int))
            spec.append({"name": name, "shape": shape, "value": theta_vec[off:off + n].reshape(shape)})
            off += n
    params = Parameters(*[Param(d["name"], **{k: (np.asarray(v, float) if k != "free" else np.asarray(v, bool))
                                              for k, v in d.items() if k not in ("name", "shape") and v is not None},
                                shape=tuple(d["shape"])) for d in spec])
    if params.names != list(meta["theta_names"]) or params.size != theta_vec.size:
        raise ModelFileError(f"parameter declarations {params.names} do not match theta {meta['theta_names']}")
    return params


def _model_from_graphs(path, meta: dict, arrays: dict, noise, theta_vec):
    """StateSpaceModel from the stored expression graphs: no import, no deserialiser, no code."""
    from .model import StateSpaceModel

    try:
        f = sxgraph.from_arrays(arrays, "sx/f", "f", "x_next")
        g = sxgraph.from_arrays(arrays, "sx/g", "g", "y")
        rhs = sxgraph.from_arrays(arrays, "sx/rhs", "rhs", "xdot")
        if f is None or g is None:
            raise sxgraph.GraphError("no stored expression graphs sx/f, sx/g")
        params = _params_from_spec(meta.get("params"), meta, theta_vec)
        model = StateSpaceModel.from_functions(f, g, params=params, dt=meta.get("dt"), rhs=rhs,
                                               name=meta.get("model_name", "model"),
                                               **{k: getattr(noise, k) for k in _NOISE_FIELDS})
    except (CeemError, ValueError, TypeError, KeyError, IndexError, RuntimeError) as exc:
        raise ModelFileError(f"{path}: the stored model functions are not a valid expression graph ({exc}); "
                             f"refusing to load it") from None
    if (model.nx, model.nu, model.ny) != (meta["nx"], meta["nu"], meta["ny"]):
        raise ModelFileError(f"{path}: the stored functions have sizes {(model.nx, model.nu, model.ny)}, the "
                             f"metadata {(meta['nx'], meta['nu'], meta['ny'])}; refusing to load it")
    return model


def load_model(path, *, trust_source: bool = False, check_source: bool = True, rebuild: bool | None = None
               ) -> SavedModel:
    """Read a model file written by :func:`save_model` (integrity-checked).

    By default nothing in the file is executed: the model is rebuilt from the stored expression
    graphs (:mod:`ceem_casadi.sxgraph`), with the stored parameter declarations and noise. The
    result is a full :class:`~ceem_casadi.StateSpaceModel` (fit again, smooth, predict, codegen).

    trust_source : import and call the factory named in the file (``source``, ``kwargs``) to
        rebuild the model, as the model's author wrote it. This RUNS CODE named by the file:
        only for files you made. Needed for files of format 1 (no stored expression graphs).
    check_source : with ``trust_source``, compare the factory's ``f``, ``g`` with the stored
        ones at random points and raise :class:`ModelFileError` when the model source changed.
    rebuild : deprecated; ``False`` is the default behaviour, ``True`` was replaced by
        ``trust_source=True``.
    """
    from .model import Noise

    if rebuild:
        raise TypeError("load_model(rebuild=True) was replaced by load_model(trust_source=True), which imports and "
                        "calls the factory named in the file (runs code: only for files you made)")
    meta, arrays = read_archive(path, expected_format=FORMAT, max_version=FORMAT_VERSION)
    theta_vec = arrays["theta"].astype(float)
    noise = Noise(**{k: arrays.get(f"noise/{k}") for k in _NOISE_FIELDS})
    source, kwargs = meta.get("source"), meta.get("kwargs") or {}
    if meta["format_version"] < 2:
        if not trust_source:
            raise ModelFileError(f"{path}: written by an older ceem_casadi (format {meta['format_version']}) that "
                                 f"stored its model functions in CasADi's own serialisation, which can load compiled "
                                 f"code; refusing to load it. Load it with trust_source=True (CLI --trust-source) only "
                                 f"if you made the file, and save it again")
        try:
            f = ca.Function.deserialize(arrays["casadi/f"].tobytes().decode())
            g = ca.Function.deserialize(arrays["casadi/g"].tobytes().decode())
        except Exception as exc:  # CasADi raises RuntimeError on bad input
            raise ModelFileError(f"{path}: stored CasADi functions do not deserialise: {exc}") from None
        stored = SimpleNamespace(f=f, g=g)
    else:
        stored = _model_from_graphs(path, meta, arrays, noise, theta_vec)
    if trust_source and source:
        model = build_model(source, kwargs)
        if (model.nx, model.nu, model.ny) != (meta["nx"], meta["nu"], meta["ny"]) or \
                list(model.params.names) != meta["theta_names"]:
            raise ModelFileError(f"{path}: the model built by {source}({kwargs}) has sizes "
                                 f"(nx, nu, ny) = {(model.nx, model.nu, model.ny)} and parameters "
                                 f"{list(model.params.names)}, the file {(meta['nx'], meta['nu'], meta['ny'])} "
                                 f"and {meta['theta_names']}: the model source changed")
        if check_source and not (_same_function(model.f, stored.f, model.nx, model.nu, theta_vec.size, theta_vec)
                                 and _same_function(model.g, stored.g, model.nx, model.nu, theta_vec.size, theta_vec)):
            raise ModelFileError(f"{path}: the model built by {source} computes different values than the "
                                 f"saved one (the source changed since the file was written); load without "
                                 f"trust_source (CLI: drop --trust-source) to use the saved functions, or with "
                                 f"check_source=False to use the changed source anyway")
        model = model.with_noise(**{k: getattr(noise, k) for k in _NOISE_FIELDS})
    elif meta["format_version"] < 2:
        raise ModelFileError(f"{path}: a format-{meta['format_version']} file without a model source cannot be loaded")
    else:
        model = stored
    theta, off = {}, 0
    for name, shape in zip(meta["theta_names"], meta["theta_shapes"]):
        n = int(np.prod(shape, dtype=int))
        theta[name] = theta_vec[off:off + n].reshape(shape).copy()
        off += n
    extra = {k[len("extra/"):]: v for k, v in arrays.items() if k.startswith("extra/")}
    unc = meta.get("uncertainty")
    if unc is not None:
        unc = dict(unc, covariance=arrays.get("uncertainty/covariance"))
    return SavedModel(model, theta, source, kwargs, meta, extra, unc)
