"""The package's architecture, checked from its source: no import cycle (function-local imports
included, and the implicit import of a package's ``__init__`` when one of its modules is imported),
no module importing another module's underscore names, and the public API's size and argument
convention."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import ceem_casadi as cc

PKG = Path(cc.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (packages as their __init__)."""
    out = {}
    for path in PKG.rglob("*.py"):
        parts = ("ceem_casadi", *path.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(importer: str, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".") if _is_package(importer) else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(name: str):
    """(target module, imported names) for every import in module ``name``, at any depth."""
    tree = ast.parse(MODULES[name].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "ceem_casadi":
                    yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, node.level, node.module)
            if target.split(".")[0] == "ceem_casadi":
                yield target, [a.name for a in node.names]


def graph() -> dict[str, set[str]]:
    """Edges importer -> imported module. Importing ``a.b.c`` also runs the ``__init__`` of ``a.b``
    and ``a``: those edges are added unless the importer lives inside that package (its parent
    package is being imported already)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for name in MODULES:
        for target, names in imports_of(name):
            targets = {f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES} or set()
            if not targets or len(targets) < len(names):
                targets.add(target)
            for t in list(targets):
                parts = t.split(".")
                for k in range(1, len(parts)):
                    pkg = ".".join(parts[:k])
                    if not (name == pkg or name.startswith(pkg + ".")):
                        targets.add(pkg)
            edges[name] |= {t for t in targets if t in MODULES and t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_sees_a_cycle():
    """The checker itself: a two-module loop and a loop through a package's __init__ are found."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert cycles({"p": {"p._x"}, "p._x": {"q._y"}, "q._y": {"p"}, "q": set()}) == [["p", "p._x", "q._y"]]


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles (function-local imports included): " + "; ".join(" <-> ".join(c) for c in found)


def test_no_module_imports_another_modules_underscore_names():
    """``from x import _name`` is allowed only when ``_name`` is a module (a private submodule);
    attribute access ``module._name`` on an imported module of the package likewise."""
    bad = []
    for name in MODULES:
        tree = ast.parse(MODULES[name].read_text())
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(name, node.level, node.module)
                if target.split(".")[0] != "ceem_casadi":
                    continue
                for a in node.names:
                    full = f"{target}.{a.name}"
                    if full in MODULES:
                        aliases[a.asname or a.name] = full
                    elif a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{name}: from {target} import {a.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{name}: {aliases[node.value.id]}.{node.attr}")
    assert not bad, "private names used across modules: " + "; ".join(sorted(set(bad)))


def test_library_never_imports_models_or_scripts():
    bad = [f"{name}: {t}" for name in MODULES for t, _ in _raw_imports(name) if t.split(".")[0] in ("models", "scripts")]
    assert not bad, bad


def _raw_imports(name):
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            yield from ((a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, None


def test_public_api_is_small():
    assert len(cc.__all__) <= 47, f"{len(cc.__all__)} names in ceem_casadi.__all__"  # 45 + residual_analysis, simulation_bands (issue 34)
    missing = [n for n in cc.__all__ if not hasattr(cc, n)]
    assert not missing, missing


def _public_functions():
    for name in cc.__all__:
        obj = getattr(cc, name)
        if inspect.isfunction(obj):
            yield name, obj


def test_functions_that_take_data_take_model_data_theta_first():
    """Every public function with a model and a positional ``data`` argument takes
    ``(model, data, theta, *, ...)`` (``n4sid(data, ...)`` takes no model; ``save_model``'s
    ``data=`` is a keyword describing the data)."""
    checked, bad = [], []
    for name, fn in _public_functions():
        params = list(inspect.signature(fn).parameters.values())
        names = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        if "data" not in names or "model" not in names:
            continue
        checked.append(name)
        if names[:3] not in (["model", "data", "theta"], ["model", "data", "theta0"]):
            bad.append(f"{name}{inspect.signature(fn)}")
        # everything after theta is keyword-only (except ceem_checkpointed's checkpoint path and
        # simulation_bands' uncertainty, the fourth thing it needs)
        loose = [p.name for p in params[3:] if p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in ("path", "uncertainty")]
        if loose:
            bad.append(f"{name}: positional options {loose}")
    assert {"ceem", "refine_output_error", "validation_report", "estimate_initial_state",
            "parameter_uncertainty", "calibrate_noise"} <= set(checked)
    assert not bad, bad


@pytest.fixture(scope="module")
def small_fit():
    """A scalar linear model x+ = a x + u, y = x, fitted from a = 0.5 (truth 0.8)."""
    import numpy as np

    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
                                             params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.01,
                                             measurement_std=0.05)
    u = np.random.default_rng(0).standard_normal((1, 60, 1))
    data, _ = cc.simulate(model, {"a": 0.8}, np.zeros((1, 1)), 60, u=u, measurement_std=0.05, seed=1)
    opts = cc.CEEMOptions(smoother=cc.SmootherOptions(compile=False), learner=cc.LearnerOptions(compile=False))
    return model, data, cc.ceem(model, data, {"a": 0.5}, options=opts)


def test_results_have_a_short_repr_a_table_and_plain_data(small_fit):
    import json

    model, data, fit = small_fit
    assert abs(float(fit.theta["a"]) - 0.8) < 0.05
    results = [fit, fit.history[-1], cc.refine_output_error(model, data, fit.theta),
               cc.validation_report(model, data, fit.theta, k=1),
               cc.parameter_uncertainty(model, data, fit),
               cc.estimate_initial_state(model, data, fit.theta, full_output=True)]
    for res in results:
        res = res[0] if isinstance(res, list) else res
        text = repr(res)
        assert len(text) < 300 and "\n" not in text and text.startswith(type(res).__name__), text
        table = res.table()
        assert isinstance(table, str) and table.strip()
        json.dumps(res.to_dict())  # plain data all the way down
    assert "a" in fit.table() and f"{float(fit.theta['a']):.6g}" in fit.table()


def test_results_of_the_pipeline_control_and_least_squares_keep_the_contract(small_fit, tmp_path):
    """The results added beside the first ones (identify and its stages, compare_structures, the
    least-squares engine, export_casadi, design_input) are `Result`s with the same contract."""
    import json

    from ceem_casadi.runtime._result import Result
    from ceem_casadi.workflow.output_error._fit import output_error_least_squares

    model, data, fit = small_fit
    ident = cc.identify(model, data, {"a": 0.5}, time_limit=60)
    assert abs(float(ident.theta["a"]) - 0.8) < 0.05
    lin2 = {"one": (model, None), "two": (model, {"a": 0.7})}
    results = [ident, ident.stages[0], cc.compare_structures(lin2, data),
               output_error_least_squares(model, data, {"a": 0.5}),
               cc.export_casadi(model, fit.theta, tmp_path / "export"),
               cc.design_input(model, fit.theta, 20, u_bounds=(-1, 1), starts=2, x0=[0.0])]
    for res in results:
        assert isinstance(res, Result), type(res).__name__
        text = repr(res)
        assert len(text) < 300 and "\n" not in text, text
        assert isinstance(res.table(), str) and res.table().strip()
        json.dumps(res.to_dict())


def test_every_import_of_the_package_resolves():
    """Every import of a ``ceem_casadi`` module, function-local ones included, names a module that
    exists (a function-local ``from .compile import ...`` left behind by a move fails only when
    that branch runs, e.g. on 20,000 samples)."""
    bad = []
    for name in MODULES:
        for target, _names in imports_of(name):
            if target in MODULES:
                continue
            parent, _, leaf = target.rpartition(".")
            if parent not in MODULES or not _defines(parent, leaf):
                bad.append(f"{name}: {target}")
    assert not bad, bad


def _defines(module: str, name: str) -> bool:
    """Whether ``module``'s source binds ``name`` at its top level (a class, function, assignment or import)."""
    tree = ast.parse(MODULES[module].read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name
                                                                   for a in node.names):
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False


def _option_classes():
    """Every ``*Options`` dataclass defined in the package."""
    import dataclasses
    import importlib

    found = {}
    for name in MODULES:
        if name.endswith("__main__"):  # running it is the CLI itself
            continue
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if (attr.endswith("Options") and isinstance(obj, type) and dataclasses.is_dataclass(obj)
                    and obj.__module__ == name):
                found[f"{name}.{attr}"] = obj
    return found


OPTION_CLASSES = _option_classes()


@pytest.mark.parametrize("name", sorted(OPTION_CLASSES))
def test_every_option_class_checks_its_field_types_by_the_one_schema(name):
    """A value of the wrong type in any typed field raises the library's OptionsError naming the
    field (never a raw TypeError, never accepted): every option dataclass runs runtime._schema."""
    from ceem_casadi.errors import OptionsError
    from ceem_casadi.runtime._schema import field_kinds

    cls = OPTION_CLASSES[name]
    kinds = field_kinds(cls)
    assert kinds, f"{name}: no typed field"
    field, kind = next((f, k) for f, k in kinds.items() if not k.accepts("not a value of this kind"))
    with pytest.raises(OptionsError, match=field):
        cls(**{field: "not a value of this kind"})
    assert len(OPTION_CLASSES) >= 9  # 11 before issue 32 merged the Adam options and moved ParticleEMOptions out
