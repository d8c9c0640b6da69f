"""The nonparametric BLA of periodic data (workflow/initialisation/_frf.py) and its use by bla_initialise.

Oracles: the true frequency response of a linear system (scipy's lfilter, an independent
simulation), its poles and zeros; for a Wiener-Hammerstein system, the N4SID route of
bla_initialise on the same records.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import scipy.signal as ss

import ceem_casadi as cc
from ceem_casadi.errors import DataError, OptionsError, ShapeError
from ceem_casadi.workflow import FRF, bla_initialise, estimate_frf, fit_frf

B_LIN = np.array([0.0, 0.3, -0.1, 0.05])
A_LIN = np.real(np.poly([0.9 * np.exp(0.4j), 0.9 * np.exp(-0.4j), 0.6]))
B1, A1 = np.array([0.0, 1.0, -0.6, 0.3]), np.real(np.poly([0.9 * np.exp(0.4j), 0.9 * np.exp(-0.4j), 0.5]))
B2, A2 = np.array([0.5, -0.2, 0.3, 0.0]), np.real(np.poly([0.8 * np.exp(1.0j), 0.8 * np.exp(-1.0j), -0.4]))


def multisine(N: int, kmax: int, rng) -> np.ndarray:
    """One period of a random-phase multisine with flat amplitude on bins 1..kmax, unit RMS."""
    k, t = np.arange(1, kmax + 1), np.arange(N)
    u = np.cos(2 * np.pi * np.outer(t, k) / N + rng.uniform(0, 2 * np.pi, kmax)).sum(1)
    return u / np.std(u)


def records(system, N, P, M, kmax, noise_rel, seed):
    """M realisations of P periods (the first one the transient) through ``system``, output noise
    ``noise_rel`` x std(y)."""
    rng = np.random.default_rng(seed)
    ys, us = [], []
    for _ in range(M):
        u = np.tile(multisine(N, kmax, rng), P)
        y = system(u)
        ys.append((y + noise_rel * np.std(y) * rng.standard_normal(u.size))[:, None])
        us.append(u[:, None])
    return cc.Trajectories(ys, us)


def linear(u):
    return ss.lfilter(B_LIN, A_LIN, u)


def wh(u, s=10.0):
    v = ss.lfilter(B1, A1, u) / s
    return ss.lfilter(B2, A2, v + 0.25 * v ** 2 - 0.12 * v ** 3)


def response(b, a, freqs):
    zi = np.exp(-2j * np.pi * freqs)
    return np.polyval(b[::-1], zi) / np.polyval(a[::-1], zi)


def _hausdorff(p, q):
    d = np.abs(np.asarray(p)[:, None] - np.asarray(q)[None])
    return max(d.min(0).max(), d.min(1).max())


def test_frf_equals_the_true_response_within_its_std_and_the_fit_recovers_poles_and_zeros():
    data = records(linear, 256, 6, 4, 100, 0.02, seed=0)
    frf = estimate_frf(data, 256)
    assert frf.bins.tolist() == list(range(1, 101)) and (frf.periods, frf.realisations) == (5, 4)
    assert np.allclose(frf.freqs, frf.bins / 256)
    G0 = response(B_LIN, A_LIN, frf.freqs)
    z = (frf.G - G0) / frf.std_noise              # complex normal, unit variance: E|z|^2 = 1
    assert 0.7 < np.mean(np.abs(z) ** 2) < 1.4 and np.abs(z).max() < 4.0
    # a linear system has no nonlinear distortion: the spread over realisations is the noise's
    assert 0.6 < np.median(frf.std_total / frf.std_noise) < 1.5
    fit = fit_frf(frf, 3, feedthrough=False)
    assert _hausdorff(fit.poles, np.roots(A_LIN)) < 0.01
    assert _hausdorff(fit.zeros, np.roots(B_LIN[1:])) < 0.02
    assert fit.b[0] == 0.0 and not fit.stabilised
    assert fit.cost / fit.dof < 1.5                 # the model explains the FRF within its uncertainty
    assert np.abs(fit.response(frf.freqs) - G0).max() < 3 * frf.std_noise.max()


def test_frf_of_a_nonlinear_system_shows_its_distortions():
    frf = estimate_frf(records(lambda u: wh(u, 6.0), 256, 3, 6, 127, 0.01, seed=1), 256)
    assert np.median(frf.distortion_std / frf.std_noise) > 3.0


def test_non_periodic_input_or_wrong_period_is_refused():
    data = records(linear, 256, 3, 2, 100, 0.05, seed=2)
    with pytest.raises(ShapeError, match="does not divide the length 768"):
        estimate_frf(data, 250)
    with pytest.raises(DataError, match="not periodic with period=192"):
        estimate_frf(data, 192)                      # divides 768, but the input has period 256
    rng = np.random.default_rng(3)
    u = rng.standard_normal((768, 1))
    with pytest.raises(DataError, match="input of trajectory 0 is not periodic"):
        estimate_frf(cc.Trajectories([linear(u[:, 0])[:, None]], [u]), 256)
    # a periodic input but an output whose periods differ far beyond the noise (a drift)
    y = data.y[0] + np.linspace(0, 20, 768)[:, None]
    with pytest.raises(DataError, match="output of trajectory 0 is not periodic"):
        estimate_frf(cc.Trajectories([y], [data.u[0]]), 256)
    with pytest.raises(DataError, match="not periodic"):
        bla_initialise("wiener", cc.Trajectories([linear(u[:, 0])[:, None]], [u]), 3, period=256)
    with pytest.raises(OptionsError, match="needs the input's period"):
        bla_initialise("wiener", data, 3, bla="frf")
    with pytest.raises(OptionsError, match="period"):
        estimate_frf(data, 2.5)
    with pytest.raises(OptionsError, match="expected an FRF"):
        fit_frf(data, 3)


def _routes(data, N, s):
    """Validation RMS (fresh multisine, noise-free, from rest) and initialisers of the three routes."""
    uv = np.tile(multisine(N, 255, np.random.default_rng(100)), 2)
    yv = wh(uv, s)
    rms, inits = {}, {}
    for route, kw in (("n4sid", {}), ("frf", {"period": N, "bla": "frf"}), ("both", {"period": N})):
        init = bla_initialise("wiener_hammerstein", data, 3, 3, **kw)
        yh = np.ravel(cc.simulate_output(init.model, init.theta, uv[:, None], np.zeros(init.model.nx)))
        rms[route], inits[route] = float(np.sqrt(np.mean((yv[N:] - yh[N:]) ** 2))), init
    return rms, inits, float(np.std(yv))


@pytest.mark.parametrize("seed", [0, 1])
def test_bla_initialise_from_the_frf_simulates_no_worse_than_from_n4sid(seed, caplog):
    """Wiener-Hammerstein, 8 random-phase multisine realisations of 3 periods (12,288 samples),
    1 % output noise, a mild nonlinearity: the FRF's BLA gives the better initial model, and
    ``period=`` alone (both BLAs tried) chooses it on the estimation data."""
    N = 512
    data = records(wh, N, 3, 8, 255, 0.01, seed=seed)
    with caplog.at_level(logging.ERROR):
        rms, inits, std_y = _routes(data, N, 10.0)
    frf = inits["frf"]
    assert isinstance(frf.frf, cc.workflow.FRFFit) and frf.frf.a.size == 7 and frf.best.bla == "frf"
    # the BLA used is the FRF's fit: its poles are the split's
    assert _hausdorff(np.concatenate([frf.best.g1_poles, frf.best.g2_poles]), frf.frf.poles) < 1e-6
    # measured (seeds 0, 1): FRF 0.0043 / 0.0060 against N4SID 0.0112 / 0.0143 (std y 0.29)
    assert rms["frf"] <= rms["n4sid"], rms
    assert rms["frf"] < 0.05 * std_y
    assert inits["both"].best.bla == "frf" and rms["both"] == pytest.approx(rms["frf"], rel=1e-9)
    assert {s.bla for s in inits["both"].table} == {"frf", "n4sid"}


def test_with_period_both_blas_are_tried_and_the_better_split_on_estimation_data_wins(caplog):
    """A strong nonlinearity and 4 realisations: the per-bin distortions dominate the FRF, whose
    BLA gives a poor initial model (measured: validation RMS 0.39 against N4SID's 0.032);
    ``period=`` then keeps N4SID's split, chosen on the estimation data."""
    N = 512
    data = records(lambda u: wh(u, 6.0), N, 3, 4, 255, 0.01, seed=0)
    with caplog.at_level(logging.ERROR):
        rms, inits, _ = _routes(data, N, 6.0)
    assert rms["frf"] > 2 * rms["n4sid"], rms
    best = inits["both"].best
    assert best.bla == "n4sid" and best.rms == min(inits["n4sid"].best.rms, inits["frf"].best.rms)
    assert rms["both"] == pytest.approx(rms["n4sid"], rel=1e-9)
    assert inits["both"].bla_rms == pytest.approx(inits["n4sid"].bla_rms, rel=1e-12)


def test_fit_frf_without_std_uses_unit_weights_and_refuses_too_few_bins():
    f = np.arange(1, 30) / 64
    G = response(np.array([0.0, 0.2, 0.1]), np.array([1.0, -1.2, 0.5]), f)
    frf = FRF(f, np.arange(1, 30), G, np.full(29, np.nan), np.full(29, np.nan), 64, 1, 1, 1.0)
    fit = fit_frf(frf, 2, feedthrough=False)
    assert np.allclose(fit.a, [1.0, -1.2, 0.5]) and np.allclose(fit.b, [0.0, 0.2, 0.1])
    few = FRF(f[:2], np.arange(1, 3), G[:2], np.ones(2), np.ones(2), 64, 1, 1, 1.0)
    with pytest.raises(ShapeError, match="2 bins"):
        fit_frf(few, 2)


def test_subspace_start_recovers_exact_poles():
    """The frequency-domain subspace start of fit_frf (noise-free FRF of the 6th-order product G2 G1)."""
    from ceem_casadi.workflow.initialisation._frf_fit import _subspace_poles

    f = np.arange(1, 201) / 512
    G0 = response(np.convolve(B1, B2), np.convolve(A1, A2), f)
    p = _subspace_poles(f, G0, np.ones(200), 1.0, 6, 12)
    assert _hausdorff(p, np.roots(np.convolve(A1, A2))) < 1e-6


def test_period_auto_detects_the_period_or_falls_back_to_n4sid(caplog):
    from ceem_casadi.workflow.initialisation._frf import detect_period

    data = records(linear, 256, 3, 2, 100, 0.05, seed=4)
    assert detect_period(data) == 256                                 # not 512 = 2 N, nor a divisor of N
    auto, given = estimate_frf(data, "auto"), estimate_frf(data, 256)
    assert auto.period == 256 and np.array_equal(auto.G, given.G)
    u = np.random.default_rng(5).standard_normal((768, 1))
    aperiodic = cc.Trajectories([linear(u[:, 0])[:, None]], [u])
    assert detect_period(aperiodic) is None
    # a second realisation with period 96 (480 samples): no common period (a multiple would do: 128 x 2 = 256)
    other = np.tile(u[:96], (5, 1))
    assert detect_period(cc.Trajectories([data.y[0], other], [data.u[0], other])) is None
    assert detect_period(cc.Trajectories([data.y[0], data.y[0][:512]], [data.u[0], np.tile(data.u[0][:128], (4, 1))])) \
        == 256
    with pytest.raises(DataError, match="period='auto'"):
        estimate_frf(aperiodic, "auto")
    with caplog.at_level(logging.ERROR):
        fallback = bla_initialise("wiener", aperiodic, 3, period="auto")
        both = bla_initialise("wiener", data, 3, period="auto")
    assert fallback.frf is None and {s.bla for s in fallback.table} == {"n4sid"}
    assert both.frf is not None and {s.bla for s in both.table} == {"n4sid", "frf"}
    with pytest.raises(DataError, match="not periodic"):
        bla_initialise("wiener", aperiodic, 3, period="auto", bla="frf")


def test_fit_frf_reflects_unstable_poles_into_the_unit_circle():
    """The FRF of an unstable first-order system (pole 1.25): the fit keeps its magnitude shape with
    the pole reflected to 1 / 1.25 = 0.8 (|G| of the reflected system is proportional), B refitted."""
    f = np.arange(1, 60) / 128
    G = response(np.array([0.0, 1.0]), np.array([1.0, -1.25]), f)
    frf = FRF(f, np.arange(1, 60), G, np.full(59, np.nan), np.full(59, np.nan), 128, 1, 1, 1.0)
    fit = fit_frf(frf, 1, feedthrough=False)
    assert fit.stabilised and np.allclose(fit.poles, [0.8], atol=1e-9)
    ratio = np.abs(fit.response(f)) / np.abs(G)
    assert np.ptp(ratio) < 1e-6 * ratio.mean()
