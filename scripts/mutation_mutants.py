"""List the mutants of a mutmut scratch copy (see scripts/mutation_check.sh) with their one-line diffs,
or draw a seeded sample of them to check (mutmut runs about 10 mutants a minute on a loaded
2-core machine, so the big modules are checked on samples).

Run inside a scratch copy (e.g. /tmp/ceem_mutation/joint) after ``mutmut run`` generated its mutants:

    python -m scripts.mutation_mutants ceem_casadi/em/_joint_gauss_newton.py                    # every mutant: name [status], - old, + new
    python -m scripts.mutation_mutants ceem_casadi/em/_joint_gauss_newton.py --status survived  # the survivors only
    python -m scripts.mutation_mutants ceem_casadi/em/_joint_gauss_newton.py --sample 150 --seed 0 --functions 'step|adapt'

``--sample`` prints mutant names (for ``MUTATION_ONLY``), drawn uniformly with ``--seed`` among the
mutants of the functions matching ``--functions``, leaving out string-only mutants of CasADi
Function / solver names (a Function's name never changes a result; they are listed as equivalent
in docs/testing.md).
"""
from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
from pathlib import Path

STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
NAMING_CALL = re.compile(r"ca\.Function\(|nlpsol\(|mapaccum\(")


def mutants() -> list[tuple[str, str]]:
    """(name, status) of every mutant, from ``mutmut results --all true``."""
    out = subprocess.run(["mutmut", "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    rows = [line.rsplit(":", 1) for line in out.splitlines() if "__mutmut_" in line]
    return [(name.strip(), status.strip()) for name, status in rows]


def one_line_diff(name: str, path: Path) -> tuple[str, str]:
    """The removed and the added source lines of a mutant, each joined by ' | '."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    lines = get_diff_for_mutant(name, path=path).splitlines()
    minus = [s[1:].strip() for s in lines if s.startswith("-") and not s.startswith("---")]
    plus = [s[1:].strip() for s in lines if s.startswith("+") and not s.startswith("+++")]
    return " | ".join(minus), " | ".join(plus)


def renames_a_function(minus: str, plus: str) -> bool:
    """True when the mutant only changes a string literal that names a CasADi Function or solver."""
    if minus == plus or STRING.sub('""', minus) != STRING.sub('""', plus) or not NAMING_CALL.search(minus):
        return False
    old, new = STRING.finditer(minus), STRING.finditer(plus)
    first = next(a for a, b in zip(old, new) if a.group() != b.group())
    return not minus[first.end():].lstrip().startswith(":")  # a dict key is looked up, not a name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path, help="the mutated source file, e.g. ceem_casadi/joint.py")
    ap.add_argument("--status", action="append", help="only mutants with this status (repeatable)")
    ap.add_argument("--sample", type=int, help="print this many mutant names, drawn with --seed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--functions", default="", help="regex on the mutant name (function) for --sample")
    args = ap.parse_args(argv)
    rows = [(n, s) for n, s in mutants() if not args.status or s in args.status]
    if args.sample is None:
        for name, status in rows:
            minus, plus = one_line_diff(name, args.path)
            print(f"{name} [{status}]\n   - {minus}\n   + {plus}")
        return 0
    pool, renames = [], 0
    for name, _ in rows:
        if re.search(args.functions, name):
            if renames_a_function(*one_line_diff(name, args.path)):
                renames += 1
            else:
                pool.append(name)
    random.Random(args.seed).shuffle(pool)
    print(f"{len(pool)} eligible mutants, {renames} Function renames left out", file=sys.stderr)
    print("\n".join(sorted(pool[:args.sample])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
