"""Model source references ``package.module:factory`` or ``path/to/file.py:factory``; resolving one imports
(or executes) Python code, which only the CLI's ``--model`` and ``load_model(..., trust_source=True)`` do."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from ..errors import CeemError


class ModelSourceError(CeemError, ImportError, ValueError):
    """A ``package.module:factory`` reference does not import or does not build a model."""


# --- model source references -----------------------------------------------------------
def is_file_ref(module_part: str) -> bool:
    """True when the part before the colon names a Python file rather than a module."""
    return module_part.endswith(".py") or "/" in module_part or os.sep in module_part


def _import_file(file: str, ref: str):
    """Import the Python file ``file`` as a module (a fresh module named after its absolute path)."""
    path = Path(file).expanduser().resolve()
    if not path.is_file():
        raise ModelSourceError(f"model {ref!r}: no such file {str(path)!r} (paths are relative to the working "
                               f"directory {os.getcwd()!r})")
    name = "_ceem_model_" + hashlib.sha256(str(path).encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module           # dataclasses and pickling look the module up by name
    sys.path.append(str(path.parent))  # the file may import its neighbours (installed modules first)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        sys.path.remove(str(path.parent))
    return module


def _import_module(mod_name: str):
    """Import ``package.module``; a package of the working directory (e.g. ``models``) that is not
    on the import path is found by putting the working directory LAST on the path for this one
    import (installed modules keep precedence: a ``pandas.py`` there never shadows pandas)."""
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        top = mod_name.split(".")[0]
        cwd = os.getcwd()
        if exc.name != top or not (Path(cwd, top).is_dir() or Path(cwd, top + ".py").is_file()):
            raise
    sys.path.append(cwd)
    try:
        return importlib.import_module(mod_name)
    finally:
        if sys.path and sys.path[-1] == cwd:
            sys.path.pop()
        elif cwd in sys.path:
            sys.path.remove(cwd)


def load_factory(ref: str):
    """The callable named by ``"package.module:factory"`` (imported) or ``"path/to/file.py:factory"``
    (the file is executed as a module; relative paths are relative to the working directory)."""
    mod_name, attr = ref.rsplit(":", 1) if isinstance(ref, str) and ":" in ref else ("", "")
    if not (mod_name and attr) or (not is_file_ref(mod_name) and ":" in mod_name):
        raise ModelSourceError(f"model reference must look like 'package.module:factory' or "
                               f"'path/to/file.py:factory', got {ref!r}")
    try:
        module = _import_file(mod_name, ref) if is_file_ref(mod_name) else _import_module(mod_name)
    except ModelSourceError:
        raise
    except (Exception, SystemExit) as exc:  # any import-time failure of user code (even sys.exit)
        raise ModelSourceError(f"cannot import module {mod_name!r} of model {ref!r}: "
                               f"{type(exc).__name__}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ModelSourceError(f"module {mod_name!r} has no attribute {attr!r} (model {ref!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ModelSourceError(f"{ref!r} is not callable")
    return obj


def build_model(ref: str, kwargs: dict | None = None):
    """Call the factory ``ref`` with ``kwargs`` and check that it returns a state-space model."""
    factory = load_factory(ref)
    try:
        model = factory(**(kwargs or {}))
    except (Exception, SystemExit) as exc:
        raise ModelSourceError(f"model factory {ref!r}({kwargs or {}}) failed: {type(exc).__name__}: {exc}") from exc
    for attr in ("f", "g", "nx", "ny", "nu", "params", "noise"):
        if not hasattr(model, attr):
            raise ModelSourceError(f"model factory {ref!r} returned {type(model).__name__}, "
                                   f"not a StateSpaceModel (no attribute {attr!r})")
    return model


