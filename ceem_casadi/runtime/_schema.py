"""The one schema of the library's options: allowed values, field types, and the checks every option
dataclass runs in its ``__post_init__`` (and `CEEMOptions.from_mapping` on plain data)."""
from __future__ import annotations

import functools
import types
import typing
import warnings
from dataclasses import dataclass, fields

import numpy as np

from ..errors import OptionsError, ShapeError
from ._checks import is_integer

ACCELERATIONS = ("none", "squarem", "newton", "joint")
SMOOTHER_SOLVERS = ("ipopt", "banded", "batched")  # of the smoothing NLP (ceem_casadi.smoothing)
HESSIANS = ("gauss-newton", "exact")  # of the stage Functions (smoother, learner, uncertainty)


def renamed(**aliases):
    """Class decorator of an option dataclass: deprecated keywords ``old="new"`` (or ``old=fn`` updating the
    kwargs) mapped with a ``DeprecationWarning``; reading ``obj.old`` warns and returns the new field."""
    def decorate(cls):
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            for old, new in aliases.items():
                if old not in kwargs:
                    continue
                value = kwargs.pop(old)
                hint = f"use {new}=" if isinstance(new, str) else (new.__doc__ or "").strip()
                warnings.warn(f"{cls.__name__}({old}=...) is deprecated: {hint}", DeprecationWarning, stacklevel=2)
                if not isinstance(new, str):
                    new(value, kwargs)
                    continue
                if new in kwargs:
                    raise OptionsError(f"{cls.__name__}: give {new}= only ({old}= is its deprecated name), "
                                       f"got both ({old}={value!r}, {new}={kwargs[new]!r})")
                kwargs[new] = value
            init(self, *args, **kwargs)

        def alias(old, new):
            def get(self):
                warnings.warn(f"{cls.__name__}.{old} is deprecated: use .{new}", DeprecationWarning, stacklevel=2)
                return getattr(self, new)
            get.__doc__ = f"Deprecated name of ``{new}`` (reading it warns)."
            return property(get)

        cls.__init__ = __init__
        for old, new in aliases.items():
            if isinstance(new, str):
                setattr(cls, old, alias(old, new))
        cls.deprecated_aliases = dict(aliases)
        return cls
    return decorate


def require(cond: bool, msg: str) -> None:
    """Raise `OptionsError` (a ValueError) with ``msg`` unless ``cond``."""
    if not cond:
        raise OptionsError(msg)


def check_time_limit(value) -> None:
    """Raise `OptionsError` (a ValueError) unless ``value`` is None or a finite number of seconds > 0."""
    ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                           and np.isfinite(value) and value > 0)
    require(ok, f"time_limit must be None or a finite number of seconds > 0, got {value!r}")


# A field's kind comes from its annotation (``int``, ``float``, ``bool``, ``str``, ``X | None``, an
# options class); a field annotated ``object`` may name its kind in its metadata (``BOUND``).
BOUND = {"kind": "bound"}  # dataclasses.field(metadata=BOUND): a number (inf allowed) or a list of numbers
_EXPECT = {int: "an integer", float: "a finite number", str: "a string", bool: "true or false",
           "bound": "a number or a list of numbers"}


def is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def sample_time(dt, required: bool = False) -> float | None:
    """``dt`` (seconds) of a model or a record as a float, None kept unless ``required``; else `ShapeError`."""
    if (dt is None and required) or (dt is not None and not (is_number(dt) and np.isfinite(dt) and dt > 0)):
        raise ShapeError(f"dt must be a positive sample time in seconds (a number), got {dt!r}")
    return None if dt is None else float(dt)


def _is_bound(v) -> bool:
    if is_number(v):
        return not np.isnan(v)
    return (isinstance(v, (list, tuple, np.ndarray)) and len(v) > 0 and np.ndim(v) == 1
            and all(is_number(e) and not np.isnan(e) for e in v))


def _is_sequence(v) -> bool:
    return isinstance(v, (list, tuple, np.ndarray))


_ACCEPTS = {int: is_integer, float: lambda v: is_number(v) and bool(np.isfinite(v)),
            bool: lambda v: isinstance(v, (bool, np.bool_)), str: lambda v: isinstance(v, str),
            "bound": _is_bound, tuple: _is_sequence, list: _is_sequence}


@dataclass(frozen=True)
class FieldKind:
    """What a field of an option dataclass accepts: ``kind`` (int, float, str, bool, "bound",
    an options class, or None for anything) and whether None is allowed."""

    kind: object
    optional: bool

    def accepts(self, v) -> bool:
        if v is None:
            return self.optional or self.kind is None
        if self.kind is None:
            return True
        check = _ACCEPTS.get(self.kind)
        return check(v) if check is not None else isinstance(v, self.kind)

    @property
    def expected(self) -> str:
        if self.kind is None:
            return "any value"
        what = _EXPECT.get(self.kind) or f"a {getattr(self.kind, '__name__', self.kind)}"
        return f"None or {what}" if self.optional else what


@functools.cache
def field_kinds(cls) -> dict[str, FieldKind]:
    """The `FieldKind` of every field of the dataclass ``cls``, from its annotations (and
    ``metadata={"kind": ...}`` for ``object`` fields)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        hint = hints.get(f.name, object)
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
            else (hint,)
        optional = type(None) in args
        rest = [a for a in args if a is not type(None)]
        kind = rest[0] if len(rest) == 1 else None
        kind = typing.get_origin(kind) or kind  # tuple[float, ...] -> tuple
        if not (kind is None or kind == "bound" or isinstance(kind, type)):
            kind = None  # a type the schema cannot check (Literal, a protocol, ...): the dataclass checks it
        if kind is object:
            kind = f.metadata.get("kind")
            optional = True
        out[f.name] = FieldKind(kind, optional)
    return out


def type_error(prefix: str, name: str, kind: FieldKind, v) -> OptionsError:
    """The one message of a value of the wrong type (from the dataclass and from `typed_fields`)."""
    return OptionsError(f"option {prefix}{name} must be {kind.expected}, got {v!r} ({type(v).__name__})")


def check_fields(obj) -> None:
    """Raise `OptionsError` unless every field of the option dataclass ``obj`` has a value of its
    annotated type (called first in every option dataclass's ``__post_init__``)."""
    for name, kind in field_kinds(type(obj)).items():
        v = getattr(obj, name)
        if not kind.accepts(v):
            raise type_error(f"{type(obj).__name__}.", name, kind, v)


def check_bounds(lower, upper, what: str = "x_lower and x_upper") -> None:
    """Raise `OptionsError` unless ``lower <= upper`` entry-wise (None: unbounded; scalars broadcast)."""
    if lower is None or upper is None:
        return
    lo, hi = np.asarray(lower, float).ravel(), np.asarray(upper, float).ravel()
    require(lo.size == hi.size or 1 in (lo.size, hi.size),
            f"{what} must have the same length (or one be a scalar), got {lo.size} and {hi.size} entries")
    bad = np.flatnonzero(lo > hi)
    require(bad.size == 0, f"{what}: the lower bound must not exceed the upper bound, got lower {lower!r} > "
                           f"upper {upper!r} (entry {int(bad[0]) if bad.size else 0})")


def typed_fields(cls, mapping, prefix: str, exclude=()) -> dict:
    """Keyword arguments of ``cls`` from plain data (e.g. TOML), with the same type checks as
    `check_fields` and the key's full name in the message."""
    known = [f.name for f in fields(cls) if f.name not in exclude]
    kinds = field_kinds(cls)
    out = {}
    aliases = getattr(cls, "deprecated_aliases", {})
    for key, v in mapping.items():
        if isinstance(aliases.get(key), str):
            warnings.warn(f"option '{prefix}{key}' is deprecated: use '{prefix}{aliases[key]}'", DeprecationWarning,
                          stacklevel=2)
            key = aliases[key]
        elif key in aliases:  # mapped by the class itself
            out[key] = v
            continue
        if key not in known:
            raise OptionsError(f"unknown option '{prefix}{key}'; known: {sorted(known)}"
                             + (", tables smoother, learner" if exclude else ""))
        kind = kinds[key]
        if kind.kind in (int, float, str, bool, "bound"):
            if not kind.accepts(v):
                raise type_error(prefix, key, kind, v)
            out[key] = int(v) if kind.kind is int and v is not None else v
        else:  # an options table or an untyped field: its dataclass validates it
            out[key] = v
    return out
