"""Every CLI input validated at the boundary (issue 15, point 4): bad flags, JSON, TOML and data
files give exit code 2 and one line naming the fix; a property-based test drives ``main(argv)``
with generated argument lists and asserts that no traceback escapes and the exit code is 0, 1 or 2."""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import textwrap

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ceem_casadi.cli import main
from ceem_casadi.em._options import CEEMOptions

LINEAR = textwrap.dedent('''
    import ceem_casadi as cc

    def make(a=0.9):
        params = cc.Parameters(cc.Param("a", a), cc.Param("b", 0.5))
        return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x,
                                                nx=1, nu=1, params=params, process_std=0.1,
                                                measurement_std=0.1, x1_mean=0.0, x1_std=1.0, dt=0.1)

    def leave():
        raise SystemExit(3)
''')


def write_inputs(d) -> None:
    """The inputs of the CLI tests in folder ``d``: ``mymodel.py``, good and broken data and TOML
    files, and ``m.npz`` fitted from ``good.csv`` (shared with tests/test_cli_exit2.py)."""
    (d / "mymodel.py").write_text(LINEAR)
    rng = np.random.default_rng(0)
    u = np.sin(0.3 * np.arange(40.0))
    x = np.zeros(40)
    for t in range(39):
        x[t + 1] = 0.8 * x[t] + 0.5 * u[t]
    pd.DataFrame({"u0": u, "y0": x + 0.1 * rng.standard_normal(40)}).to_csv(d / "good.csv", index=False)
    pd.DataFrame({"u0": u, "y0": ["a"] * 40}).to_csv(d / "text.csv", index=False)
    pd.DataFrame({"trajectory": [0.0, np.nan] * 20, "u0": u, "y0": x}).to_csv(d / "holes.csv", index=False)
    (d / "empty.csv").write_text("")
    (d / "header.csv").write_text("u0,y0\n")
    np.savez(d / "flat.npz", y=np.arange(5.0))
    for name, text in {"xlower.toml": '[smoother]\nx_lower = "abc"\n', "float_iters.toml": "max_iters = 2.5\n",
                       "broken.toml": "max_iters = \n", "table.toml": "smoother = 5\n",
                       "string_tol.toml": 'tol = "1e-3"\n', "bool_jobs.toml": "n_jobs = true\n",
                       "ok.toml": "max_iters = 2\n"}.items():
        (d / name).write_text(text)
    with contextlib.chdir(d):
        assert main(["fit", "--model", "mymodel.py:make", "--data", "good.csv", "--out", "m.npz", "--max-iters", "2",
                     "-q"]) in (0, 1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    write_inputs(d)
    return d


def test_from_mapping_types():
    opts = CEEMOptions.from_mapping({"max_iters": 3, "tol": 1, "smoother": {"x_lower": [0, -1.5, float("-inf")]},
                                     "learner": {"use_prior": False}})
    assert opts.max_iters == 3 and opts.tol == 1.0 and opts.smoother.x_lower == [0, -1.5, float("-inf")]
    assert opts.learner.use_prior is False and opts.learner.max_iters == 200      # defaults kept
    for bad, words in [({"max_iters": 2.5}, "integer"), ({"max_iters": True}, "integer"), ({"tol": "1"}, "number"),
                       ({"smoother": {"x_lower": "abc"}}, "x_lower"), ({"learner": {"use_prior": 1}}, "true or false"),
                       ({"smoother": []}, "table"), ({"bogus": 1}, "unknown option 'bogus'"),
                       ({"smoother": {"rho_x": -1.0}}, "rho_x must be >= 0")]:
        with pytest.raises(ValueError, match=words):
            CEEMOptions.from_mapping(bad)


# --- property-based: no traceback, exit code in {0, 1, 2} ----------------------------------------------
json_values = st.recursive(st.none() | st.booleans() | st.integers(-10, 10) | st.floats(allow_nan=True) |
                           st.text(max_size=4), lambda c: st.lists(c, max_size=3) |
                           st.dictionaries(st.sampled_from(["a", "b", "x", "sigma"]), c, max_size=3), max_leaves=6)
toml_scalars = st.one_of(st.integers(-3, 5), st.floats(-2, 5), st.sampled_from(['"abc"', "true", "[1, 2]", "nan",
                                                                               "inf", '"exact"', '"none"']))
option_keys = st.sampled_from(["max_iters", "tol", "n_jobs", "acceleration", "blas_threads", "raise_on_failure",
                               "smoother.x_lower", "smoother.hessian", "smoother.max_iters", "learner.rho_theta",
                               "learner.use_prior", "smoother.bogus", "bogus"])
numbers = st.one_of(st.integers(1, 30).map(str), st.integers(-3, 60).map(str), st.sampled_from(["abc", "1.5", "nan", "-inf", "", "1,2", "0"]))


def _toml(entries) -> str:
    top = [f"{k} = {_val(v)}" for k, v in entries if "." not in k]
    tables: dict = {}
    for k, v in entries:
        if "." in k:
            t, key = k.split(".")
            tables.setdefault(t, []).append(f"{key} = {_val(v)}")
    return "\n".join(top + [f"[{t}]\n" + "\n".join(rows) for t, rows in tables.items()]) + "\n"


def _val(v) -> str:
    return v if isinstance(v, str) else repr(v)


@st.composite
def argv_lists(draw):
    cmd = draw(st.sampled_from(["fit", "evaluate", "simulate", "smooth", "refine", "calibrate-noise"]))
    argv = [cmd]
    if cmd == "fit" or draw(st.booleans()):
        argv += ["--model", draw(st.sampled_from(["mymodel.py:make"] * 3 + ["mymodel:make", "mymodel.py:nope", "x:y"]))]
        if draw(st.integers(0, 3)) == 0:
            argv += ["--model-kwargs", json.dumps(draw(json_values))]
    else:
        argv += ["--model-file", draw(st.sampled_from(["m.npz"] * 3 + ["good.csv", "none.npz"]))]
    if cmd != "simulate":
        argv += ["--data", draw(st.sampled_from(["good.csv"] * 4 + ["text.csv", "holes.csv", "flat.npz"]))]
    else:
        argv += ["--input-file", "good.csv", "--horizon", draw(numbers)]
        if draw(st.integers(0, 3)) == 0:
            argv += ["--x0", json.dumps(draw(json_values))]
    extra = {"fit": [("--theta0", "json"), ("--max-iters", "num"), ("--tol", "num"), ("--n-jobs", "num"),
                     ("--rho-x", "num"), ("--config", "toml"), ("--acceleration", "word")],
             "evaluate": [("--k", "num"), ("--skip", "num"), ("--x0", "json"), ("--x0-window", "num")],
             "refine": [("--shooting", "num"), ("--x0-window", "num"), ("--time-limit", "num"), ("--x0", "json"),
                        ("--theta0", "json"), ("--solver", "word")],
             "calibrate-noise": [("--grid", "grid"), ("--criterion", "word"), ("--time-limit", "num"),
                                 ("--x0-window", "num"), ("--holdout-fraction", "num"), ("--theta0", "json")],
             "simulate": [("--theta", "json"), ("--seed", "num"), ("--measurement-std", "num")],
             "smooth": [("--method", "word")]}[cmd]
    toml = None
    for flag, kind in draw(st.lists(st.sampled_from(extra), max_size=2, unique=True)):
        if kind == "json":
            argv += [flag, json.dumps(draw(json_values))]
        elif kind == "num":
            argv += [flag, draw(numbers)]
        elif kind == "word":
            argv += [flag, draw(st.sampled_from(["none", "squarem", "ce", "eks", "fast", "exact", "holdout"]))]
        elif kind == "grid":
            argv += [flag, draw(st.sampled_from(["1", "0.5,2", "0,1", "1,1", "a", "", "1e9", "-1"]))]
        else:
            toml = _toml(draw(st.lists(st.tuples(option_keys, toml_scalars), max_size=4, unique_by=lambda e: e[0])))
            argv += [flag, "gen.toml"]
    return argv, toml


_counter = itertools.count()


@settings(max_examples=int(os.environ.get("CEEM_HYPOTHESIS_EXAMPLES", "40")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(case=argv_lists())
def test_generated_argv_never_traceback(folder, monkeypatch, capsys, case):
    argv, toml = case
    monkeypatch.chdir(folder)
    if toml is not None:
        (folder / "gen.toml").write_text(toml)
    n = next(_counter)
    out = {"fit": ["--out", f"gen{n}.npz", "-q"], "simulate": ["--out", f"gen{n}.csv"],
           "smooth": ["--out", f"gen{n}.csv"], "evaluate": [], "refine": ["--out", f"gen{n}.npz", "-q"],
           "calibrate-noise": ["--out", f"gen{n}.npz", "-q", "--max-iters", "2"]}[argv[0]]
    if argv[0] == "calibrate-noise" and "--grid" not in argv:
        out += ["--grid", "1"]            # bounded work per example
    if argv[0] == "fit" and "--max-iters" not in argv:
        out += ["--max-iters", "2"]       # bounded work per example
    rc = main(argv + out)
    err = capsys.readouterr().err
    assert rc in (0, 1, 2), (argv, toml, rc, err)
    assert "Traceback" not in err, (argv, toml, err)
    if rc == 2:
        assert len(err.strip().splitlines()) == 1 and "error:" in err, (argv, toml, err)
