"""What every result of the library shares: a short ``repr``, ``.to_dict()`` (plain JSON-able
data) and ``.table()`` (a plain-text table for a terminal or a log)."""
from __future__ import annotations

import dataclasses
import enum

import numpy as np


def plain(value):
    """``value`` as plain JSON-able data: arrays as nested lists, enums as their value, dataclasses
    and results as dicts, mappings and sequences element by element, other objects as ``str``."""
    if isinstance(value, Result):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return str(value)


def brief(value) -> str:
    """A few characters describing ``value``: numbers to 6 digits, arrays by shape, containers by size."""
    if isinstance(value, enum.Enum):
        return repr(value.value)
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.6g}"
    if isinstance(value, (bool, int, np.integer, np.bool_)) or value is None:
        return repr(value.item() if isinstance(value, np.generic) else value)
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, np.ndarray):
        return f"array{value.shape}" if value.size > 1 else brief(value.reshape(-1)[0]) if value.size else "array(0)"
    if isinstance(value, dict):
        return f"{{{len(value)} entries}}" if len(value) > 4 else "{" + ", ".join(
            f"{k}: {brief(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return f"[{len(value)} items]"
    return type(value).__name__


class Result:
    """Mixin of the library's result dataclasses (``@dataclass(repr=False)``): ``SUMMARY`` names the fields of the
    ``repr`` and of the default ``table()`` (empty: all); a natural table (parameters, metrics) overrides ``table``."""

    SUMMARY: tuple[str, ...] = ()

    def _summary(self) -> list[tuple[str, object]]:
        names = self.SUMMARY or tuple(f.name for f in dataclasses.fields(self))
        return [(n, getattr(self, n)) for n in names]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{k}={brief(v)}" for k, v in self._summary()) + ")"

    def to_dict(self) -> dict:
        """Every field as plain JSON-able data (arrays as nested lists, enums as values)."""
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def table(self) -> str:
        """A two-column plain-text table of the summary fields."""
        return format_table(["field", "value"], [[k, brief(v)] for k, v in self._summary()])


def format_table(header: list[str], rows: list[list]) -> str:
    """A plain-text table: left-aligned text, right-aligned numbers (6 significant digits)."""
    cells = [[c if isinstance(c, str) else f"{c:.6g}" if isinstance(c, (float, np.floating)) else str(c)
              for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    numeric = [bool(cells) and all(not isinstance(row[i], str) for row in rows) for i in range(len(header))]
    fmt = lambda row: "  ".join(c.rjust(w) if num else c.ljust(w)  # noqa: E731
                                 for c, w, num in zip(row, widths, numeric)).rstrip()
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in cells)])


def theta_rows(theta: dict) -> list[list]:
    """One row (name, value) per parameter entry: scalars as numbers, arrays entry by entry
    (``H[3,0]``) up to 12 entries, larger arrays by shape."""
    rows = []
    for name, value in theta.items():
        arr = np.asarray(value, float)
        if arr.size == 1:
            rows.append([name, float(arr.reshape(-1)[0])])
        elif arr.size <= 12:
            rows.extend([f"{name}[{','.join(map(str, idx))}]", float(arr[idx])] for idx in np.ndindex(arr.shape))
        else:
            rows.append([name, f"array{arr.shape}"])
    return rows
