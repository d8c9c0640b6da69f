"""Every bad CLI input exits with status 2 and one line on stderr that names the flag and the fix,
no traceback: one table of cases (argv, words the line must contain), run in-process with
``main(argv)`` in one folder holding the inputs of tests/test_cli_inputs.py (a linear model with
an input, good and broken data, TOML and model files) and of tests/test_cli_workflow.py (a
damped oscillator with a hidden velocity)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ceem_casadi.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from test_cli_inputs import write_inputs
from test_cli_workflow import write_workflow


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("exit2")
    write_inputs(d)
    write_workflow(d)
    good = pd.read_csv(d / "good.csv")
    good.loc[7, "u0"] = np.nan
    good.to_csv(d / "nan_u.csv", index=False)
    (d / "bad.toml").write_text("max_iters = 3\nfoo = 1\n")
    return d


FIT_PKG = ["fit", "--model", "mymodel:make", "--out", "m2.npz"]   # a package.module:factory reference
FIT = ["fit", "--model", "mymodel.py:make", "--data", "good.csv", "-q"]
SIM = ["simulate", "--model", "mymodel.py:make", "--input-file", "good.csv", "--out", "s.csv"]
EVAL = ["evaluate", "--model-file", "m.npz", "--data", "good.csv"]

CASES = [   # (argv, words that the one-line message must contain)
    # the list
    ([*FIT, "--theta0", '{"a": "ten"}', "--out", "o1.npz"], ["--theta0", "'a'", "number"]),
    ([*EVAL, "--k", "abc"], ["--k", "integers"]),
    (["simulate", "--model", "mymodel.py:make", "--horizon", "0", "--out", "s.csv"], ["--horizon", ">= 2"]),
    (["simulate", "--model", "mymodel.py:make", "--horizon", "-5", "--out", "s.csv"], ["--horizon", ">= 2"]),
    ([*FIT, "--config", "xlower.toml", "--out", "o2.npz"], ["x_lower", "number"]),
    ([*FIT, "--config", "float_iters.toml", "--out", "o3.npz"], ["max_iters", "integer", "2.5"]),
    # beyond the list
    ([*FIT, "--theta0", "[1, 2]", "--out", "o4.npz"], ["--theta0", "JSON object"]),
    ([*FIT, "--theta0", '{"a": [1, 2]}', "--out", "o5.npz"], ["--theta0", "shape"]),
    ([*FIT, "--theta0", '{"zzz": 1}', "--out", "o6.npz"], ["--theta0", "unknown parameter", "zzz"]),
    ([*FIT, "--theta0", '{"a": NaN}', "--out", "o6b.npz"], ["--theta0", "finite"]),
    ([*FIT, "--theta0", "{not json", "--out", "o7.npz"], ["--theta0", "JSON"]),
    ([*FIT, "--model-kwargs", '{"a": "x"}', "--out", "o8.npz"], ["mymodel.py:make"]),
    ([*FIT, "--model-kwargs", '{"nope": 1}', "--out", "o8b.npz"], ["nope"]),
    ([*FIT, "--config", "broken.toml", "--out", "o9.npz"], ["--config", "broken.toml"]),
    ([*FIT, "--config", "table.toml", "--out", "o10.npz"], ["smoother", "table"]),
    ([*FIT, "--config", "string_tol.toml", "--out", "o11.npz"], ["tol", "number"]),
    ([*FIT, "--config", "bool_jobs.toml", "--out", "o12.npz"], ["n_jobs", "integer"]),
    ([*FIT, "--config", "missing.toml", "--out", "o13.npz"], ["--config", "missing.toml"]),
    ([*FIT, "--n-jobs", "0", "--out", "o14.npz"], ["n_jobs", ">= 1"]),
    ([*FIT, "--n-jobs", "100000", "--out", "o14b.npz"], ["n_jobs", "cores", "--n-jobs"]),
    ([*FIT, "--model", "mymodel.py:leave", "--out", "o14c.npz"], ["SystemExit", "mymodel.py:leave"]),
    ([*FIT, "--rho-x", "nan", "--out", "o15.npz"], ["rho_x"]),
    ([*FIT, "--tol", "inf", "--out", "o16.npz"], ["tol", "finite"]),
    ([*FIT, "--max-iters", "1.5", "--out", "o17.npz"], ["--max-iters", "invalid int"]),
    ([*FIT, "--out", "good.csv/m.npz"], ["--out", "not a folder"]),
    ([*FIT, "--out", "."], ["--out", "folder"]),
    ([*FIT, "--out", "o18.npz", "--resume", "--overwrite"], ["--resume", "--overwrite"]),
    (["fit", "--model", "mymodel.py:make", "--data", "text.csv", "--out", "o19.npz"], ["non-numeric"]),
    (["fit", "--model", "mymodel.py:make", "--data", "holes.csv", "--out", "o20.npz"], ["trajectory", "empty"]),
    (["fit", "--model", "mymodel.py:make", "--data", "empty.csv", "--out", "o21.npz"], ["empty.csv"]),
    (["fit", "--model", "mymodel.py:make", "--data", "header.csv", "--out", "o22.npz"], ["T >= 2"]),
    (["fit", "--model", "mymodel.py:make", "--data", "flat.npz", "--out", "o23.npz"], ["flat.npz", "shape"]),
    (["fit", "--model", "mymodel.py:make", "--data", ".", "--out", "o24.npz"], ["no such data file"]),
    (["fit", "--model", "mymodel.py", "--data", "good.csv", "--out", "o25.npz"], ["path/to/file.py:factory"]),
    (["fit", "--model", "nope.py:make", "--data", "good.csv", "--out", "o26.npz"], ["no such file", "nope.py"]),
    ([*SIM, "--x0", '[1, "a"]'], ["--x0", "numbers"]),
    ([*SIM, "--x0", "[[1], [2, 3]]"], ["--x0"]),
    ([*SIM, "--x0", "[1, 2]"], ["--x0", "1 numbers"]),
    ([*SIM, "--measurement-std", "-1"], ["--measurement-std", ">= 0"]),
    ([*SIM, "--process-std", "nan"], ["--process-std"]),
    ([*SIM, "--seed", "-1"], ["--seed", ">= 0"]),
    ([*SIM, "--theta", '{"b": "x"}'], ["--theta", "'b'"]),
    ([*EVAL, "--k", "0"], ["--k", ">= 1"]),
    ([*EVAL, "--k", "1,,x"], ["--k"]),
    ([*EVAL, "--k", "1,40"], ["--k", "below 40"]),
    ([*EVAL, "--skip", "-1"], ["--skip", ">= 0"]),
    ([*EVAL, "--skip", "1000"], ["--skip", "fewer than 40"]),
    ([*EVAL, "--x0", "[1, 2, 3]"], ["--x0"]),
    ([*EVAL, "--json", "good.csv/r.json"], ["--json", "not a folder"]),
    (["evaluate", "--model-file", "good.csv", "--data", "good.csv"], ["good.csv", "corrupted or wrong type"]),
    (["plot", "--model-file", "m.npz", "--data", "good.csv", "--trajectory", "5", "--out-dir", "fig"],
     ["--trajectory", "0..0"]),
    (["smooth", "--model-file", "m.npz", "--data", "good.csv", "--out", "good.csv/x.csv"], ["--out"]),
]

REFINE = ["refine", "--model", "osc.py:osc", "--data", "sim.csv", "--out", "bad.npz"]
CAL = ["calibrate-noise", "--model", "osc.py:osc", "--data", "sim.csv", "--out", "bad.npz"]
EVAL_OSC = ["evaluate", "--model", "osc.py:osc", "--data", "sim.csv"]
BAD = [
    ([*REFINE, "--shooting", "0"], ["--shooting", ">= 1"]),
    ([*REFINE, "--time-limit", "-1"], ["--time-limit", "> 0"]),
    ([*REFINE, "--time-limit", "nan"], ["--time-limit"]),
    ([*REFINE, "--max-iter", "0"], ["--max-iter", ">= 1"]),
    ([*REFINE, "--x0", "[1, 2, 3]"], ["--x0", "2 numbers"]),
    ([*REFINE, "--x0", "[1, 2]", "--x0-window", "5"], ["--x0-window", "--x0"]),
    ([*REFINE, "--x0-window", "0"], ["--x0-window", "[1, 120]"]),
    ([*REFINE, "--x0-window", "500"], ["--x0-window", "[1, 120]"]),
    ([*REFINE, "--theta0", '{"k": "a"}'], ["--theta0", "'k'"]),
    ([*REFINE, "--hessian", "exact"], ["--hessian", "unrecognized arguments"]),   # removed (docs/output_error.md)
    ([*REFINE, "--solver", "gn"], ["--solver", "invalid choice"]),
    ([*REFINE[:-1], "sim.csv/x.npz"], ["--out", "not a folder"]),
    ([*CAL, "--grid", "a,b"], ["--grid", "numbers"]),
    ([*CAL, "--grid", "0,1"], ["--grid", "> 0"]),
    ([*CAL, "--grid", "1,1"], ["--grid", "distinct"]),
    ([*CAL, "--grid", ","], ["--grid"]),
    ([*CAL, "--grid", "1,inf"], ["--grid", "finite"]),
    ([*CAL, "--criterion", "aic"], ["--criterion", "invalid choice"]),
    ([*CAL, "--n-jobs", "0"], ["--n-jobs", "cores"]),
    ([*CAL, "--max-iters", "0"], ["--max-iters", ">= 1"]),
    ([*CAL, "--time-limit", "0"], ["--time-limit", "> 0"]),
    ([*CAL, "--holdout-fraction", "1.5"], ["--holdout-fraction", "(0, 1)"]),
    ([*CAL, "--x0-window", "0"], ["--x0-window", ">= 1"]),
    ([*CAL, "--table", "sim.csv/t.csv"], ["--table", "not a folder"]),
    ([*CAL, "--plot", "."], ["--plot", "folder"]),
    ([*EVAL_OSC, "--x0-window", "0"], ["--x0-window", "[1, 119]"]),
    ([*EVAL_OSC, "--x0-window", "120"], ["--x0-window", "[1, 119]"]),
    ([*EVAL_OSC, "--x0", "[1, 2]", "--x0-window", "5"], ["--x0-window", "--x0"]),
    ([*EVAL_OSC, "--x0", "[1]"], ["--x0", "2 numbers"]),
    ([*EVAL_OSC, "--x0-window", "100", "--k", "30"], ["--k", "below 20"]),
    (["plot", "--model", "osc.py:osc", "--data", "sim.csv", "--out-dir", "f", "--x0-window", "-2"], ["--x0-window"]),
    (["fit", "--model", "osc.py:osc", "--data", "sim.csv", "--out", "bad.npz", "--time-limit", "-5"],
     ["time_limit", "> 0"]),
]

CASES += [
    ([*FIT_PKG, "--data", "good.csv", "--outputs", "y0,y7"], ["missing column", "y7"]),
    ([*FIT_PKG, "--data", "nan_u.csv"], ["inputs contain NaN", "rows [7]"]),
    ([*FIT_PKG, "--data", "good.csv", "--max-iter", "3"], ["unrecognized arguments", "--max-iter"]),
    ([*FIT_PKG, "--data", "good.csv", "--config", "bad.toml"], ["unknown option", "foo"]),
    ([*FIT_PKG, "--data", "good.csv", "--tol", "-1"], ["invalid options", "tol"]),
    (["fit", "--model", "no_such_pkg.models:make", "--data", "good.csv", "--out", "m3.npz"],
     ["cannot import module", "no_such_pkg.models"]),
    (["fit", "--model", "mymodel:nope", "--data", "good.csv", "--out", "m4.npz"], ["has no attribute", "nope"]),
    ([*FIT_PKG, "--data", "missing.csv"], ["no such data file"]),
] + BAD


@pytest.mark.parametrize("argv, words", CASES, ids=[f"{i}:{' '.join(c[0][:1] + c[0][-2:])}" for i, c in
                                                     enumerate(CASES)])
def test_bad_input_exit_2_one_line(folder, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(folder)
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"ceem-casadi {argv[0]}: error:"), err
    for w in words:
        assert w in err, (w, err)
