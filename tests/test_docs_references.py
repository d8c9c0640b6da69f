"""Docs that cannot drift (issue 32 item 7): every ``ceem_casadi.…`` name written in the docs, the
README, the package's docstrings and comments resolves (module import, then attribute chain); every
``path.py: Name`` of docs/architecture.md names a module and an attribute that exist; the page's
count of public names is ``len(cc.__all__)``; docs/choosing.md has a row for every smoother solver;
the README states the bound of the exact distributed sums."""
from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

import ceem_casadi as cc

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "ceem_casadi"
REF = re.compile(r"\bceem_casadi(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def resolves(ref: str) -> bool:
    """Whether ``ref`` (dotted) is an importable module or an attribute chain below one."""
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def _prose(path: Path):
    """Docstrings and comments of one source file (not its code or string literals)."""
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield ast.get_docstring(node, clean=False) or ""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.string


def _documents():
    return sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def test_resolves_is_strict():
    assert resolves("ceem_casadi.em.Joint") and resolves("ceem_casadi.smoothing._batched")
    assert not resolves("ceem_casadi.least_squares") and not resolves("ceem_casadi.em.Nope")


def test_every_dotted_reference_resolves():
    """Fails when a module is moved or a name renamed without its mentions (e.g. the 10 references
    to ``ceem_casadi.least_squares``, ``ceem_casadi.simulation``, ... fixed in issue 32)."""
    bad = set()
    for path in sorted(PKG.rglob("*.py")):
        for text in _prose(path):
            bad |= {(ref, str(path.relative_to(ROOT))) for ref in REF.findall(text) if not resolves(ref)}
    for path in _documents():
        bad |= {(ref, str(path.relative_to(ROOT))) for ref in REF.findall(path.read_text()) if not resolves(ref)}
    assert not bad, sorted(bad)


ARCH = (ROOT / "docs" / "architecture.md").read_text()


def _attribute(module: str, chain: str) -> bool:
    obj = importlib.import_module(module)
    for name in chain.split("."):
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def test_architecture_file_and_function_references_exist():
    """``em/_ceem.py: _EMRun.em_step`` and ``NAME`` (``path.py``) on docs/architecture.md: the file
    exists and defines the name (fails when a function moves, as ``learner_for`` did)."""
    refs = re.findall(r"`([a-z_/]+\.py): ([A-Za-z_][\w.]*)", ARCH)
    refs += [(path, name) for name, path in re.findall(r"`([A-Z][A-Z_]+)` \(`([a-z_/]+\.py)`\)", ARCH)]
    assert len(refs) > 20
    bad = []
    for path, name in refs:
        module = "ceem_casadi." + path.removesuffix(".py").replace("/", ".")
        if not (PKG / path).exists() or not _attribute(module, name):
            bad.append(f"{path}: {name}")
    assert not bad, bad


def test_architecture_counts_the_public_names():
    counts = {int(n) for n in re.findall(r"(\d+) (?:public )?names", ARCH)}
    assert counts == {len(cc.__all__)}, (counts, len(cc.__all__))


def test_choosing_has_a_row_for_every_smoother_solver():
    from ceem_casadi.runtime._schema import SMOOTHER_SOLVERS

    text = (ROOT / "docs" / "choosing.md").read_text()
    rows = set(re.findall(r'^\| `"?([a-z-]+)"?`', text, flags=re.M))
    missing = [s for s in SMOOTHER_SOLVERS if s not in rows]
    assert not missing, missing


@pytest.mark.parametrize("doc", ["README.md", "docs/scaling.md"])
def test_exact_sums_are_claimed_with_their_bound(doc):
    """The distributed sums are exact only while the per-stage rows number at most EXACT_SUM_ROWS."""
    from ceem_casadi.learning._terms import EXACT_SUM_ROWS

    text = (ROOT / doc).read_text()
    claims = [m.start() for m in re.finditer(r"exact", text) if "sum" in text[max(0, m.start() - 80):m.start() + 80]]
    assert claims
    assert f"EXACT_SUM_ROWS = {EXACT_SUM_ROWS}" in text, f"{doc}: state the bound EXACT_SUM_ROWS = {EXACT_SUM_ROWS}"
