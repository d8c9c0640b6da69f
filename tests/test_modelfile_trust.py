"""Model files never run code by default (issue 15, point 1): crafted files naming ``os:system`` as
factory, or carrying a CasADi ``External`` library, load (or are refused) without anything running."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import casadi as ca
import numpy as np
import pandas as pd
import pytest

import ceem_casadi as cc
from ceem_casadi.deploy._modelfile import (
    FORMAT,
    FORMAT_VERSION,
    ModelFileError,
    load_model,
    read_archive,
    save_model,
    write_archive,
)
from ceem_casadi.runtime._compile import compiler
from models import lorenz

ROOT = Path(__file__).resolve().parents[1]
THETA = {"sigma": 10.3, "rho": 27.1, "beta": 2.55}


@pytest.fixture()
def saved(tmp_path):
    model = lorenz.single_lorenz(measurement_std=0.1)
    path = save_model(tmp_path / "m.npz", model, THETA, source="models.lorenz:single_lorenz",
                      kwargs={"measurement_std": 0.1}, extra={"x0": np.array([[-6.0, -6.0, 24.0]])})
    data, _ = cc.simulate(model, THETA, np.array([[-6.0, -6.0, 24.0]]), 40, measurement_std=0.1, seed=0)
    pd.DataFrame({"y0": data.y[0][:, 0], "y1": data.y[0][:, 1]}).to_csv(tmp_path / "d.csv", index=False)
    return model, data, path


def _craft(path, out, change):
    """Rewrite a model file with ``change(meta, arrays)`` applied and the digests recomputed (a forger's file)."""
    meta, arrays = read_archive(path, expected_format=FORMAT, max_version=FORMAT_VERSION)
    meta.pop("sha256")
    change(meta, arrays)
    return write_archive(out, meta, arrays)


def _cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "ceem_casadi.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_default_load_rebuilds_full_model_from_graphs(saved, tmp_path, monkeypatch):
    """Without trust the model comes from the stored graphs: same values, bounds and priors, no import."""
    model, data, path = saved
    import importlib

    calls = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: calls.append(name) or real(name, *a))
    sm = load_model(path)
    assert calls == []                                 # the factory's module was never imported
    pv = model.theta_vector(THETA)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = 10 * rng.standard_normal(3)
        assert np.array_equal(np.asarray(sm.model.f(x, [], pv)), np.asarray(model.f(x, [], pv)))
        assert np.array_equal(np.asarray(sm.model.rhs(x, [], pv)), np.asarray(model.rhs(x, [], pv)))
    assert sm.model.params.names == model.params.names
    np.testing.assert_array_equal(sm.model.params.lower, model.params.lower)   # beta >= 0 kept
    np.testing.assert_array_equal(sm.model.params.free_mask, model.params.free_mask)
    res = cc.ceem(sm.model, data, sm.theta, options=cc.CEEMOptions(max_iters=2))   # a full model: fit again
    assert res.status in ("converged", "max_iters")


def test_factory_os_system_does_not_run(saved, tmp_path):
    _, _, path = saved
    marker = tmp_path / "ran_os_system"

    def evil(meta, arrays):
        meta["source"], meta["kwargs"] = "os:system", {"command": f"touch {marker}"}

    bad = _craft(path, tmp_path / "evil.npz", evil)
    sm = load_model(bad)                                   # loads from the graphs; the factory is text only
    assert not marker.exists()
    assert sm.source == "os:system" and np.isfinite(sm.predict(np.zeros((5, 2))).loglik)
    proc = _cli("evaluate", "--model-file", bad, "--data", tmp_path / "d.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()


def test_graph_with_foreign_operation_refused(saved, tmp_path):
    _, _, path = saved

    def call_op(meta, arrays):
        code = arrays["sx/f/code"].copy()
        k = int(np.flatnonzero(code[:, 0] == ca.OP_MUL)[0])
        code[k, 0] = ca.OP_CALL
        arrays["sx/f/code"] = code

    with pytest.raises(ModelFileError, match="OP_CALL.*not an elementary math operation"):
        load_model(_craft(path, tmp_path / "call.npz", call_op))

    def out_of_range(meta, arrays):
        code = arrays["sx/g/code"].copy()
        code[0, 1:3] = (7, 10 ** 9)
        arrays["sx/g/code"] = code

    with pytest.raises(ModelFileError, match="out of range"):
        load_model(_craft(path, tmp_path / "range.npz", out_of_range))
    # and on the way in: a model whose f calls another Function (here MX) is not stored at all
    model = load_model(path).model
    x, u, pv = ca.MX.sym("x", 3), ca.MX.sym("u", 0), ca.MX.sym("p", 3)
    mx_f = ca.Function("f", [x, u, pv], [model.f(x, u, pv)], ["x", "u", "p"], ["x_next"])
    with pytest.raises(ModelFileError, match="MXFunction, not an SXFunction"):
        save_model(tmp_path / "mx.npz", cc.StateSpaceModel.from_functions(mx_f, model.g, params=model.params), THETA)


@pytest.mark.skipif(compiler() is None, reason="needs a C compiler to build the External library")
def test_external_library_never_loaded(saved, tmp_path, monkeypatch):
    """A ``casadi/f`` replaced by an External whose library constructor writes a marker file."""
    _, _, path = saved
    monkeypatch.chdir(tmp_path)
    x, u, p = ca.SX.sym("x", 3), ca.SX.sym("u", 0), ca.SX.sym("p", 3)
    ca.Function("f", [x, u, p], [2 * x], ["x", "u", "p"], ["x_next"]).generate("ext.c")
    with open(tmp_path / "ext.c", "a") as fh:
        fh.write('\n#include <stdio.h>\n#include <stdlib.h>\n__attribute__((constructor)) static void mark(void) '
                 '{ const char *m = getenv("CEEM_TEST_MARKER"); if (m) { FILE *q = fopen(m, "w"); if (q) fclose(q); } }\n')
    so = tmp_path / "ext.so"
    subprocess.run([compiler(), "-shared", "-fPIC", str(tmp_path / "ext.c"), "-o", str(so)], check=True)
    blob = np.frombuffer(ca.external("f", str(so)).serialize().encode(), np.uint8)
    marker = tmp_path / "constructor_ran"

    def v1_external(meta, arrays):   # the format-1 layout: CasADi's serialisation in casadi/f, casadi/g
        meta["format_version"] = 1
        g_blob = np.frombuffer(load_model(path).model.g.serialize().encode(), np.uint8)
        for k in [k for k in arrays if k.startswith("sx/")]:
            del arrays[k]
        arrays["casadi/f"], arrays["casadi/g"] = blob, g_blob

    def v2_extra(meta, arrays):      # format 2 with a stray casadi/f array: never read
        arrays["casadi/f"] = blob

    env = {**os.environ, "PYTHONPATH": str(ROOT), "CEEM_TEST_MARKER": str(marker)}
    for change, rc, words in ((v1_external, 2, "trust-source"), (v2_extra, 0, "")):
        bad = _craft(path, tmp_path / f"{change.__name__}.npz", change)
        for flags in ([], ["--saved-functions"]) if change is v1_external else ([],):
            proc = subprocess.run([sys.executable, "-m", "ceem_casadi.cli", "evaluate", "--model-file", str(bad),
                                   "--data", str(tmp_path / "d.csv"), *flags], capture_output=True, text=True,
                                  env=env, cwd=tmp_path, timeout=300)
            assert not marker.exists(), (change.__name__, flags)
            assert proc.returncode == rc, proc.stderr
            assert words in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(ModelFileError, match="format 1.*trust_source=True"):
        load_model(tmp_path / "v1_external.npz")
