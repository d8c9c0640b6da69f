"""Long records (issue 24, item 3): CE-EM's warm start from a fit of the leading samples
(`CEEMOptions.warm_start`, policy WARM_FROM / WARM_LENGTH) reaches the plain fit's optimum, and
`bla_initialise` uses at most INIT_SAMPLES samples and, with ``refine=True``, polishes its theta by
output error on the first REFINE_SAMPLES. On the 6-state Wiener-Hammerstein record of
``scripts/bench_wh_long.py`` (T = 3,000)."""
from __future__ import annotations

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.em._warm_start import warm_start_length
from ceem_casadi.runtime import _policy as policy
from ceem_casadi.workflow import bla_initialise
from scripts.bench_scale_records import make_problem

T = 3000
NOISE = {"process_std": 0.01, "measurement_std": 0.02}


@pytest.fixture(scope="module")
def record():
    _, data, _, _ = make_problem("wh33", T, seed=0)
    init = bla_initialise("wiener_hammerstein", data, 3, 3, refine=True, **NOISE)
    return data, init


def _fit(init, data, **kw):
    return cc.ceem(init.model, data, init.theta, options=cc.CEEMOptions(acceleration="newton", tol=1e-12,
                                                                        max_iters=60, **kw))


def test_warm_start_reaches_the_plain_fits_optimum(record, monkeypatch):
    data, init = record
    plain = _fit(init, data, warm_start=0)
    assert plain.status == "converged" and plain.warm_start is None, plain.message
    # the policy's default, lowered below this record's length: a fit of the first 1,000 samples first
    monkeypatch.setattr(policy, "WARM_FROM", 2000)
    monkeypatch.setattr(policy, "WARM_LENGTH", 1000)
    warm = _fit(init, data)
    assert warm.status == "converged", warm.message
    lead = warm.warm_start
    assert lead is not None and lead.status == "converged" and lead.x[0].shape == (1000, 6)
    assert lead.wall_s > 0 and warm.wall_s > lead.wall_s
    # the whole-record fit starts at the leading fit's theta, not at init.theta
    first = warm.history[0].theta
    assert not np.allclose(first["g2_den"], plain.history[0].theta["g2_den"], rtol=1e-4)
    assert warm.iterations < plain.iterations
    # after a converged warm start the joint step comes first (no plain EM step from the EKF states)
    assert warm.history[0].kind == "newton" and plain.history[0].kind == "em"
    for k in plain.theta:
        np.testing.assert_allclose(warm.theta[k], plain.theta[k], rtol=1e-6, atol=1e-9, err_msg=k)
    assert warm.J == pytest.approx(plain.J, rel=1e-9)


def test_warm_start_length_follows_the_options_and_the_policy():
    default = cc.CEEMOptions().warm_start
    assert warm_start_length(default, (policy.WARM_FROM - 1,)) == 0
    assert warm_start_length(default, (10, policy.WARM_FROM)) == policy.WARM_LENGTH
    assert warm_start_length(0, (10 ** 7,)) == 0
    assert warm_start_length(500, (400, 800)) == 500
    assert warm_start_length(500, (400, 500)) == 0      # nothing longer
    assert warm_start_length(500, (800,), x_init=[np.zeros((800, 1))]) == 0
    assert warm_start_length(500, (800,), executor=object()) == 0
    with pytest.raises(cc.OptionsError, match="warm_start"):
        cc.CEEMOptions(warm_start=-5)


def test_bla_initialise_uses_the_leading_samples_and_polishes_by_output_error(record, monkeypatch):
    data, init = record
    monkeypatch.setattr(policy, "INIT_SAMPLES", 2000)
    monkeypatch.setattr(policy, "REFINE_SAMPLES", 1500)
    head = cc.Trajectories([data.y[0][:2000]], [data.inputs(0)[:2000]])
    cut = bla_initialise("wiener_hammerstein", data, 3, 3, **NOISE)
    ref = bla_initialise("wiener_hammerstein", head, 3, 3, **NOISE)
    assert cut.refinement is None and cut.best.rms == ref.best.rms
    for k in ref.theta:
        np.testing.assert_array_equal(cut.theta[k], ref.theta[k])
    polished = bla_initialise("wiener_hammerstein", data, 3, 3, refine=True, **NOISE)
    lead = cc.Trajectories([data.y[0][:1500]], [data.inputs(0)[:1500]])
    oe = cc.refine_output_error(cut.model, lead, cut.theta, x0=np.zeros((1, 6)))
    assert polished.refinement is not None and polished.refinement.status == "converged"
    for k in oe.theta:
        np.testing.assert_allclose(polished.theta[k], oe.theta[k], rtol=1e-10, atol=1e-12, err_msg=k)
    assert oe.cost < oe.initial_cost  # the polish lowers the split's simulation error on the leading samples
