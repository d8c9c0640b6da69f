"""The one schema of the library's options: allowed values, field types, and the checks every
option dataclass runs in its ``__post_init__`` (and [`CEEMOptions.from_mapping`][ceem_casadi.CEEMOptions.from_mapping] on plain data)."""
from __future__ import annotations

from dataclasses import fields

import numpy as np

from ..errors import OptionsError

ACCELERATIONS = ("none", "squarem", "newton", "joint")
SMOOTHER_SOLVERS = ("ipopt", "banded")  # of the smoothing NLP (ceem_casadi.smoothing)
HESSIANS = ("gauss-newton", "exact")  # of the stage Functions (smoother, learner, uncertainty)


def require(cond: bool, msg: str) -> None:
    """Raise `OptionsError` (a ValueError) with ``msg`` unless ``cond``."""
    if not cond:
        raise OptionsError(msg)


def check_time_limit(value) -> None:
    """Raise `OptionsError` (a ValueError) unless ``value`` is None or a finite number of seconds > 0."""
    ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                           and np.isfinite(value) and value > 0)
    require(ok, f"time_limit must be None or a finite number of seconds > 0, got {value!r}")


_KINDS = {"max_iters": "int", "n_jobs": "int", "max_iter": "int", "blas_threads": "int?", "tol": "float",
          "rho_x": "float", "rho_theta": "float", "hessian": "str", "acceleration": "str", "joint_hessian": "str",
          "use_prior": "bool", "raise_on_failure": "bool", "compile": "bool?", "chunk": "int?", "solver": "str?",
          "x_lower": "bound",
          "x_upper": "bound"}
_EXPECT = {"int": "an integer", "int?": "an integer", "float": "a finite number", "str": "a string",
           "str?": "a string",
           "bool": "true or false", "bool?": "true or false", "bound": "a number or a list of numbers"}


def is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def typed_fields(cls, mapping, prefix: str, exclude=()) -> dict:
    known = [f.name for f in fields(cls) if f.name not in exclude]
    out = {}
    for key, v in mapping.items():
        if key not in known:
            raise OptionsError(f"unknown option '{prefix}{key}'; known: {sorted(known)}"
                             + (", tables smoother, learner" if exclude else ""))
        kind = _KINDS.get(key)
        if kind is None:  # a field without a declared kind: its dataclass validates it
            out[key] = v
            continue
        if kind.endswith("?") and v is None:
            ok = True
        elif kind.startswith("int"):
            ok = is_number(v) and float(v).is_integer() and not isinstance(v, (float, np.floating))
        elif kind == "float":
            ok = is_number(v) and bool(np.isfinite(v))
        elif kind.startswith("str"):
            ok = isinstance(v, str)
        elif kind.startswith("bool"):
            ok = isinstance(v, (bool, np.bool_))
        else:  # bound: a number (inf allowed) or a flat list of numbers
            ok = (is_number(v) and not np.isnan(v)) or (isinstance(v, (list, tuple)) and len(v) > 0 and all(
                is_number(e) and not np.isnan(e) for e in v))
        if not ok:
            raise OptionsError(f"option {prefix}{key} must be {_EXPECT[kind]}, got {v!r} ({type(v).__name__})")
        out[key] = int(v) if kind.startswith("int") and v is not None else v
    return out
