"""Save and load identified models: an integrity-checked ``.npz`` of JSON metadata and numeric arrays, never pickle
or code, the model rebuilt from stored expression graphs (docs/usage_cli.md, "Model files")."""
from __future__ import annotations

import datetime as _dt
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import casadi as ca
import numpy as np

from ..errors import CeemError
from ..io._archive import ModelFileError, read_archive, record_dict, to_jsonable, write_archive
from ..io._limits import MAX_GRAPH_INSTRUCTIONS, MAX_HISTORY_RECORDS
from ..model import _sxgraph as sxgraph
from ..model._source import ModelSourceError, build_model, is_file_ref, load_factory  # noqa: F401 (re-exported)
from ..runtime._result import Result
from ._modelfile_checks import check_model_file

log = logging.getLogger(__name__)

FORMAT = "ceem_casadi.model"
FORMAT_VERSION = 2
_NOISE_FIELDS = ("process_std", "measurement_std", "x1_mean", "x1_std")


@dataclass(repr=False)
class SavedModel(Result):
    """An identified model loaded from a file.

    Attributes
    ----------
    model : StateSpaceModel
        Rebuilt from the stored expression graphs (or by its factory), with the saved noise.
    theta : dict
        Parameters, name -> array.
    source, kwargs : str or None, dict
        The model factory ``"package.module:factory"`` and its keyword arguments.
    meta : dict
        The whole JSON metadata (options, data, history, versions, user metadata).
    extra : dict of str to numpy.ndarray
        User arrays saved with the model.
    uncertainty : dict or None
        Saved parameter uncertainty (JSON fields and the ``"covariance"`` array).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> import tempfile, pathlib
    >>> path = cc.save_model(pathlib.Path(tempfile.mkdtemp()) / "m.npz", model, {"a": 0.8})
    >>> saved = cc.load_model(path)
    >>> float(saved.theta["a"]), saved.model.nx
    (0.8, 1)
    """

    SUMMARY = ('theta', 'source')

    model: object
    theta: dict
    source: str | None
    kwargs: dict
    meta: dict
    extra: dict = field(default_factory=dict)
    uncertainty: dict | None = None

    @property
    def theta_vector(self) -> np.ndarray:
        """(n_p,) flat parameter vector."""
        return np.concatenate([np.ravel(self.theta[n]) for n in self.meta["theta_names"]]) \
            if self.theta else np.zeros(0)

    @property
    def history(self) -> list:
        """The fit's iteration records, as dicts of [`IterationRecord`][ceem_casadi.em.IterationRecord] fields."""
        return [record_dict(h) for h in self.meta.get("history", [])]

    def predict(self, y, u=None, *, x0=None, Sigma0=None, Q=None, R=None, engine: str = "python"):
        """EKF one-step predictions (a `FilterResult`) on one trajectory: ``y`` (T, ny) (NaN = missing), ``u``
        (T, nu); ``x0`` (nx,) defaults to the saved ``extra['x0']``, else ``x1_mean``, else zeros; the rest as
        in [`validation_report`][ceem_casadi.validation_report]."""
        from ..filtering import EKF
        from ..filtering._result import ekf_settings

        given = x0
        x0, Sigma0, Q, R = ekf_settings(self.model, self.extra.get("x0") if x0 is None else x0, Sigma0, Q, R)
        x0 = np.asarray(x0, float).reshape(-1, self.model.nx)[0] if given is None else x0
        return EKF(self.model).run(self.theta_vector, y, u, x0=x0, Sigma0=Sigma0, Q=Q, R=R, engine=engine)


def save_model(path, model, theta, *, source: str | None = None, kwargs: dict | None = None,
               options=None, data: dict | None = None, history=None, extra: dict | None = None,
               metadata: dict | None = None, uncertainty=None) -> Path:
    """Write an identified model to ``path`` (``.npz``; written atomically).

    Parameters
    ----------
    path : str or pathlib.Path
    model : StateSpaceModel
        With its noise settings.
    theta : dict
        Identified parameters, name -> array.
    source, kwargs : str, dict, optional
        ``"package.module:factory"`` and its JSON keyword arguments, used only by ``trust_source=True``.
    options : dataclass or dict, optional
        Fit options (e.g. a [`CEEMOptions`][ceem_casadi.CEEMOptions]).
    data, metadata : dict, optional
        JSON-able description of the training data, and free-form user metadata.
    history : list of IterationRecord or dict, optional
        The fit's iterations.
    extra : dict of str to numpy.ndarray, optional
        Numeric arrays to keep with the model (e.g. ``{"x0": (B, nx)}`` initial states).
    uncertainty : ParameterUncertainty, optional
        Parameter uncertainty of the fit.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    ModelFileError
        The model's functions cannot be stored as expression graphs.

    Examples
    --------
    Save a model with its parameters and read it back (nothing in the file is executed):

    >>> import tempfile, pathlib
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> path = cc.save_model(pathlib.Path(tempfile.mkdtemp()) / "m.npz", model, {"a": 0.8})
    >>> saved = cc.load_model(path)
    >>> float(saved.theta["a"]), float(saved.model.f(2.0, 1.0, 0.8))
    (0.8, 2.6)
    """
    from .._version import __version__

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
        "data": to_jsonable(data or {}), "history": _kept_history(history),
        "metadata": to_jsonable(metadata or {})}
    meta["params"] = _param_spec(model.params) if hasattr(model.params, "validate") else None
    try:
        arrays = {"theta": theta_vec, **sxgraph.to_arrays("sx/f", model.f), **sxgraph.to_arrays("sx/g", model.g)}
        if getattr(model, "rhs", None) is not None:
            arrays.update(sxgraph.to_arrays("sx/rhs", model.rhs))
    except sxgraph.GraphError as exc:
        raise ModelFileError(f"cannot save the model: {exc}") from None
    for name, a in arrays.items():  # a file its own reader would refuse is not written (io/_limits.py)
        if name.endswith("/code") and len(a) > MAX_GRAPH_INSTRUCTIONS:
            raise ModelFileError(f"cannot save the model: {name[:-5]} has {len(a)} instructions, more than the "
                                 f"limit of {MAX_GRAPH_INSTRUCTIONS} a model file may hold")
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


def _kept_history(history) -> list[dict]:
    """The last ``MAX_HISTORY_RECORDS`` iteration records (the reader's limit), with a warning when older ones are
    dropped."""
    history = list(history or [])
    if len(history) > MAX_HISTORY_RECORDS:
        log.warning("save_model: keeping the last %d of %d iteration records (the limit of a model file)",
                    MAX_HISTORY_RECORDS, len(history))
        history = history[-MAX_HISTORY_RECORDS:]
    return [record_dict(h) for h in history]


def _same_function(a: ca.Function, b: ca.Function, nx: int, nu: int, theta_vec) -> bool:
    """Whether ``a`` and ``b`` of (x, u, p) agree to 1e-12 at two seeded random points near ``theta_vec``."""
    rng = np.random.default_rng(0)
    for scale in (0.5, 2.0):
        args = (scale * rng.standard_normal(nx), scale * rng.standard_normal(nu),
                theta_vec * (1 + 0.01 * rng.standard_normal(theta_vec.size)))
        va, vb = np.asarray(a(*args)), np.asarray(b(*args))
        if va.shape != vb.shape or not np.allclose(va, vb, rtol=1e-12, atol=1e-12, equal_nan=True):
            return False
    return True


def _split_theta(meta: dict, theta_vec: np.ndarray) -> dict:
    """Name -> array (copies, of the stored shapes) of the flat ``theta_vec`` (n_p,)."""
    sizes = [int(np.prod(shape, dtype=int)) for shape in meta["theta_shapes"]]
    return {name: part.reshape(shape).copy() for name, shape, part in
            zip(meta["theta_names"], meta["theta_shapes"], np.split(theta_vec, np.cumsum(sizes)[:-1]))}


def _param_spec(params) -> list[dict]:
    """JSON-able declarations of a [`Parameters`][ceem_casadi.Parameters] (values, bounds, masks, priors)."""
    keys = ("value", "lower", "upper", "free", "prior_mean", "prior_std")
    return [{"name": p.name, "shape": list(p.shape), **{k: to_jsonable(p.array(k)) for k in keys}} for p in params]


def _params_from_spec(spec, meta: dict, theta_vec: np.ndarray):
    """Parameters of the stored declarations (or, without them, unbounded ones at the saved theta)."""
    from ..model._params import Param, Parameters

    if spec is None:
        spec = [{"name": name, "shape": list(np.shape(value)), "value": value}
                for name, value in _split_theta(meta, theta_vec).items()]
    params = Parameters(*[Param(d["name"], **{k: (np.asarray(v, float) if k != "free" else np.asarray(v, bool))
                                              for k, v in d.items() if k not in ("name", "shape") and v is not None},
                                shape=tuple(d["shape"])) for d in spec])
    if params.names != list(meta["theta_names"]) or params.size != theta_vec.size:
        raise ModelFileError(f"parameter declarations {params.names} do not match theta {meta['theta_names']}")
    return params


def _model_from_graphs(path, meta: dict, arrays: dict, noise, theta_vec):
    """StateSpaceModel from the stored expression graphs: no import, no deserialiser, no code."""
    from ..model._model import StateSpaceModel

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
    """Read a model file written by [`save_model`][ceem_casadi.save_model] (integrity-checked); nothing in the
    file is executed unless ``trust_source`` (docs/usage_cli.md, "Model files").

    Parameters
    ----------
    path : str or pathlib.Path
    trust_source : bool
        Import and call the factory named in the file to rebuild the model. This RUNS CODE named by the file:
        only for files you made. Needed for files of format 1.
    check_source : bool
        With ``trust_source``, raise `ModelFileError` when the factory's ``f``, ``g`` differ from the stored ones.
    rebuild : bool, optional
        Deprecated (``True``: use ``trust_source=True``).

    Returns
    -------
    SavedModel

    Raises
    ------
    ModelFileError
        A damaged or foreign file (digest mismatch, wrong format), or invalid stored graphs.

    Examples
    --------
    Save a model with its parameters and read it back (nothing in the file is executed):

    >>> import tempfile, pathlib
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> path = cc.save_model(pathlib.Path(tempfile.mkdtemp()) / "m.npz", model, {"a": 0.8})
    >>> saved = cc.load_model(path)
    >>> float(saved.theta["a"]), float(saved.model.f(2.0, 1.0, 0.8))
    (0.8, 2.6)
    """
    from ..model._model import Noise

    if rebuild:
        raise TypeError("load_model(rebuild=True) was replaced by load_model(trust_source=True), which imports and "
                        "calls the factory named in the file (runs code: only for files you made)")
    meta, arrays = read_archive(path, expected_format=FORMAT, max_version=FORMAT_VERSION)
    check_model_file(path, meta, arrays)  # every field's type, range and size (a forger recomputes the digest)
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
        log.warning("%s: trust_source: importing and calling the model factory %s named in the file (this runs "
                    "its code)", path, source)
        model = build_model(source, kwargs)
        if (model.nx, model.nu, model.ny) != (meta["nx"], meta["nu"], meta["ny"]) or \
                list(model.params.names) != meta["theta_names"]:
            raise ModelFileError(f"{path}: the model built by {source}({kwargs}) has sizes "
                                 f"(nx, nu, ny) = {(model.nx, model.nu, model.ny)} and parameters "
                                 f"{list(model.params.names)}, the file {(meta['nx'], meta['nu'], meta['ny'])} "
                                 f"and {meta['theta_names']}: the model source changed")
        if check_source and not all(_same_function(getattr(model, k), getattr(stored, k), model.nx, model.nu, theta_vec)
                                    for k in ("f", "g")):
            raise ModelFileError(f"{path}: the model built by {source} computes different values than the "
                                 f"saved one (the source changed since the file was written); load without "
                                 f"trust_source (CLI: drop --trust-source) to use the saved functions, or with "
                                 f"check_source=False to use the changed source anyway")
        model = model.with_noise(**{k: getattr(noise, k) for k in _NOISE_FIELDS})
    elif meta["format_version"] < 2:
        raise ModelFileError(f"{path}: a format-{meta['format_version']} file without a model source cannot be loaded")
    else:
        model = stored
    theta = _split_theta(meta, theta_vec)
    extra = {k[len("extra/"):]: v for k, v in arrays.items() if k.startswith("extra/")}
    unc = meta.get("uncertainty")
    if unc is not None:
        unc = dict(unc, covariance=arrays.get("uncertainty/covariance"))
    return SavedModel(model, theta, source, kwargs, meta, extra, unc)
