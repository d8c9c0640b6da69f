"""Generated C EKF predictor: compiles with -Werror, equals the Python EKF to 1e-10 relative."""
from __future__ import annotations

import subprocess

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.deploy._codegen import CFLAGS, compile_example, generate_ekf, run_example, write_csv
from ceem_casadi.filtering import EKF
from ceem_casadi.runtime._compile import compiler
from models.linear_mlp import linear_mlp_model

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C compiler")

T = 500


def lorenz_model():
    params = cc.Parameters(cc.Param("sigma", 10.0), cc.Param("rho", 28.0), cc.Param("beta", 8.0 / 3.0))
    C = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])

    def rhs(x, u, p):
        return ca.vertcat(p.sigma * (x[1] - x[0]), x[0] * (p.rho - x[2]) - x[1], x[0] * x[1] - p.beta * x[2])

    return cc.StateSpaceModel.from_ode(rhs, lambda x, u, p: C @ x, nx=3, dt=0.04, params=params,
                                       process_std=0.01, measurement_std=0.1, name="lorenz")


def _relerr(a, b):
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


@pytest.mark.parametrize("case", ["lorenz", "mlp", "mlp_theta_argument"])
def test_generated_ekf_matches_python(case, tmp_path):
    if case == "lorenz":
        model = lorenz_model()
        theta = model.theta_vector({"sigma": 10.2, "rho": 27.5, "beta": 2.7})
        truth = {"sigma": 10.0, "rho": 28.0, "beta": 8.0 / 3.0}
        x0 = np.array([-6.0, -6.0, 24.0])
        data, _ = cc.simulate(model, truth, x0, T, measurement_std=0.1, seed=1)
        u = None
    else:
        model, th = linear_mlp_model()
        theta = truth = model.theta_vector(th)
        x0 = np.zeros(model.nx)
        u = np.random.default_rng(2).standard_normal((T, model.nu))
        data, _ = cc.simulate(model, th, x0, T, u=[u], process_std=0.05, measurement_std=0.1, seed=1)
    y = data.y[0].copy()
    rng = np.random.default_rng(3)
    y[rng.random(y.shape) < 0.1] = np.nan        # entry-wise missing data
    y[7] = np.nan                                # a fully missing sample
    P0, Q, R = np.eye(model.nx), model.noise.process_std ** 2, model.noise.measurement_std ** 2
    gen = generate_ekf(model, theta, tmp_path, name=f"p_{case}", x0=x0 + 0.5, P0=P0, Q=Q, R=R,
                       theta_as_argument=case.endswith("argument"))
    exe = compile_example(gen)                   # -std=c99 -O2 -Wall -Wextra -Werror
    assert "-Werror" in CFLAGS
    y_c, x_c = run_example(exe, y, u, ny=model.ny)
    ref = EKF(model).run(theta, y, u, x0=x0 + 0.5, Sigma0=P0, Q=Q, R=R)
    assert y_c.shape == (T, model.ny) and x_c.shape == (T, model.nx)
    assert _relerr(y_c, ref.y_pred) < 1e-10
    assert _relerr(x_c, ref.x_filt) < 1e-10
    # the predictor is useful: the one-step prediction error is near the measurement noise
    obs = np.isfinite(y)
    assert np.sqrt(np.mean((y_c[20:][obs[20:]] - y[20:][obs[20:]]) ** 2)) < 5 * 0.1 + 0.5 * (case == "lorenz")
    # header sizes allow static allocation; the example also reads a CSV file with a header line
    header = gen.header.read_text()
    assert f"#define P_{case.upper()}_NX {model.nx}" in header
    csv = write_csv(tmp_path / "in.csv", y, u)
    csv.write_text("header\n" + csv.read_text())
    out = subprocess.run([str(exe), str(csv)], capture_output=True, text=True, check=True).stdout
    assert np.allclose(np.array([[float(v) for v in ln.split(",")] for ln in out.splitlines()])[:, :model.ny],
                       y_c, rtol=0, atol=0)
    # run-time parameters: --theta calls <name>_set_theta (refused when theta is folded in)
    other = theta * (1 + 0.01 * np.cos(np.arange(theta.size)))
    proc = subprocess.run([str(exe), "--theta", ",".join(repr(float(v)) for v in other), str(csv)],
                          capture_output=True, text=True)
    if not gen.theta_as_argument:
        assert proc.returncode == 2 and "folded" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        y_o = np.array([[float(v) for v in ln.split(",")] for ln in proc.stdout.splitlines()])[:, :model.ny]
        ref_o = EKF(model).run(other, y, u, x0=x0 + 0.5, Sigma0=P0, Q=Q, R=R)
        assert _relerr(y_o, ref_o.y_pred) < 1e-10 and _relerr(y_o, ref.y_pred) > 1e-6


def test_no_dynamic_allocation_and_bad_name(tmp_path):
    model = lorenz_model()
    gen = generate_ekf(model, model.theta_vector(model.params.initial()), tmp_path, name="lz")
    src = gen.source.read_text()
    for word in ("malloc(", "calloc(", "realloc(", "free("):
        assert word not in src
    with pytest.raises(ValueError, match="C identifier"):
        generate_ekf(model, [10.0, 28.0, 2.6], tmp_path, name="bad-name")
    with pytest.raises(cc.ShapeError, match="a vector of 3 entries, got 2"):
        generate_ekf(model, [10.0, 28.0], tmp_path)


def test_bench_codegen_smoke(tmp_path):
    from scripts import bench_codegen

    res = bench_codegen.main(["--smoke", "--out", str(tmp_path)])
    assert (tmp_path / "bench_codegen.json").exists()
    for row in res["rows"]:
        assert 0 < row["c_us_per_step"] < row["python_us_per_step"]
        assert row["max_rel_diff"] < 1e-10
