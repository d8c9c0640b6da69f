"""CasADi export (ceem_casadi.export): the files load with CasADi alone and equal the model."""
from __future__ import annotations

import json
import subprocess
import sys

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi import export_casadi
from models.cascaded_tanks import cascaded_tanks

# the loader runs in a fresh interpreter (-I: no PYTHONPATH, no user site, cwd not on sys.path)
LOADER = r"""
import json, sys
import casadi as ca, numpy as np
folder, keep = sys.argv[1], sys.argv[2] == "1"
pts = np.load(folder + "/points.npz")
man = json.load(open(folder + "/manifest.json"))
p = np.array(man["p"])
out = {}
for name in man["functions"]:
    F = ca.Function.load(folder + "/" + name + ".casadi")
    vals = []
    for x, u in zip(pts["x"], pts["u"]):
        args = [x, u] + ([p] if keep else [])
        vals.append([np.asarray(v, float).ravel().tolist() for v in F.call(args)])
    out[name] = vals
# Jacobian of the loaded F by CasADi's own AD (a plain SX Function)
F = ca.Function.load(folder + "/F.casadi")
J = F.jacobian()
args = [pts["x"][0], pts["u"][0]] + ([p] if keep else [])
out["F.jacobian"] = [np.asarray(v, float).ravel().tolist() for v in J.call(args + [F.call(args)[0]])]
out["imported"] = "ceem_casadi" in sys.modules
print(json.dumps(out))
"""


def _load_elsewhere(folder, keep):
    proc = subprocess.run([sys.executable, "-I", "-c", LOADER, str(folder), "1" if keep else "0"],
                          capture_output=True, text=True, timeout=120, cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("keep", [False, True])
def test_export_loads_without_ceem_casadi_and_equals_model(tmp_path, keep):
    model = cascaded_tanks()
    theta = model.params.initial()
    theta["b1"] = np.array(0.003)
    res = export_casadi(model, theta, tmp_path, keep_parameters=keep)
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 9.0, (5, 2))
    u = rng.uniform(0.0, 10.0, (5, 1))
    np.savez(tmp_path / "points.npz", x=x, u=u)
    got = _load_elsewhere(tmp_path, keep)
    assert got["imported"] is False
    p = model.theta_vector(theta)
    for i in range(len(x)):
        fx = np.asarray(model.f(x[i], u[i], p)).ravel()
        gx = np.asarray(model.g(x[i], u[i], p)).ravel()
        rx = np.asarray(model.rhs(x[i], u[i], p)).ravel()
        np.testing.assert_allclose(got["F"][i][0], fx, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got["G"][i][0], gx, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got["rhs"][i][0], rx, rtol=1e-12, atol=1e-12)
        # Jacobians against central finite differences of the model's own f (independent of the export)
        h = 1e-6
        fd_x = np.column_stack([(np.asarray(model.f(x[i] + h * e, u[i], p)) - np.asarray(model.f(x[i] - h * e, u[i], p))).ravel()
                                / (2 * h) for e in np.eye(2)])
        fd_u = ((np.asarray(model.f(x[i], u[i] + h, p)) - np.asarray(model.f(x[i], u[i] - h, p))).ravel() / (2 * h))
        np.testing.assert_allclose(np.reshape(got["F_jac"][i][0], (2, 2)), fd_x, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(got["F_jac"][i][1], fd_u, rtol=1e-6, atol=1e-8)
    # CasADi's own .jacobian() of the loaded F equals the saved F_jac
    np.testing.assert_allclose(got["F.jacobian"][0], got["F_jac"][0][0], rtol=1e-12, atol=1e-14)
    assert set(res.files) == {"F", "G", "F_jac", "G_jac", "rhs", "rhs_jac", "manifest"}
    assert res.inputs["F"][-1][0] == ("p" if keep else "u")


def test_export_discrete_model_has_no_rhs_and_result_reports(tmp_path):
    A = np.array([[0.9, 0.1], [0.0, 0.8]])
    params = cc.Parameters(cc.Param("a", 0.5))
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: ca.mtimes(ca.DM(A), x) + p.a * ca.vertcat(u, 0),
                                             lambda x, u, p: x[0], nx=2, nu=1, params=params)
    res = model.export_casadi({"a": 2.0}, tmp_path)
    assert "rhs" not in res.files
    F = ca.Function.load(str(res.files["F"]))
    np.testing.assert_allclose(np.asarray(F([1.0, 2.0], 3.0)).ravel(), A @ [1.0, 2.0] + [6.0, 0.0], rtol=1e-15)
    d = res.to_dict()
    assert json.loads(json.dumps(d))["files"]["F"].endswith("F.casadi")
    assert "F.casadi" in res.table() and "x_next(2, 1)" in res.table()
    assert "ExportResult(" in repr(res) and len(repr(res)) < 200


def test_export_rejects_wrong_theta(tmp_path):
    model = cascaded_tanks()
    with pytest.raises(cc.ParameterError, match="missing"):
        export_casadi(model, {"kp": 0.1}, tmp_path)
