"""The Examples of the public API run: every function and class in ``ceem_casadi.__all__`` has an
"Examples" section with at least one doctest (``>>>``), and all of them pass.

The examples are tiny (scalar models, no C compilation: ``compile=False``), so the whole file runs
in a few seconds. Each docstring runs in fresh globals (an example imports what it uses); methods'
docstrings are not collected here. The subpackages' own names (e.g. ``ceem_casadi.distributed.
shard_index``) run too when their docstrings have examples.
"""
from __future__ import annotations

import doctest
import importlib
import inspect
import time

import pytest

import ceem_casadi as cc

SUBPACKAGES = ("model", "io", "objective", "smoothing", "learning", "em", "workflow", "filtering", "baselines",
               "deploy", "distributed", "runtime", "cli")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _top_level():
    """(name, object) of every function and class in ``cc.__all__``."""
    return [(n, getattr(cc, n)) for n in cc.__all__
            if inspect.isfunction(getattr(cc, n)) or inspect.isclass(getattr(cc, n))]


def _subpackage_names():
    """(qualified name, object) of every function and class in a subpackage's ``__all__``."""
    out = []
    for s in SUBPACKAGES:
        mod = importlib.import_module(f"ceem_casadi.{s}")
        out += [(f"{mod.__name__}.{n}", getattr(mod, n)) for n in mod.__all__
                if inspect.isfunction(getattr(mod, n)) or inspect.isclass(getattr(mod, n))]
    return out


def _with_examples():
    """(qualified name, object) of every public function or class (cc and the subpackages) whose own
    docstring has an Examples section, each object once."""
    seen = {}
    for mod in (cc, *(importlib.import_module(f"ceem_casadi.{s}") for s in SUBPACKAGES)):
        for n in mod.__all__:
            obj = getattr(mod, n)
            own_doc = inspect.cleandoc(obj.__doc__ or "")
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and "Examples\n--------" in own_doc:
                seen.setdefault(id(obj), (f"{mod.__name__}.{n}", obj))
    return list(seen.values())


def _doctest_of(name, obj):
    finder = doctest.DocTestFinder(recurse=False, exclude_empty=True)
    tests = finder.find(obj, name, globs={}, module=False)
    return tests[0] if tests else None


def test_every_public_function_and_class_has_an_examples_doctest():
    missing = []
    for name, obj in _top_level():
        doc = inspect.getdoc(obj) or ""
        section = doc.split("Examples\n--------", 1)
        if len(section) < 2 or ">>>" not in section[1]:
            missing.append(name)
    assert not missing, f"add an 'Examples' section with a doctest (>>> lines) to: {missing}"


def test_every_public_name_of_the_subpackages_has_an_examples_doctest():
    """The subpackages' public names too (issue 32: 50 of 117 had none)."""
    missing = []
    for name, obj in _subpackage_names():
        section = (inspect.getdoc(obj) or "").split("Examples\n--------", 1)
        if len(section) < 2 or ">>>" not in section[1]:
            missing.append(name)
    assert not missing, f"add an 'Examples' section with a doctest (>>> lines) to: {missing}"


@pytest.mark.parametrize("name,obj", _with_examples(), ids=[n for n, _ in _with_examples()])
def test_examples_pass(name, obj):
    test = _doctest_of(name, obj)
    assert test is not None and test.examples, f"{name}: Examples section without >>> lines"
    out = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    t0 = time.perf_counter()
    result = runner.run(test, out=out.append)
    wall = time.perf_counter() - t0
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed:\n" + "".join(out)
    assert wall < 10.0, f"{name}: examples took {wall:.1f} s (keep each under a second: tiny problems, compile=False)"


def _library_modules() -> list[str]:
    """Every module of the package (private ones included), except the CLI's ``__main__``."""
    from pathlib import Path

    root = Path(cc.__file__).resolve().parent
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = ("ceem_casadi", *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("module", _library_modules())
def test_every_docstring_example_of_the_library_passes(module):
    """The examples of private modules too (a moved module's examples kept importing its old path,
    e.g. ``from ceem_casadi.stages import ...``, and nothing ran them)."""
    mod = importlib.import_module(module)
    out = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in doctest.DocTestFinder(exclude_empty=True).find(mod, module):
        if test.examples:
            runner.run(test, out=out.append)
    assert runner.failures == 0, "".join(out)
