"""What the compile cache trusts (a record binding key, Function name and SHA-256; the values at one random
point; a library loaded from its exact path), how it removes build folders of dead processes and evicts the least
recently used libraries beyond its bound (docs/runtime.md, "The cache" and "The bound")."""
from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import logging
import os
import re
import shutil
import time
from pathlib import Path

import casadi as ca
import numpy as np

log = logging.getLogger("ceem_casadi.runtime._compile")

TMP_PREFIX = "tmp-"
ORPHAN_AGE_S = 86400.0  # a build folder untouched this long is a dead process's: no build waits a day in a queue
LIBRARY = re.compile(r"_[0-9a-f]{24}\.(so|json)$")  # a cached library or its record: the cache key, then the suffix


def safe_name(text: str) -> str:
    """A C identifier and CasADi Function name made of ``text`` (CasADi refuses ``__``, a leading ``_`` or
    digit): non-word characters become ``_``, runs of ``_`` one ``_``, a letter first."""
    s = re.sub(r"_+", "_", re.sub(r"\W", "_", text, flags=re.ASCII)).strip("_")
    return s if s[:1].isalpha() else "m" + s


def libraries(folder: Path, stale: list | None = None) -> dict[str, list]:
    """The libraries cached in ``folder``: file stem -> [last use (the library's mtime, s; 0 for a record
    without library), bytes of library and record]; ``stale`` gets the build folders untouched for a day."""
    found: dict[str, list] = {}
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for e in entries:
            with contextlib.suppress(OSError):  # removed meanwhile by another process
                st = e.stat(follow_symlinks=False)
                old = time.time() - st.st_mtime > ORPHAN_AGE_S
                if LIBRARY.search(e.name) and e.is_file(follow_symlinks=False):
                    entry = found.setdefault(e.name.rsplit(".", 1)[0], [0.0, 0])
                    entry[0] = st.st_mtime if e.name.endswith(".so") else entry[0]
                    entry[1] += st.st_size
                elif old and stale is not None and e.name.startswith(TMP_PREFIX) and e.is_dir(follow_symlinks=False):
                    stale.append(e.name)
    return found


def sweep(folder: Path, max_bytes: float, keep=frozenset()) -> list[str]:
    """Remove from ``folder`` the build folders untouched for ``ORPHAN_AGE_S`` (their process died with its
    supervisor, or before their compile started), then the least recently used libraries (a load touches its
    library) until the others take at most ``max_bytes``, never those whose stem is in ``keep``; returns the
    names removed. A library goes before its record; a file that cannot be removed (or is gone) is no error."""
    removed: list[str] = []
    found = libraries(folder, removed)
    for name in removed:
        shutil.rmtree(folder / name, ignore_errors=True)
    total = sum(size for _, size in found.values())
    for stem, (_, size) in sorted(found.items(), key=lambda item: item[1][0]):
        if total <= max_bytes:
            break
        if stem not in keep:
            for suffix in (".so", ".json"):
                with contextlib.suppress(OSError):
                    os.unlink(folder / (stem + suffix))
            total -= size
            removed.append(stem)
    if removed:
        log.info("compile cache (bound %g MiB): removed %s", max_bytes / 2**20, " ".join(removed))
    return removed


def load_exact(name: str, lib: Path):
    """``ca.external(name, lib)`` of the file at exactly ``lib`` (``RuntimeError`` when it cannot be opened): a gone
    ``lib`` (evicted) made CasADi load ``./<lib>`` under the working directory. Opening it first makes
    CasADi's load find it by name among the loaded libraries."""
    try:
        pin = ctypes.CDLL(str(lib))
    except OSError as exc:
        raise RuntimeError(str(exc)) from None
    try:
        return ca.external(name, str(lib))
    finally:
        _ctypes.dlclose(pin._handle)  # CasADi's own reference keeps it; a rebuild at this path loads anew


def same_values(compiled, f, rtol: float = 1e-6, atol: float = 1e-9) -> bool:
    """True when the loaded library ``compiled`` and the CasADi Function ``f`` agree at one
    random point (sparsity of every input and output, values to ``rtol``/``atol``)."""
    if compiled.n_in() != f.n_in() or compiled.n_out() != f.n_out() \
            or any(compiled.sparsity_in(i) != f.sparsity_in(i) for i in range(f.n_in())) \
            or any(compiled.sparsity_out(i) != f.sparsity_out(i) for i in range(f.n_out())):
        return False
    rng = np.random.default_rng(12345)
    args = [ca.DM(f.sparsity_in(i), 0.5 + rng.random(f.nnz_in(i))) for i in range(f.n_in())]
    try:
        a, b = compiled.call(args), f.call(args)
    except RuntimeError:
        return False
    return all(np.allclose(np.asarray(ca.DM(x).nonzeros()), np.asarray(ca.DM(y).nonzeros()), rtol=rtol, atol=atol,
                           equal_nan=True) for x, y in zip(a, b))


__all__ = ["libraries", "load_exact", "safe_name", "same_values", "sweep"]
