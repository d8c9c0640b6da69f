"""Every ``python -m scripts.X --flag ...`` written in README.md and docs/*.md names a script that exists
and whose argument parser accepts the flags and values shown: each command is parsed by the script's own
``argparse`` parser (run as ``__main__`` with ``parse_args`` stopped right after parsing, so nothing is
computed). Placeholders of the prose (``[--opt]`` optional, ``{a,b}`` alternatives, ``...``) are read as a
user would: the optional part included, the first alternative taken, an elided command skipped."""
from __future__ import annotations

import argparse
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"python -m (scripts\.[a-z_0-9.]+)([^|]*)")


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


def doc_commands() -> list[tuple[str, str, list[str]]]:
    """(page, module, argv) of every ``python -m scripts.X ...`` of the README and the docs."""
    out = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for snippet in _snippets(page.read_text()):
            for module, rest in COMMAND.findall(snippet):
                rest = rest.split("#")[0].strip()
                if "..." in rest:
                    continue
                rest = re.sub(r"\{([^,}]+)[^}]*\}", r"\1", rest.replace("[", "").replace("]", ""))
                argv = ["0" if re.fullmatch(r"[A-Z]+", a) else a for a in shlex.split(rest)]  # DIR, S: placeholders
                out.add((page.name, module, tuple(argv)))
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
