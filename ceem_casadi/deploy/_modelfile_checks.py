"""The layout a model file must have, checked field by field before anything is built from it: a crafted file is
refused with a one-line `ModelFileError` naming the field (docs/usage_cli.md, "Limits on inputs")."""
from __future__ import annotations

import math

import numpy as np

from ..io._archive import ModelFileError
from ..runtime._checks import is_integer
from ..runtime._schema import HESSIANS

MAX_NAME_CHARS = 200      # a parameter name, a model name
MAX_SOURCE_CHARS = 4096   # "path/to/file.py:factory"
MAX_DIMENSION = 100_000   # nx, nu, ny
MAX_NDIM = 4              # dimensions of one parameter


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool))


# (field, what it must be ({n}: the number of parameter names), test of (value, meta)), checked in order
FIELDS = (
    ("format_version", "an integer >= 1", lambda v, meta: is_integer(v) and v >= 1),
    *((k, f"an integer in [{low}, {MAX_DIMENSION}]", lambda v, meta, lo=low: is_integer(v) and lo <= v <= MAX_DIMENSION)
      for k, low in (("nx", 1), ("nu", 0), ("ny", 1))),
    ("dt", "a finite number > 0 or null", lambda v, meta: v is None or (_is_number(v) and math.isfinite(v) and v > 0)),
    *((k, f"a text of at most {limit} characters or null",
       lambda v, meta, limit=limit: v is None or (isinstance(v, str) and len(v) <= limit))
      for k, limit in (("model_name", MAX_NAME_CHARS), ("source", MAX_SOURCE_CHARS))),
    *((k, "a JSON object or null", lambda v, meta: v is None or isinstance(v, dict))
      for k in ("kwargs", "options", "data", "metadata", "uncertainty")),
    ("theta_names", "a list of distinct parameter names", lambda v, meta: isinstance(v, list) and all(
        isinstance(n, str) and 0 < len(n) <= MAX_NAME_CHARS for n in v) and len(set(v)) == len(v)),
    ("theta_shapes", f"{{n}} lists of at most {MAX_NDIM} integers >= 0 (one shape per name)",
     lambda v, meta: isinstance(v, list) and len(v) == len(meta["theta_names"]) and all(
         isinstance(s, list) and len(s) <= MAX_NDIM and all(is_integer(d) and d >= 0 for d in s) for s in v)),
    ("params", "a list of parameter declarations (objects) or null",
     lambda v, meta: v is None or (isinstance(v, list) and all(isinstance(d, dict) for d in v))))
# one iteration record of "history": (field, what it must be, test of (value, parameter names))
RECORD_FIELDS = (
    ("iteration", "an integer", lambda v, names: is_integer(v)),
    ("J", "a number", lambda v, names: v is None or _is_number(v)),
    ("theta", "an object of numbers by parameter name", lambda v, names: v is None or (
        isinstance(v, dict) and set(v) <= names and all(_is_number(e) or isinstance(e, list) for e in v.values()))),
)


def _numbers(n: int, required: bool):
    return lambda v: (v is None and not required) or (
        isinstance(v, list) and len(v) == n and all(_is_number(e) or (e is None and not required) for e in v))


def _uncertainty_fields(n: int) -> tuple:
    """(field, what it must be, test of the value) of the JSON block "uncertainty" with ``n`` names:
    every field `evaluate` and `validation_report` read is present and typed."""
    return (
        ("hessian", f"one of {HESSIANS} (how the covariance was computed)", lambda v: v in HESSIANS),
        ("level", "a number in (0, 1) or null", lambda v: v is None or (_is_number(v) and 0 < v < 1)),
        *((k, f"a list of {n} numbers", _numbers(n, k in ("estimate", "std_error")))
          for k in ("estimate", "std_error", "lower", "upper")),
        ("warnings", "a list of texts", lambda v: isinstance(v, list) and all(isinstance(w, str) for w in v)))


def check_model_file(path, meta: dict, arrays: dict) -> None:
    """Raise `ModelFileError` naming the first field of the model-file ``meta`` (JSON dict) or ``arrays``
    (name -> array) that does not have the layout written by [`save_model`][ceem_casadi.save_model]."""
    def bad(field: str, expected: str, got) -> ModelFileError:
        text = repr(got)
        text = text if len(text) <= 80 else text[:80] + "..."
        return ModelFileError(f"{path}: field {field!r} of the model file: expected {expected}, got {text}; "
                              f"refusing to load it")

    for key, expected, ok in FIELDS:
        if not ok(meta.get(key), meta):
            raise bad(key, expected.format(n=len(meta["theta_names"]) if key == "theta_shapes" else 0), meta.get(key))
    size = sum(int(np.prod(s, dtype=int)) for s in meta["theta_shapes"])
    theta = arrays.get("theta")
    if theta is None:
        raise ModelFileError(f"{path}: the model file holds no 'theta' array; refusing to load it")
    if theta.ndim != 1 or theta.size != size or theta.dtype.kind not in "iuf" or not np.all(np.isfinite(theta)):
        raise bad("theta (array)", f"{size} finite numbers (the sizes of theta_shapes)",
                  f"shape {theta.shape}, dtype {theta.dtype}")
    _check_history(meta.get("history"), set(meta["theta_names"]), bad)
    _check_uncertainty(meta.get("uncertainty"), arrays, bad)
    _check_arrays(arrays, meta["nx"], bad)


def _check_history(history, names: set, bad) -> None:
    """Every record of the iteration history: an object whose `RECORD_FIELDS` pass."""
    if history is not None and not isinstance(history, list):
        raise bad("history", "a list of iteration records", history)
    for i, rec in enumerate(history or []):
        if not isinstance(rec, dict):
            raise bad(f"history[{i}]", "an iteration record (object)", rec)
        for key, expected, ok in RECORD_FIELDS:
            if not ok(rec.get(key), names):
                raise bad(f"history[{i}].{key}", expected, rec.get(key))


def _check_uncertainty(unc, arrays: dict, bad) -> None:
    """The JSON block "uncertainty" and the (n, n) array ``uncertainty/covariance``."""
    if unc is None:
        return
    names = unc.get("names")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise bad("uncertainty.names", "a list of parameter entry names", names)
    n = len(names)
    for key, expected, ok in _uncertainty_fields(n):
        value = unc.get(key, [] if key == "warnings" else None)
        if not ok(value):
            raise bad(f"uncertainty.{key}", expected, value)
    cov = arrays.get("uncertainty/covariance")
    if cov is not None and cov.shape != (n, n):
        raise bad("uncertainty/covariance (array)", f"shape ({n}, {n})", f"shape {cov.shape}")


def _check_arrays(arrays: dict, nx: int, bad) -> None:
    """Real numbers in noise/, extra/ and uncertainty/ (finite in noise/); ``extra/x0`` as (B, nx)."""
    for name, a in arrays.items():
        if (name.startswith(("noise/", "extra/", "uncertainty/")) and a.dtype.kind not in "biuf") or \
                (name.startswith("noise/") and not np.all(np.isfinite(a))):
            raise bad(f"{name} (array)", "finite real numbers", f"dtype {a.dtype}")
    x0 = arrays.get("extra/x0")
    if x0 is not None and (x0.size == 0 or x0.size % nx or x0.ndim > 2):
        raise bad("extra/x0 (array)", f"initial states of {nx} numbers, as (B, {nx})", f"shape {x0.shape}")


__all__ = ["check_model_file"]
