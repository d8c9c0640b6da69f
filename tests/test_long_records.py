"""Long records (issue 17): the memory-saving paths give the same numbers as the plain ones."""
from __future__ import annotations

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.filtering import EKF, rts_smoother
from ceem_casadi.filtering._ekf import rts_gains, rts_means
from ceem_casadi.objective._stages import StageFunctions
from ceem_casadi.runtime import _compile as compile_mod
from ceem_casadi.runtime._compile import compiler
from ceem_casadi.smoothing._smoother import TrajectorySmoother
from models import lorenz
from models.linear_mlp import linear_mlp_model


@pytest.fixture(scope="module")
def record():
    model = lorenz.single_lorenz(process_std=0.05, measurement_std=0.1)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(1, seed=4), 61, measurement_std=0.1,
                          process_std=0.05, seed=5)
    y = data.y[0].copy()
    y[[3, 17, 40], 1] = np.nan  # missing entries
    return model, y


def _run(model, y, chunk):
    ekf = EKF(model)
    ekf.chunk = chunk
    return ekf.run(model.theta_vector(lorenz.perturbed(lorenz.TRUE, 0.05, seed=1)), y, x0=[-6.0, -6, 24],
                   Sigma0=4.0, Q=1e-2, R=0.01, engine="casadi")


def test_chunked_ekf_equals_one_mapaccum(record):
    """Forward pass in mapaccum chunks of 7 (carrying x, P) == one mapaccum over all 61 steps."""
    model, y = record
    one, chunked = _run(model, y, 10**6), _run(model, y, 7)
    for name in ("y_pred", "S", "x_pred", "P_pred", "x_filt", "P_filt", "A"):
        np.testing.assert_allclose(getattr(chunked, name), getattr(one, name), rtol=1e-10, atol=1e-10)
    assert chunked.loglik == pytest.approx(one.loglik, rel=1e-12)


@pytest.mark.parametrize("chunk", [20_000, 7])
def test_rts_means_equal_rts_loop(record, monkeypatch, chunk):
    """Banded solve for the smoothed means, in one piece or chunks of 7 solved from the end (each with the
    next chunk's first mean as its known last row), and the means-only EKF pass (gains per EKF chunk of 5,
    no covariances kept) == the RTS backward loop (oracle: rts)."""
    from ceem_casadi.filtering import _ekf

    monkeypatch.setattr(_ekf, "RTS_CHUNK", chunk)
    model, y = record
    res = _run(model, y, 10**6)
    G = rts_gains(res.A, res.P_filt[:-1], res.P_pred[1:])
    np.testing.assert_allclose(rts_means(res.x_filt, res.x_pred, G), rts_smoother(res).x_smooth, rtol=1e-10, atol=1e-10)
    ekf = EKF(model)
    ekf.chunk = 5
    (lean,) = ekf.run_many(model.theta_vector(lorenz.perturbed(lorenz.TRUE, 0.05, seed=1)), [y], x0=[-6.0, -6, 24],
                           Sigma0=4.0, Q=1e-2, R=0.01, means=True)
    assert lean.P_filt is None and lean.loglik == res.loglik
    np.testing.assert_allclose(lean.x_smooth, rts_means(res.x_filt, res.x_pred, G), rtol=1e-12, atol=1e-12)


def _derivatives(ts, x, P):
    c = float(ts.cost_function(x.ravel(), P))
    _, g = ts.solver.get_function("nlp_grad_f")(x.ravel(), P)
    H = ts.solver.get_function("nlp_hess_l")(x.ravel(), P, 1.0, [])
    return c, np.asarray(g).ravel(), np.asarray(ca.densify(H))


@pytest.mark.parametrize("make, chunk", [("lorenz", 7), ("lorenz", 10), ("mlp", 4)])
def test_chunked_smoother_equals_plain(make, chunk):
    """Cost, gradient, Hessian and the smoothed optimum of the chunked formulation (chunks of 7:
    padded; of 10: exact fit; with inputs) equal the plain one's to 1e-10 (x1 prior, rho, NaN)."""
    if make == "lorenz":
        model = lorenz.single_lorenz(process_std=0.1, measurement_std=0.5).with_noise(x1_mean=[0, 0, 20], x1_std=5)
        theta = model.theta_vector(lorenz.TRUE)
    else:
        model, th = linear_mlp_model(nx=4, nu=2, ny=2, hidden=3)
        theta = model.theta_vector(th)
    T, rng = 30, np.random.default_rng(3)
    u = rng.standard_normal((T, model.nu))
    data, xt = cc.simulate(model, model.params.from_vector(theta), [rng.standard_normal(model.nx) + (
        [0, 0, 20] if make == "lorenz" else 0)], T, u=[u], process_std=0.1, measurement_std=0.5, seed=4)
    y = data.y[0].copy()
    y[5, 1] = np.nan
    stages = StageFunctions(model, "gauss-newton")
    plain = TrajectorySmoother(stages, T, cc.SmootherOptions(chunk=0))
    split = TrajectorySmoother(stages, T, cc.SmootherOptions(chunk=chunk))
    x = xt[0] + 0.3 * rng.standard_normal((T, model.nx))
    P = plain.parameter_vector(model, theta, y, u, x + 0.1, 0.3)
    for a, b in zip(_derivatives(split, x, P), _derivatives(plain, x, P)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    opt_split, opt_plain = split.solve(model, theta, y, u, x), plain.solve(model, theta, y, u, x)
    assert opt_plain.success and opt_split.success
    np.testing.assert_allclose(opt_split.x, opt_plain.x, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(compiler() is None, reason="needs a C compiler")
def test_parallel_compile_links_every_function_and_picks_levels(tmp_path, monkeypatch):
    """Functions compiled by 2 gcc processes, each into its own cached library, give the SX
    Functions' numbers; the longer program gets -O0 above O1_MAX_INSTRUCTIONS."""
    monkeypatch.setenv("CEEM_CACHE", str(tmp_path))
    stages = StageFunctions(lorenz.single_lorenz())
    raw = [stages._build(n) for n in ("obs_x_grad", "dyn_x_hess_triu", "dyn_cost")]
    monkeypatch.setattr(compile_mod, "O1_MAX_INSTRUCTIONS", raw[1].n_instructions() - 1)
    assert [compile_mod.opt_level(f) for f in raw] == ["-O1", "-O0", "-O1"]
    built = compile_mod.compile_functions(raw, "ceem_test_parallel", jobs=2)
    assert len(list(tmp_path.glob("*.so"))) == 3
    rng = np.random.default_rng(0)
    for f, g in zip(raw, built):
        args = [rng.standard_normal(f.sparsity_in(i).shape) for i in range(f.n_in())]
        for a, b in zip(f.call(args), g.call(args)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12, atol=1e-12)


def test_buffered_call_keeps_no_inputs_alive():
    """A BufferedCall drops its inputs after the call: a view of a record (what the chunked objectives pass)
    must not keep the whole record alive (it held 170 MB at T = 10^6)."""
    import gc
    import weakref

    from ceem_casadi.runtime._linalg import BufferedCall

    x = ca.MX.sym("x", 3)
    call = BufferedCall(ca.Function("twice", [x], [2 * x]))
    record = np.arange(6.0)
    alive = weakref.ref(record)
    np.testing.assert_array_equal(call(record[:3])[0], [0.0, 2.0, 4.0])
    del record
    gc.collect()
    assert alive() is None
