"""The layout a model file must have, checked field by field before anything is built from it.

The archive's digest (`ceem_casadi.io._archive`) catches damage, not a forger who recomputes
it: a crafted file can hold any JSON and any numeric arrays. `check_model_file` checks the type, range and size of every metadata field and
array that [`load_model`][ceem_casadi.load_model] and the CLI read, so a crafted file is refused
with a one-line `ModelFileError` (a ``ValueError``) instead
of a ``KeyError``, ``TypeError`` or a wrong model. Sizes and nesting are bounded earlier, by the
archive reader (`ceem_casadi.io._limits`).
"""
from __future__ import annotations

import math

import numpy as np

from ..io._archive import ModelFileError
from ..runtime._schema import HESSIANS

MAX_NAME_CHARS = 200      # a parameter name, a model name
MAX_SOURCE_CHARS = 4096   # "path/to/file.py:factory"
MAX_DIMENSION = 100_000   # nx, nu, ny
MAX_NDIM = 4              # dimensions of one parameter


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool))


def check_model_file(path, meta: dict, arrays: dict) -> None:
    """Raise `ModelFileError` naming the first field of the
    model-file ``meta`` (JSON dict) or ``arrays`` (name -> array) that does not have the layout
    written by [`save_model`][ceem_casadi.save_model].

    Examples
    --------
    >>> import numpy as np
    >>> meta = {"format_version": 2, "nx": 1, "nu": 0, "ny": 1, "dt": None, "theta_names": ["a"],
    ...         "theta_shapes": [[]], "history": [{"iteration": 1, "J": 0.0, "theta": {"a": 0.5}}]}
    >>> check_model_file("m.npz", meta, {"theta": np.array([0.5])})
    >>> check_model_file("m.npz", {**meta, "theta_shapes": [[-1]]}, {"theta": np.array([0.5])})
    Traceback (most recent call last):
    ...
    ceem_casadi.io._archive.ModelFileError: m.npz: field 'theta_shapes' ... got [[-1]]; refusing to load it
    """
    def bad(field: str, expected: str, got) -> ModelFileError:
        text = repr(got)
        text = text if len(text) <= 80 else text[:80] + "..."
        return ModelFileError(f"{path}: field {field!r} of the model file: expected {expected}, got {text}; "
                              f"refusing to load it")

    version = meta.get("format_version")
    if not _is_int(version) or version < 1:
        raise bad("format_version", "an integer >= 1", version)
    for k in ("nx", "nu", "ny"):
        v = meta.get(k)
        low = 0 if k == "nu" else 1
        if not _is_int(v) or not low <= v <= MAX_DIMENSION:
            raise bad(k, f"an integer in [{low}, {MAX_DIMENSION}]", v)
    dt = meta.get("dt")
    if dt is not None and not (_is_number(dt) and math.isfinite(dt) and dt > 0):
        raise bad("dt", "a finite number > 0 or null", dt)
    for k in ("model_name", "source"):
        v = meta.get(k)
        limit = MAX_SOURCE_CHARS if k == "source" else MAX_NAME_CHARS
        if v is not None and not (isinstance(v, str) and len(v) <= limit):
            raise bad(k, f"a text of at most {limit} characters or null", v)
    for k in ("kwargs", "options", "data", "metadata", "uncertainty"):
        v = meta.get(k)
        if v is not None and not isinstance(v, dict):
            raise bad(k, "a JSON object or null", v)
    names, shapes = meta.get("theta_names"), meta.get("theta_shapes")
    if not (isinstance(names, list) and all(isinstance(n, str) and 0 < len(n) <= MAX_NAME_CHARS for n in names)
            and len(set(names)) == len(names)):
        raise bad("theta_names", "a list of distinct parameter names", names)
    if not (isinstance(shapes, list) and len(shapes) == len(names) and all(
            isinstance(s, list) and len(s) <= MAX_NDIM and all(_is_int(d) and d >= 0 for d in s) for s in shapes)):
        raise bad("theta_shapes", f"{len(names)} lists of at most {MAX_NDIM} integers >= 0 (one shape per name)",
                  shapes)
    if meta.get("params") is not None and not (isinstance(meta["params"], list)
                                               and all(isinstance(d, dict) for d in meta["params"])):
        raise bad("params", "a list of parameter declarations (objects) or null", meta["params"])
    size = sum(int(np.prod(s, dtype=int)) for s in shapes)
    theta = arrays.get("theta")
    if theta is None:
        raise ModelFileError(f"{path}: the model file holds no 'theta' array; refusing to load it")
    if theta.ndim != 1 or theta.size != size or theta.dtype.kind not in "iuf" or not np.all(np.isfinite(theta)):
        raise bad("theta (array)", f"{size} finite numbers (the sizes of theta_shapes)",
                  f"shape {theta.shape}, dtype {theta.dtype}")
    _check_history(path, meta.get("history"), set(names), bad)
    _check_uncertainty(meta.get("uncertainty"), arrays, bad)
    for name, a in arrays.items():
        if (name.startswith(("noise/", "extra/", "uncertainty/")) and a.dtype.kind not in "biuf") or \
                (name.startswith("noise/") and not np.all(np.isfinite(a))):
            raise bad(f"{name} (array)", "finite real numbers", f"dtype {a.dtype}")
    x0 = arrays.get("extra/x0")
    if x0 is not None and (x0.size == 0 or x0.size % meta["nx"] or x0.ndim > 2):
        raise bad("extra/x0 (array)", f"initial states of {meta['nx']} numbers, as (B, {meta['nx']})",
                  f"shape {x0.shape}")


def _check_history(path, history, names: set, bad) -> None:
    if history is None:
        return
    if not isinstance(history, list):
        raise bad("history", "a list of iteration records", history)
    for i, rec in enumerate(history):
        if not isinstance(rec, dict):
            raise bad(f"history[{i}]", "an iteration record (object)", rec)
        if not _is_int(rec.get("iteration")):
            raise bad(f"history[{i}].iteration", "an integer", rec.get("iteration"))
        J = rec.get("J")
        if J is not None and not _is_number(J):
            raise bad(f"history[{i}].J", "a number", J)
        theta = rec.get("theta")
        if theta is not None and not (isinstance(theta, dict) and set(theta) <= names and all(
                _is_number(v) or isinstance(v, list) for v in theta.values())):
            raise bad(f"history[{i}].theta", "an object of numbers by parameter name", theta)


def _check_uncertainty(unc, arrays: dict, bad) -> None:
    if unc is None:
        return
    names = unc.get("names")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise bad("uncertainty.names", "a list of parameter entry names", names)
    n = len(names)
    hessian = unc.get("hessian")  # every field evaluate and validation_report read is present and typed
    if hessian not in HESSIANS:
        raise bad("uncertainty.hessian", f"one of {HESSIANS} (how the covariance was computed)", hessian)
    level = unc.get("level")
    if level is not None and not (_is_number(level) and 0 < level < 1):
        raise bad("uncertainty.level", "a number in (0, 1) or null", level)
    for k in ("estimate", "std_error", "lower", "upper"):
        v = unc.get(k)
        required = k in ("estimate", "std_error")
        if (v is None and required) or (v is not None and not (
                isinstance(v, list) and len(v) == n and all(_is_number(e) or (e is None and not required) for e in v))):
            raise bad(f"uncertainty.{k}", f"a list of {n} numbers", v)
    warnings = unc.get("warnings", [])
    if not (isinstance(warnings, list) and all(isinstance(w, str) for w in warnings)):
        raise bad("uncertainty.warnings", "a list of texts", warnings)
    cov = arrays.get("uncertainty/covariance")
    if cov is not None and cov.shape != (n, n):
        raise bad("uncertainty/covariance (array)", f"shape ({n}, {n})", f"shape {cov.shape}")


__all__ = ["check_model_file"]
