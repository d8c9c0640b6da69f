"""Long records (issue 17): the memory-saving paths give the same numbers as the plain ones."""
from __future__ import annotations

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.baselines.ekf import EKF, rts, rts_means
from models import lorenz


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


def test_rts_means_equal_rts_loop(record):
    """Banded solve for the smoothed means == the RTS backward loop (oracle: rts)."""
    model, y = record
    res = _run(model, y, 10**6)
    np.testing.assert_allclose(rts_means(res), rts(res).x_smooth, rtol=1e-10, atol=1e-10)
