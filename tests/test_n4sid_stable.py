"""``n4sid(..., stable=...)``: a stable A where the plain estimate is unstable, against the true system's
poles and Markov parameters (similarity invariants), and no change where the plain A is stable."""
import logging

import numpy as np
import pytest
from scipy.signal import tf2ss

import ceem_casadi as cc
from ceem_casadi.baselines._n4sid import n4sid

# lightly damped 4th-order SISO system: poles 0.97 exp(+-0.4i), 0.9 exp(+-1.2i)
POLES = np.array([0.97 * np.exp(0.4j), 0.97 * np.exp(-0.4j), 0.9 * np.exp(1.2j), 0.9 * np.exp(-1.2j)])


def _system():
    return tf2ss([1.0, 0.5, 0.2, 0.0], np.real(np.poly(POLES)))


def _data(T, noise, seed):
    """Output noise ``noise`` times the output's standard deviation; white unit input."""
    A, B, C, D = _system()
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((T, 1))
    x, y = np.zeros(A.shape[0]), np.empty((T, 1))
    for t in range(T):
        y[t] = C @ x + D @ u[t]
        x = A @ x + B @ u[t]
    y += noise * y.std() * rng.standard_normal(y.shape)
    return cc.Trajectories([y], [u])


def _markov(A, B, C, D, K=30):
    out, M = [D], B
    for _ in range(K):
        out.append(C @ M)
        M = A @ M
    return np.stack(out).ravel()


def _markov_error(res):
    true = _markov(*_system())
    return np.abs(_markov(res.A, res.B, res.C, res.D) - true).max() / np.abs(true).max()


def _radius(A):
    return float(np.max(np.abs(np.linalg.eigvals(A))))


def test_reflect_makes_an_unstable_estimate_stable_and_keeps_the_response(caplog):
    # order 8 on 200 samples with 30 % output noise: spurious modes just outside the unit circle
    data = _data(200, 0.3, seed=7)
    with caplog.at_level(logging.ERROR):
        plain = n4sid(data, order=8)
    assert _radius(plain.A) > 1.02                                    # the case exists (1.031)
    res = n4sid(data, order=8, stable=True)
    assert _radius(res.A) < 1.0
    # eigenvalues: the stable ones of the plain estimate unchanged, the unstable ones 1 / conj(l)
    lam = np.linalg.eigvals(plain.A)
    expected = np.where(np.abs(lam) < 1, lam, 1.0 / np.conj(lam))
    got = np.linalg.eigvals(res.A)
    assert np.abs(np.sort_complex(got) - np.sort_complex(expected)).max() < 1e-8
    # the true poles are still found (distance to the nearest eigenvalue; 0.002 and 0.096 here)
    dist = [np.abs(got - p).min() for p in POLES]
    assert max(dist[:2]) < 0.01 and max(dist[2:]) < 0.15
    # Markov parameters close to the truth (the plain, unstable estimate: 0.10 relative)
    assert _markov_error(res) < 0.15
    y = res.simulate(data.inputs(0), res.x0[0])
    assert np.all(np.isfinite(y)) and np.abs(y).max() < 10 * np.abs(data.y[0]).max()


@pytest.mark.parametrize("stable", [True, "reflect"])
def test_stable_options_always_give_spectral_radius_below_one(stable, caplog):
    unstable = 0
    with caplog.at_level(logging.ERROR):
        for seed in range(12):
            data = _data(100, 0.3, seed)
            unstable += _radius(n4sid(data, order=8).A) >= 1
            assert _radius(n4sid(data, order=8, stable=stable).A) < 1.0
    assert unstable >= 6                                              # the plain estimate often is not


@pytest.mark.parametrize("stable", [True, "reflect"])
def test_stable_changes_nothing_on_a_clean_case(stable):
    data = _data(300, 0.0, seed=1)
    plain, res = n4sid(data, order=4), n4sid(data, order=4, stable=stable)
    assert _radius(plain.A) < 1.0
    for key in ("A", "B", "C", "D"):
        assert np.array_equal(getattr(plain, key), getattr(res, key))
    assert _markov_error(res) < 1e-6


def test_stable_option_validated():
    for stable in ("yes", "maciejowski"):  # Maciejowski's estimate: removed, never better (docs/block_oriented.md)
        with pytest.raises(cc.OptionsError, match="reflect"):
            n4sid(_data(100, 0.0, seed=0), order=2, stable=stable)


def _tanks_available():
    try:
        cc.load_cascaded_tanks()
    except (cc.io.DatasetNotFoundError, OSError):
        return False
    return True


@pytest.mark.skipif(not _tanks_available(), reason="Cascaded Tanks benchmark data not present (../shared/data)")
def test_cascaded_tanks_order_8_is_made_stable_and_simulates_the_test_record():
    """The issue's case: order 8 on the real Cascaded Tanks record is unstable and its free run on the test
    record explodes; with stable=True it simulates the test record better than the stable order-5 model."""
    splits = cc.load_cascaded_tanks()
    est, test = splits["estimation"], splits["test"]
    data = cc.Trajectories([est.y - est.y.mean()], [est.u - est.u.mean()])

    def test_rms(res):
        with np.errstate(all="ignore"):
            y = res.simulate(test.u - est.u.mean(), np.zeros(res.nx)) + est.y.mean()
        return float(np.sqrt(np.mean((y - test.y) ** 2)))

    plain, res = n4sid(data, order=8), n4sid(data, order=8, stable=True)
    assert _radius(plain.A) > 1.0 and not test_rms(plain) < 100.0            # 1.0059, 1.6e7 V
    assert _radius(res.A) < 1.0 and test_rms(res) < 0.65                     # 0.994, 0.607 V
    assert test_rms(res) < test_rms(n4sid(data, order=5))                    # 0.708 V
