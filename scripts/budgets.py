"""The package's size budgets, read from its source: lines, branchy functions, long modules and
option fields (issue 32 item 6).

* **lines**: all lines of the ``*.py`` files under ``ceem_casadi/`` (target <= 19,000);
* **complexity**: functions (methods and nested functions each on their own, a nested function's
  branches counted in its parent too) above cyclomatic complexity 25, counted plainly from the
  syntax tree: 1 + every ``if``/``elif``, ``for``, ``while``, ``except``, ``with``, ternary, ``match``
  case, comprehension (and each of its ``if``), and every extra operand of ``and``/``or``;
* **modules**: files above 450 lines;
* **option fields**: the dataclass fields of every public ``*Options`` class (deprecated aliases,
  accepted by the constructor but stored under the new name, are not fields; target <= 80).

    python -m scripts.budgets            # a table; exit status 0
    python -m scripts.budgets --json     # the same figures as JSON
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "ceem_casadi"
LINES, COMPLEXITY, MODULE_LINES, OPTION_FIELDS = 19_000, 25, 450, 80
_BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.With, ast.AsyncWith, ast.IfExp,
             ast.match_case)


def complexity(node: ast.AST) -> int:
    """Plain cyclomatic complexity of one function node (see the module docstring).

    Examples
    --------
    >>> complexity(ast.parse("def f(a, b):\\n    if a and b:\\n        return 1\\n    return 0").body[0])
    3
    """
    n = 1
    for sub in ast.walk(node):
        if isinstance(sub, _BRANCHES):
            n += 1
        elif isinstance(sub, ast.BoolOp):
            n += len(sub.values) - 1
        elif isinstance(sub, ast.comprehension):
            n += 1 + len(sub.ifs)
    return n


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def branchy(root: Path = PKG, limit: int = COMPLEXITY) -> list[tuple[str, int]]:
    """``("path::qualified.name", complexity)`` of every function above ``limit``, worst first."""
    out = []
    for path in _files(root):
        tree = ast.parse(path.read_text())
        stack = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                name = prefix
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}."
                    if not isinstance(child, ast.ClassDef) and complexity(child) > limit:
                        out.append((f"{path.relative_to(root.parent)}::{prefix}{child.name}", complexity(child)))
                stack.append((child, name))
    return sorted(out, key=lambda t: -t[1])


def module_lines(root: Path = PKG) -> dict[str, int]:
    """Lines of every module, by path relative to the package's parent."""
    return {str(p.relative_to(root.parent)): len(p.read_text().splitlines()) for p in _files(root)}


def option_fields(package: str = "ceem_casadi") -> dict[str, int]:
    """Dataclass fields of every ``*Options`` class defined in the package, by qualified name."""
    out = {}
    for path in _files(PKG):
        if path.stem == "__main__":  # importing it runs the command line
            continue
        parts = (package, *path.relative_to(PKG).with_suffix("").parts)
        mod = importlib.import_module(".".join(p for p in parts if p != "__init__"))
        for name, obj in vars(mod).items():
            if (name.endswith("Options") and isinstance(obj, type) and dataclasses.is_dataclass(obj)
                    and obj.__module__ == mod.__name__):
                out[f"{mod.__name__}.{name}"] = len(dataclasses.fields(obj))
    return out


def budgets(root: Path = PKG) -> dict:
    """Every figure of the budgets and whether it holds."""
    lines = module_lines(root)
    fields = option_fields()
    total = sum(lines.values())
    return {
        "lines": {"value": total, "limit": LINES, "holds": total <= LINES},
        "complexity": {"value": branchy(root), "limit": COMPLEXITY},
        "modules": {"value": {k: v for k, v in sorted(lines.items(), key=lambda t: -t[1]) if v > MODULE_LINES},
                    "limit": MODULE_LINES},
        "option_fields": {"value": sum(fields.values()), "limit": OPTION_FIELDS, "classes": fields,
                          "holds": sum(fields.values()) <= OPTION_FIELDS},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    b = budgets()
    if args.json:
        print(json.dumps(b, indent=1))
        return 0
    ok = {True: "holds", False: "OVER"}
    print(f"lines of ceem_casadi/: {b['lines']['value']:,} (budget {LINES:,}: {ok[b['lines']['holds']]})")
    cx = b["complexity"]["value"]
    print(f"functions above complexity {COMPLEXITY}: {len(cx)}")
    for name, c in cx:
        print(f"  {c:4d}  {name}")
    mods = b["modules"]["value"]
    print(f"modules above {MODULE_LINES} lines: {len(mods)}")
    for name, n in mods.items():
        print(f"  {n:4d}  {name}")
    of = b["option_fields"]
    print(f"option fields: {of['value']} in {len(of['classes'])} classes (budget {OPTION_FIELDS}: {ok[of['holds']]})")
    for name, n in sorted(of["classes"].items(), key=lambda t: -t[1]):
        print(f"  {n:4d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
