"""docs/architecture.md tells the truth: its table of subpackage imports equals the imports read
from the source (every import statement, function-local ones included), and every edge points down
the table (to a subpackage listed earlier), except the one upward edge the page names."""
from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "ceem_casadi"
UPWARD: set = set()  # no import points up the layers


def _subpackage(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] in ("__init__", "_version", "plots"):
        return None
    return parts[1].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    """Dotted ceem_casadi modules (or module.name) imported anywhere in one file."""
    parts = ["ceem_casadi", *path.relative_to(PKG).with_suffix("").parts]
    package = parts[:-1]          # a module's package; for __init__ the package itself
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("ceem_casadi")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                if not node.module:  # from . import x, y: the submodules or names
                    out |= {f"{target}.{a.name}" for a in node.names}
                    continue
            else:
                target = node.module or ""
            if target.startswith("ceem_casadi"):
                out.add(target)
    return out


def real_edges() -> dict[str, set[str]]:
    edges = defaultdict(set)
    for path in PKG.rglob("*.py"):
        a = _subpackage("ceem_casadi." + ".".join(path.relative_to(PKG).with_suffix("").parts))
        for target in _imports(path):
            b = _subpackage(target)
            if a and b and a != b:
                edges[a].add(b)
    return edges


def documented_edges() -> list[tuple[str, set[str]]]:
    """(subpackage, its imports) per row of the table, in the page's order (bottom layer first)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("| subpackage | imports |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        cells = line.split("|")
        name = re.findall(r"`(\w+)`", cells[1])[0]
        rows.append((name, {n.split(".")[0] for n in re.findall(r"`([\w.]+)`", cells[2])}))
    return rows


def test_the_page_lists_the_real_imports_of_every_subpackage():
    real, doc = real_edges(), dict(documented_edges())
    doc.get("cli", set()).discard("ceem_casadi")
    wrong = {s: {"page": sorted(doc.get(s, set())), "source": sorted(real.get(s, set()))}
             for s in set(real) | set(doc) if s != "cli" and doc.get(s, set()) != real.get(s, set())}
    assert not wrong, f"update the table of docs/architecture.md: {wrong}"


def test_imports_point_down_the_layers():
    order = [name for name, _ in documented_edges()]
    rank = {name: i for i, name in enumerate(order)}
    rank.setdefault("errors", -1)
    up = sorted((a, b) for a, targets in real_edges().items() for b in targets
                if a in rank and b in rank and rank[b] > rank[a] and (a, b) not in UPWARD)
    assert not up, f"imports pointing up the layers of docs/architecture.md: {up}"
