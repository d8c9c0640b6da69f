"""Messages that used to mislead (issue 25, item 7, API side): each now says what was expected, what
was given and what to change, in the caller's terms."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import ceem_casadi as cc
import ceem_casadi.workflow._noise_calibration as nc
from ceem_casadi.runtime import Status
from models import lorenz


@pytest.fixture(scope="module")
def lorenz_data():
    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, np.array([[-6.0, -6.0, 24.0]]), 60, measurement_std=0.05, seed=1)
    return model, data


def test_no_level_fitted_message_shows_status_values_and_no_time_limit_advice(lorenz_data, monkeypatch):
    """Every level failing without a time limit: the statuses as their values ('solver_failed', not
    '<Status.SOLVER_FAILED: ...>') and no 'raise time_limit' (no limit was given)."""
    model, data = lorenz_data

    class Failed:
        J, status, iterations, x = float("nan"), Status("solver_failed"), 0, None
        theta = lorenz.TRUE

    monkeypatch.setattr(nc, "ceem", lambda *a, **k: Failed())
    with pytest.raises(cc.SolverError) as err:
        cc.calibrate_noise(model, data, lorenz.TRUE, grid=[0.5, 2.0])
    msg = str(err.value)
    assert "solver_failed" in msg and "Status." not in msg and "raise time_limit" not in msg
    assert "0.5: solver_failed" in msg and "2: solver_failed" in msg


def test_overflowing_grid_level_refused_up_front(lorenz_data):
    """grid=[1e300]: its variance overflows; refused before any EKF runs, naming the grid (the old
    message listed the EKF's internal levels and advised 'pass x_init to ceem()')."""
    model, data = lorenz_data
    with pytest.raises(cc.NonFiniteError, match=r"^grid: level 1e\+300") as err:
        cc.calibrate_noise(model, data, lorenz.TRUE, grid=[1e300])
    assert "x_init" not in str(err.value) and "0.0001" not in str(err.value)


def test_diverging_grid_level_named(lorenz_data):
    """A level that makes the EKF diverge is named by its grid value, without ceem's x_init advice."""
    model, data = lorenz_data
    with pytest.raises(cc.NonFiniteError, match="grid level") as err:
        cc.calibrate_noise(model, data, {"sigma": 1e6, "rho": 1e6, "beta": 1e6}, grid=[1.0],
                           options=cc.NoiseCalibrationOptions(ceem=cc.CEEMOptions(max_iters=1)))
    assert "x_init" not in str(err.value) and "ceem()" not in str(err.value)


def test_uncertainty_on_data_of_another_length_names_the_fits_states(lorenz_data):
    """A CEEMResult of 60-sample data with 40-sample data: the message names result.x and the two sets
    of lengths, not x_init (which the caller never passed)."""
    model, data = lorenz_data
    fit = cc.ceem(model, data, {"sigma": 9.5, "rho": 27.5, "beta": 2.6}, options=cc.CEEMOptions(max_iters=2))
    short = cc.Trajectories([data.y[0][:40]])
    with pytest.raises(cc.ShapeError, match=r"result\.x") as err:
        cc.parameter_uncertainty(model, short, fit)
    assert "x_init" not in str(err.value) and "[60]" in str(err.value) and "[40]" in str(err.value)


@pytest.mark.parametrize("y,window,match", [([], None, "at least one sample"),
                                            (np.zeros((0, 2)), None, "at least one sample"),
                                            (np.ones((20, 2)), float("nan"), "window: expected an integer"),
                                            (np.ones((20, 2)), True, "window: expected an integer")])
def test_estimate_initial_state_bad_inputs(lorenz_data, y, window, match):
    """[] raised 'min() arg is an empty sequence', window=nan 'cannot convert float NaN to integer',
    window=True was taken as 1."""
    model, _ = lorenz_data
    with pytest.raises(cc.ShapeError, match=match):
        cc.estimate_initial_state(model, y, model.theta_vector(lorenz.TRUE), window=window)


def test_closed_dask_client_clear_message(lorenz_data):
    """A closed Client: OptionsError saying it is closed (was: 'IOLoop is closed' deep in the fit), both
    when the options are made and when a fit starts with a Client closed since."""
    distributed = pytest.importorskip("dask.distributed")
    model, data = lorenz_data
    client = distributed.Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None)
    opts = cc.CEEMOptions(max_iters=1, executor=client)
    client.close()
    with pytest.raises(cc.OptionsError, match="Client is closed"):
        cc.ceem(model, data, lorenz.TRUE, options=opts)
    with pytest.raises(cc.OptionsError, match="Client is closed"):
        cc.CEEMOptions(executor=client)


def test_trust_source_load_warns(tmp_path, caplog):
    model = lorenz.single_lorenz()
    path = cc.save_model(tmp_path / "m.npz", model, lorenz.TRUE, source="models.lorenz:single_lorenz")
    with caplog.at_level(logging.WARNING):
        cc.load_model(path, trust_source=True)
    assert any("runs its code" in r.getMessage() and "models.lorenz:single_lorenz" in r.getMessage()
               for r in caplog.records)


def test_uncertainty_at_a_point_that_is_not_a_maximum_warns(lorenz_data):
    """A theta dict from a fit stopped after one iteration: the intervals would be many standard errors
    from the estimate; the warning says how far (one Newton step in standard errors). At a fixed point
    of CE-EM no such warning. Fails without _off_maximum in workflow/_uncertainty."""
    model, data = lorenz_data
    early = cc.ceem(model, data, {"sigma": 8.0, "rho": 25.0, "beta": 2.0}, options=cc.CEEMOptions(max_iters=1))
    unc = cc.parameter_uncertainty(model, data, dict(early.theta))
    assert any("is not a maximum" in w and "standard errors" in w for w in unc.warnings), unc.warnings
    done = cc.ceem(model, data, lorenz.TRUE, options=cc.CEEMOptions(max_iters=40, acceleration="newton"))
    unc = cc.parameter_uncertainty(model, data, dict(done.theta))
    assert not any("is not a maximum" in w for w in unc.warnings), unc.warnings
    unc = cc.parameter_uncertainty(model, data, early)        # a stopped CEEMResult: its status, as a value
    assert any("status is 'max_iters'" in w for w in unc.warnings) and not any("Status." in w for w in unc.warnings)
