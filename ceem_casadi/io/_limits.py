"""The resource policy: size and nesting limits on what is read from files and command lines, checked before
anything is parsed or allocated (`InputLimitError`); the table of limits: docs/usage_cli.md ("Limits on inputs")."""
from __future__ import annotations

import io
import json
import os
import re
import zipfile

import numpy as np

from ..errors import CeemError

MAX_NESTING = 64
MAX_TEXT_BYTES = 16 * 2 ** 20
MAX_STRING_CHARS = 10_000
MAX_ARCHIVE_MB = 512
MAX_ARCHIVE_ENTRIES = 100_000
MAX_GRAPH_INSTRUCTIONS = 1_000_000
MAX_HISTORY_RECORDS = 10_000
MAX_DATA_MB = 4096
NUMERIC_KINDS = "biufc"  # bool, int, unsigned, float, complex: no objects, strings or records


class InputLimitError(CeemError, ValueError):
    """A file or text exceeds a size or nesting limit, or declares an array that may not be read
    (too large, not numeric); nothing past the limit was allocated or parsed.

    Examples
    --------
    >>> from ceem_casadi.io import InputLimitError
    >>> issubclass(InputLimitError, ValueError)
    True
    """


def _mib_from_env(name: str, default_mb: int) -> int:
    env = os.environ.get(name)
    if not env:
        return default_mb * 2 ** 20
    try:
        mb = float(env)
    except ValueError:
        raise InputLimitError(f"${name}: expected a number of MiB > 0, got {env!r}") from None
    if not mb > 0:
        raise InputLimitError(f"${name}: expected a number of MiB > 0, got {env!r}")
    return int(mb * 2 ** 20)


def max_archive_bytes() -> int:
    """Largest array, and largest sum of arrays, of one archive (bytes): ``$CEEM_MAX_ARCHIVE_MB`` MiB, default
    ``MAX_ARCHIVE_MB``."""
    return _mib_from_env("CEEM_MAX_ARCHIVE_MB", MAX_ARCHIVE_MB)


def max_data_bytes() -> int:
    """Largest data file (bytes; for ``.npz`` its arrays uncompressed): ``$CEEM_MAX_DATA_MB`` MiB, default
    ``MAX_DATA_MB``."""
    return _mib_from_env("CEEM_MAX_DATA_MB", MAX_DATA_MB)


def check_file_size(path, what: str, limit: int, env: str | None = "CEEM_MAX_ARCHIVE_MB") -> int:
    """Size in bytes of the file ``path`` (``os.stat``, nothing read); `InputLimitError` above ``limit`` bytes."""
    size = os.stat(path).st_size
    if size > limit:
        advice = f" (raise ${env} only for a file you trust)" if env else ""  # the variable that raises the limit
        raise InputLimitError(f"{what}: a file of {size} bytes, more than the limit of {limit} bytes; refusing to "
                              f"read it{advice}")
    return size


def read_text_file(path, what: str, max_chars: int = MAX_TEXT_BYTES) -> str:
    """The text of the file ``path`` after `check_file_size` (at most ``max_chars`` bytes)."""
    check_file_size(path, what, max_chars, env=None)  # no override of the text limit
    with open(path, encoding="utf-8") as fh:
        return fh.read(max_chars + 1)


def check_records(records, what: str, limit: int = MAX_HISTORY_RECORDS) -> None:
    """`InputLimitError` when the list ``records`` (e.g. an iteration history) holds more than ``limit`` entries."""
    if isinstance(records, list) and len(records) > limit:
        raise InputLimitError(f"{what}: {len(records)} records, more than the limit of {limit}")


_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_JSON_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
# TOML strings (multi-line ones first; an unterminated one runs to its end) and comments: brackets there do not count
_TOML_SKIP = re.compile(r'"""(?:[^\\]|\\(?:.|\Z))*?(?:"""|\Z)|\'\'\'.*?(?:\'\'\'|\Z)'
                        r'|"(?:[^"\\\n]|\\[^\n])*"?|\'[^\'\n]*\'?|#[^\n]*', re.S)


def nesting_depth(text: str, *, toml: bool = False) -> int:
    """Most ``[`` / ``{`` open at once in JSON (TOML with ``toml``) ``text``, outside strings and comments."""
    brackets = _NOT_BRACKET.sub("", (_TOML_SKIP if toml else _JSON_STRING).sub("", text)).encode()
    if not brackets:
        return 0
    steps = np.where(np.isin(np.frombuffer(brackets, np.uint8), (ord("["), ord("{"))), 1, -1)
    walk = np.cumsum(steps)
    return int(np.max(walk - np.minimum(np.minimum.accumulate(walk), 0)))  # the walk held at 0


def check_text(text: str, what: str, *, toml: bool = False, max_chars: int = MAX_TEXT_BYTES) -> str:
    """``text`` unless it is longer than ``max_chars`` or nests deeper than ``MAX_NESTING``."""
    if len(text) > max_chars:
        raise InputLimitError(f"{what}: {len(text)} characters, more than the limit of {max_chars}")
    if nesting_depth(text, toml=toml) > MAX_NESTING:
        raise InputLimitError(f"{what}: nested more than {MAX_NESTING} levels deep (lists/objects inside each "
                              f"other); expected plain values, lists of numbers and shallow objects")
    return text


def loads_json(text: str, what: str, max_chars: int = MAX_TEXT_BYTES):
    """``json.loads`` of ``text`` after `check_text` (``InputLimitError`` past the limits; the parser's
    ``ValueError`` for bad JSON)."""
    check_text(text, what, max_chars=max_chars)
    try:
        return json.loads(text)
    except RecursionError:  # a parser deeper than the checked bound would need: never a traceback
        raise InputLimitError(f"{what}: nested too deeply to parse") from None


def check_strings(obj, what: str, max_chars: int = MAX_STRING_CHARS) -> None:
    """Raise when a string (value or key) anywhere in the JSON value ``obj`` is longer than
    ``max_chars`` (``obj`` nests at most ``MAX_NESTING`` levels: it was parsed by `loads_json`)."""
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if len(v) > max_chars:
                raise InputLimitError(f"{what}: a text of {len(v)} characters ({v[:40]!r}...), more than the "
                                      f"limit of {max_chars}")
        elif isinstance(v, dict):
            stack.extend([*v.keys(), *v.values()])
        elif isinstance(v, list):
            stack.extend(v)


def check_npz(raw, what: str, max_bytes: int | None = None, max_rows: dict | None = None) -> dict:
    """``{name: (shape, dtype)}`` of the ``.npy`` members of the ``.npz`` ``raw`` (bytes or a path), from the headers
    alone: numeric, at most ``max_bytes`` (default `max_archive_bytes`) each and together, ``MAX_ARCHIVE_ENTRIES``
    members, ``max_rows[suffix]`` rows of a member named ``...suffix``; `InputLimitError` before any allocation."""
    limit = max_archive_bytes() if max_bytes is None else int(max_bytes)
    headers = {}
    try:
        zf = zipfile.ZipFile(io.BytesIO(raw) if isinstance(raw, (bytes, bytearray, memoryview)) else raw)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise InputLimitError(f"{what}: not a readable .npz archive ({exc})") from None
    total = 0
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_ARCHIVE_ENTRIES:
            raise InputLimitError(f"{what}: {len(infos)} arrays, more than the limit of {MAX_ARCHIVE_ENTRIES}")
        for info in infos:
            name = info.filename
            if not name.endswith(".npy"):
                raise InputLimitError(f"{what}: member {name[:80]!r} is not a .npy array")
            shape, dtype = _member_header(zf, info, what, max_rows)
            headers[name[:-4]] = (shape, dtype)
            nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
            total += nbytes
            if nbytes > limit or total > limit:
                raise InputLimitError(
                    f"{what}: array {name[:80]!r} of shape {shape} and dtype {dtype} ({nbytes / 2 ** 20:.1f} MiB"
                    f"{'' if nbytes > limit else f', {total / 2 ** 20:.1f} MiB with the arrays before it'}) exceeds "
                    f"the limit of {limit / 2 ** 20:.0f} MiB; refusing to load it (raise $CEEM_MAX_ARCHIVE_MB only "
                    f"for a file you trust)")
    return headers


def _member_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, what: str, max_rows: dict | None):
    """``(shape, dtype)`` of one ``.npy`` member, from its header alone, checked as in `check_npz`."""
    name = info.filename
    try:
        with zf.open(info) as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version in ((2, 0), (3, 0)):
                shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unknown .npy version {version}")
    except Exception as exc:  # any header the reader rejects is a bad file
        raise InputLimitError(f"{what}: array {name[:80]!r} has no readable .npy header "
                              f"({type(exc).__name__}: {exc})") from None
    if dtype.hasobject or dtype.kind not in NUMERIC_KINDS or dtype.fields is not None:
        raise InputLimitError(f"{what}: array {name[:80]!r} has dtype {dtype}; only numeric arrays are read")
    if not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InputLimitError(f"{what}: array {name[:80]!r} declares shape {shape}")
    for suffix, rows in (max_rows or {}).items():
        if name[:-4].endswith(suffix) and shape and shape[0] > rows:
            raise InputLimitError(f"{what}: array {name[:80]!r} holds {shape[0]} rows (expression-graph "
                                  f"instructions), more than the limit of {rows}; refusing to build it")
    return shape, dtype


__all__ = ["InputLimitError", "MAX_GRAPH_INSTRUCTIONS", "MAX_HISTORY_RECORDS", "MAX_NESTING", "MAX_STRING_CHARS",
           "MAX_TEXT_BYTES", "check_file_size", "check_npz", "check_records", "check_strings", "check_text",
           "loads_json", "max_archive_bytes", "max_data_bytes", "nesting_depth", "read_text_file"]
