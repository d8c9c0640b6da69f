"""Block-oriented models conditioned for real records and the output-error failure of issue 24 on
simulated data (the Chebyshev Wiener-Hammerstein record of scripts/bench_wh_realistic.py)."""
import logging

import numpy as np
import pytest
import scipy.signal as ss

import ceem_casadi as cc
from ceem_casadi.model._block_oriented import block_markov, block_system, dc_gain, nonlinearity, wiener_hammerstein
from ceem_casadi.workflow.initialisation._bla import _den_from_poles, bla_initialise
from ceem_casadi.workflow.output_error._least_squares import output_error_problem
from scripts import bench_wh_realistic as bench

N = 2000


@pytest.fixture(scope="module")
def record():
    u, y0, _, _ = bench.make_record(N, 0)
    noise = 1e-3 * np.sqrt(np.mean(y0 ** 2))
    y = y0 + noise * np.random.default_rng(1).standard_normal(N)
    return cc.Trajectories([y[:, None]], [u[:, None]]), noise


def test_dc_gain_and_chebyshev_model_equal_a_numpy_reference():
    """The CasADi model with gain='dc', basis='chebyshev' equals lfilter of the unit-static-gain
    transfer functions around numpy's chebval."""
    theta = {"g1_den": _den_from_poles(np.array([0.8 * np.exp(0.4j), 0.8 * np.exp(-0.4j), 0.5]), 3),
             "g1_num": np.array([0.3, -0.2, 0.5]), "g2_den": _den_from_poles(np.array([0.7, -0.3]), 2),
             "g2_num": np.array([0.4, 0.1]), "f_coef": np.array([0.1, 1.0, -0.3, 0.2])}
    kw = dict(gain="dc", basis="chebyshev", center=0.2, scale=2.5, out_scale=3.0)
    model = wiener_hammerstein(3, 2, feedthrough=(True, True), theta0=theta, **kw)
    u = np.random.default_rng(0).standard_normal(300)
    y = np.asarray(cc.simulate_output(model, theta, u[:, None], np.zeros(5)))[:, 0]

    def tf(block, n):
        A, B, C, D = block_system(theta[f"{block}_den"], theta[f"{block}_num"], 1.0, gain="dc")
        b, a = ss.ss2tf(A, B[:, None], C[None, :], np.array([[D]]))
        assert abs(np.sum(b) / np.sum(a) - 1.0) < 1e-12                # unit static gain
        return b[0], a
    v = ss.lfilter(*tf("g1", 3), u)
    w = 3.0 * np.polynomial.chebyshev.chebval((v - 0.2) / 2.5, theta["f_coef"])
    np.testing.assert_allclose(y, ss.lfilter(*tf("g2", 2), w), atol=1e-10)
    np.testing.assert_allclose(nonlinearity(theta, v, **{k: kw[k] for k in ("basis", "center", "scale", "out_scale")}),
                               w, atol=1e-12)
    assert abs(float(dc_gain(theta["g1_den"], theta["g1_num"], 1.0)) - 1.0) > 0.1   # the raw block is not unit-gain
    assert block_markov(theta, "g1", True, gain="dc").sum() == pytest.approx(1.0, abs=1e-3)


def test_initialiser_is_scale_invariant_and_reports_the_bla(record, caplog):
    data, _ = record
    kw = dict(feedthrough=(True, True), degree=5, gain="dc", basis="chebyshev")
    with caplog.at_level(logging.ERROR):
        a = bla_initialise("wiener_hammerstein", data, 3, 3, **kw)
        scaled = cc.Trajectories([100.0 * data.y[0]], [10.0 * data.inputs(0)])
        b = bla_initialise("wiener_hammerstein", scaled, 3, 3, **kw)
    for k in a.theta:                                   # y x100, u x10: the same parameters
        np.testing.assert_allclose(b.theta[k], a.theta[k], rtol=1e-6, atol=1e-9)
    assert b.conditioning["out_scale"] == pytest.approx(100 * a.conditioning["out_scale"], rel=1e-12)
    assert b.best.scale == pytest.approx(10 * a.best.scale, rel=1e-9)
    # the BLA's own simulation RMS, checked by lfilter of its transfer function
    bla = a.bla
    num, den = ss.ss2tf(bla.A, bla.B, bla.C, bla.D)
    u, y = data.inputs(0)[:, 0], data.y[0][:, 0]
    yb = ss.lfilter(num[0], den, u - u.mean()) + y.mean()
    skip = min(60, N // 4)
    assert a.bla_rms == pytest.approx(np.sqrt(np.mean((y[skip:] - yb[skip:]) ** 2)), rel=1e-6)
    assert a.best.rms < 0.3 * a.bla_rms                  # the block model beats its BLA (0.19x)
    # a user BLA (the same one as a transfer function) and N4SID options are honoured
    c = bla_initialise("wiener_hammerstein", data, 3, 3, bla=(num[0], den), **kw)
    np.testing.assert_allclose(c.best.rms, a.best.rms, rtol=1e-6)
    d = bla_initialise("wiener_hammerstein", data, 3, 3, n4sid_options={"horizon": 12}, **kw)
    assert d.bla_rms != a.bla_rms
    with pytest.raises(cc.ShapeError, match="order"):
        bla_initialise("wiener_hammerstein", data, 2, 2, bla=(num[0], den), **kw)


def test_conditioned_parameterisation_has_a_better_conditioned_jacobian(record):
    """Unit-column output-error Jacobian at the initialiser, degree 7: 1.3e3 (unit leading Markov
    coefficient, monomials) against 2.4e2 (unit DC gain, Chebyshev) when measured."""
    data, noise = record
    conds = {}
    for gain, basis in (("markov", "monomial"), ("dc", "chebyshev")):
        init = bla_initialise("wiener_hammerstein", data, 3, 3, feedthrough=(True, True), degree=7, gain=gain,
                              basis=basis, measurement_std=noise)
        prob = output_error_problem(init.model, data.lengths, None)
        tv = init.model.params.to_vector(init.theta)
        prob.set_data(init.model, tv, data, False)
        J = prob.evaluate(np.concatenate([tv[prob.free], init.x0.ravel()]), True)[1][:, :prob.free.size]
        conds[gain] = np.linalg.cond(J / np.linalg.norm(J, axis=0))
    assert conds["dc"] < 0.5 * conds["markov"], conds


def test_issue_failure_reproduced_ipopt_fails_and_the_engine_converges(record):
    """The issue's failure on simulated data: the 3+3 Wiener-Hammerstein model with the unit-leading-
    Markov convention and monomials (degree 7), started from bla_initialise. IPOPT with the
    Gauss-Newton Hessian stops with Error_In_Step_Computation (13 iterations when measured) and
    returns its start; the Levenberg-Marquardt engine lowers the cost 30-fold in 40 iterations."""
    data, noise = record
    init = bla_initialise("wiener_hammerstein", data, 3, 3, feedthrough=(True, True), degree=7,
                          measurement_std=noise)
    ip = cc.refine_output_error(init.model, data, init.theta, x0=init.x0,
                                options=cc.OutputErrorOptions(solver="ipopt", max_iters=40))
    lm = cc.refine_output_error(init.model, data, init.theta, x0=init.x0, options=cc.OutputErrorOptions(max_iters=40))
    assert ip.cost <= ip.initial_cost and lm.cost <= lm.initial_cost
    assert lm.success and lm.cost < ip.cost / 10, (ip.message, lm.message)
    assert lm.cost < lm.initial_cost / 30


def test_bench_smoke(tmp_path):
    out = tmp_path / "r.json"
    assert bench.main(["--smoke", "--time-limit", "8", "--json", str(out)]) == 0
    import json

    res = json.loads(out.read_text())
    stages = [r["stage"] for r in res["rows"]]
    assert stages[:4] == ["BLA (N4SID)", "initialiser (BLA split + LS nonlinearity)", "CE-EM",
                          "output error (Levenberg-Marquardt)"]
    oe = res["rows"][3]
    assert oe["est_rms"] < res["rows"][1]["est_rms"] < res["rows"][0]["est_rms"]
    assert 0.1 < res["saturating_fraction"] < 0.3
    assert res["rows"][-1]["est_rms"] == min(r["est_rms"] for r in res["rows"][:4] if np.isfinite(r["est_rms"]))
