"""The commands and names a user copies from README.md and docs/*.md exist and parse: every
``python -m scripts.X --flag ...`` names a script whose own ``argparse`` parser accepts the flags and values
shown (run as ``__main__`` with ``parse_args`` stopped right after parsing, so nothing is computed); every
``ceem-casadi COMMAND --flag ...`` parses with the CLI's parser; every ``cc.X`` is public and exported.
Placeholders of the prose (``[--opt]`` optional, ``{a,b}`` / ``a|b`` alternatives, ``...``) are read as a user
would: the optional part included, the first alternative taken, an elided command skipped."""
from __future__ import annotations

import argparse
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"python -m (scripts\.[a-z_0-9.]+)(.*)")
CLI = re.compile(r"(?:ceem-casadi|python -m ceem_casadi\.cli) +([a-z][a-z-]+)( .*)")


def _snippets(text: str):
    """The code a user copies: each line of a fenced or indented block (``\\`` continuations joined), and
    each inline code span (paired within its paragraph; a span wrapped over two lines read as one line)."""
    fence = re.compile(r"^```\w*\n(.*?)^```", re.S | re.M)
    for block in fence.findall(text):
        yield from block.replace("\\\n", " ").splitlines()
    prose = fence.sub("", text)
    yield from (line.strip() for line in prose.splitlines() if line.startswith("    python -m "))
    for paragraph in re.split(r"\n\s*\n", prose):
        yield from (span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", paragraph))


def _argv(rest: str) -> list[str] | None:
    """The arguments as a user types them (None for an elided ``...`` command): a pipe or comment ends them,
    ``[--opt]`` is included, the first of ``{a,b}`` / ``a|b`` is taken, a capitalised placeholder
    (``DIR``, ``S``) becomes ``0``."""
    rest = rest.split("#")[0].split(" | ")[0].strip()
    if "..." in rest:
        return None
    rest = re.sub(r"\{([^,}]+)[^}]*\}", r"\1", re.sub(r"\[(--[^]]*)\]", r"\1", rest))
    rest = re.sub(r"(\S+?)\|\S+", r"\1", rest)
    return ["0" if re.fullmatch(r"[A-Z]+", a) else a for a in shlex.split(rest)]


def doc_commands(pattern: re.Pattern = COMMAND) -> list[tuple[str, str, list[str]]]:
    """(page, program, argv) of every command matching ``pattern`` in the README and the docs."""
    out = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for snippet in _snippets(page.read_text()):
            for program, rest in pattern.findall(snippet):
                argv = _argv(rest)
                if argv is not None:
                    out.add((page.name, program, tuple(argv)))
    return [(p, m, list(a)) for p, m, a in sorted(out)]


class _Parsed(Exception):
    pass


def test_the_docs_name_scripts():
    assert len({m for _, m, _ in doc_commands()}) > 30


@pytest.mark.parametrize("page, module, argv", doc_commands(), ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_a_documented_script_command_parses(page, module, argv, monkeypatch):
    assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), f"{page}: {module} does not exist"
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    monkeypatch.setattr(sys, "argv", [module, *argv])
    monkeypatch.chdir(ROOT)
    monkeypatch.delitem(sys.modules, module, raising=False)      # runpy runs it afresh as __main__
    with pytest.raises(_Parsed):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=False)
        except SystemExit as exc:       # argparse's error exit: the flags shown are not accepted
            pytest.fail(f"{page}: python -m {module} {' '.join(argv)} does not parse (exit {exc.code})")


def _cli_commands():
    from ceem_casadi.cli._main import build_parser

    subcommands = set(build_parser()._subparsers._group_actions[0].choices)
    return [(p, c, a) for p, c, a in doc_commands(CLI) if c in subcommands and any(x.startswith("--") for x in a)]


def test_the_docs_name_cli_commands():
    assert {c for _, c, _ in _cli_commands()} >= {"fit", "refine", "calibrate-noise", "evaluate", "plot", "codegen"}


@pytest.mark.parametrize("page, command, argv", _cli_commands(),
                         ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_a_documented_cli_command_parses(page, command, argv):
    """Every ``ceem-casadi COMMAND --flag ...`` of the README and the docs parses (the CLI refuses abbreviated
    flags, so a renamed flag fails here)."""
    from ceem_casadi.cli._inputs import UsageError
    from ceem_casadi.cli._main import build_parser

    try:
        build_parser().parse_args([command, *argv])
    except UsageError as exc:
        pytest.fail(f"{page}: ceem-casadi {command} {' '.join(argv)}: {exc}")


def _public_chain(ref: str) -> bool:
    """Whether ``cc.<ref>`` (dotted) resolves and every step is public: listed in its module's ``__all__``
    (a subpackage: a module of the package), never an underscore name."""
    import importlib
    import types

    obj = importlib.import_module("ceem_casadi")
    for name in ref.split("."):
        if name.startswith("_") or not hasattr(obj, name):
            return False
        if isinstance(obj, types.ModuleType) and name not in getattr(obj, "__all__", [name]):
            child = getattr(obj, name)
            if not (isinstance(child, types.ModuleType) and child.__name__.startswith("ceem_casadi.")):
                return False
        obj = getattr(obj, name)
    return True


def test_every_cc_name_of_the_docs_is_public():
    """``cc.X`` / ``cc.sub.X`` (what a user types) in the README and the docs name exported public objects:
    fails on a name reached through a private module or missing from its subpackage's ``__all__``.
    (``ceem_casadi.sub._module`` pointers to the source are checked by tests/test_docs_references.py.)"""
    bad = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for ref in re.findall(r"\bcc\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", page.read_text()):
            if ref != "__all__" and not _public_chain(ref.removesuffix(".py")):
                bad.add((page.name, ref))
    assert not bad, sorted(bad)
