"""Compile cache verified (issue 15, point 3): a damaged cached library is rebuilt with a warning,
never loaded (it used to kill every later fit with a bus error). Its key (issue 17) follows the
serialized Function, the flags and the CasADi version, and a hit generates no C."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import casadi as ca
import numpy as np
import pandas as pd
import pytest

import ceem_casadi as cc
from ceem_casadi.deploy._modelfile import load_model
from ceem_casadi.runtime import _compile as cmp
from ceem_casadi.runtime._compile import compiler, verified
from models import lorenz

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(compiler() is None, reason="needs a C compiler")
def test_truncated_library_rebuilt_with_warning(tmp_path):
    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(1, seed=1), 60, measurement_std=0.05, seed=2)
    pd.DataFrame({"y0": data.y[0][:, 0], "y1": data.y[0][:, 1]}).to_csv(tmp_path / "d.csv", index=False)
    (tmp_path / "c.toml").write_text("max_iters = 2\n[smoother]\ncompile = true\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CEEM_CACHE": str(tmp_path / "cache")}

    def fit(out):   # a fresh process each time: a library mapped by this process must not be truncated
        return subprocess.run([sys.executable, "-m", "ceem_casadi.cli", "fit", "--model", "models.lorenz:single_lorenz",
                               "--data", str(tmp_path / "d.csv"), "--config", str(tmp_path / "c.toml"), "--out",
                               str(tmp_path / out), "-q"], env=env, capture_output=True, text=True, timeout=600)

    first = fit("a.npz")
    assert first.returncode in (0, 1), first.stderr
    libs = sorted((tmp_path / "cache").glob("*.so"))
    assert libs and all(verified(lib, compiler()) is None for lib in libs)
    lib = libs[0]
    lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])        # a truncated library
    assert "do not match" in verified(lib, compiler())
    second = fit("b.npz")
    assert second.returncode == first.returncode, second.stderr          # not a bus error (exit -7)
    assert "is not used" in second.stderr and "rebuilding" in second.stderr and str(lib) in second.stderr
    assert verified(lib, compiler()) is None                              # rebuilt and recorded again
    ta, tb = load_model(tmp_path / "a.npz").theta, load_model(tmp_path / "b.npz").theta
    assert all(np.array_equal(ta[k], tb[k]) for k in ta)                  # the same fit from the rebuilt library
    rec = json.loads(lib.with_suffix(".json").read_text())
    rec["compiler_version"] = "gcc 0.1"                                   # another compiler: not trusted either
    lib.with_suffix(".json").write_text(json.dumps(rec))
    assert "compiler_version" in verified(lib, compiler())


def _scaled_sin(c: float) -> ca.Function:
    x = ca.SX.sym("x", 3)
    return ca.Function("scaled_sin", [x], [c * ca.sin(x) + ca.cos(x[0])], ["x"], ["y"])


def test_cache_key_follows_function_flags_and_casadi_version(monkeypatch):
    key = cmp.cache_key([_scaled_sin(2.0)], "k", "gcc")
    assert cmp.cache_key([_scaled_sin(2.0)], "k", "gcc") == key             # rebuilt, same program: same key
    assert cmp.cache_key([_scaled_sin(3.0)], "k", "gcc") != key             # a changed Function
    monkeypatch.setattr(cmp, "FLAGS", (*cmp.FLAGS, "-ffast-math"))
    assert cmp.cache_key([_scaled_sin(2.0)], "k", "gcc") != key             # other flags
    monkeypatch.undo()
    monkeypatch.setattr(cmp.ca, "__version__", "0.0.1")
    assert cmp.cache_key([_scaled_sin(2.0)], "k", "gcc") != key             # another CasADi


@pytest.mark.skipif(compiler() is None, reason="needs a C compiler")
def test_cached_library_loaded_without_generating_c(tmp_path, monkeypatch):
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path))
    x = np.array([0.3, -1.2, 2.0])
    (first,) = cmp.compile_functions([_scaled_sin(2.0)], "reuse")
    expected = np.asarray(_scaled_sin(2.0)(x)).ravel()
    np.testing.assert_allclose(np.asarray(first(x)).ravel(), expected, rtol=1e-15)

    def no_codegen(*_):
        raise AssertionError("C generated for a cached library")

    monkeypatch.setattr(cmp, "_source", no_codegen)
    (again,) = cmp.compile_functions([_scaled_sin(2.0)], "reuse")           # a new, equal Function: cache hit
    np.testing.assert_allclose(np.asarray(again(x)).ravel(), expected, rtol=1e-15)
    assert len(list(tmp_path.glob("reuse_*.so"))) == 1
    with pytest.raises(AssertionError, match="C generated"):                 # a changed one is compiled anew
        cmp.compile_functions([_scaled_sin(3.0)], "reuse")


def test_compiler_lookup_follows_cc_and_path(monkeypatch, tmp_path):
    """The compiler lookup is cached per ($CC, $PATH): a PATH without gcc/cc (and no $CC) finds
    none, a fake ``mycc`` named by $CC on that PATH is found, and the original PATH finds gcc
    again (a cache keyed on nothing would keep returning the first answer)."""
    before = compiler()
    if before is None:
        pytest.skip("no C compiler on this machine")
    fake = tmp_path / "mycc"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert compiler() is None
    monkeypatch.setenv("CC", "mycc")
    assert compiler() == "mycc"
    monkeypatch.undo()
    assert compiler() == before
