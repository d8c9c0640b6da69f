"""The validation layer (issue 23, item 5): one check of data and one schema of options, called by
every public entry point and by the CLI, with the same message from both (bugs 3 and 5)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import ceem_casadi as cc
from ceem_casadi.cli import main
from ceem_casadi.errors import DataError
from models import lorenz

THETA = {"sigma": 9.0, "rho": 26.0, "beta": 3.0}


@pytest.fixture(scope="module")
def lorenz_problem():
    model = lorenz.single_lorenz(measurement_std=0.05)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(1, seed=1), 40, measurement_std=0.05, seed=2)
    nan = cc.Trajectories([np.full_like(data.y[0], np.nan)])
    return model, data, nan


ENTRY_POINTS = {
    "ceem": lambda m, d: cc.ceem(m, d, THETA),
    "ceem_checkpointed": lambda m, d: cc.ceem_checkpointed(m, d, THETA, "/nonexistent-dir/never-written.npz"),
    "refine_output_error": lambda m, d: cc.refine_output_error(m, d, THETA),
    "estimate_initial_state": lambda m, d: cc.estimate_initial_state(m, d, THETA),
    "estimate_initial_state(array)": lambda m, d: cc.estimate_initial_state(m, d.y[0], THETA),
    "calibrate_noise": lambda m, d: cc.calibrate_noise(m, d, THETA, grid=[1.0]),
    "validation_report": lambda m, d: cc.validation_report(m, d, THETA),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_all_nan_outputs_are_refused_with_one_message_by_every_entry_point(lorenz_problem, entry):
    """Bug 3: refine_output_error reported "converged" with theta moved far, estimate_initial_state
    returned zeros; every entry point now raises the error fit raises."""
    model, _, nan = lorenz_problem
    with pytest.raises(DataError) as info:
        ENTRY_POINTS[entry](model, nan)
    assert str(info.value).startswith("trajectory 0: every output is missing (NaN)")


@pytest.mark.parametrize("command", ["fit", "refine", "calibrate-noise", "smooth"])
def test_the_cli_gives_the_same_message_as_the_library(lorenz_problem, tmp_path, monkeypatch, capsys, command):
    model, _, nan = lorenz_problem
    with pytest.raises(DataError) as info:
        cc.ceem(model, nan, THETA)
    pd.DataFrame({"y0": np.full(40, np.nan), "y1": np.full(40, np.nan)}).to_csv(tmp_path / "nan.csv", index=False)
    monkeypatch.chdir(tmp_path)
    rc = main([command, "--model", "models.lorenz:single_lorenz", "--data", "nan.csv", "--out", "m.npz",
               *([] if command == "smooth" else ["-q"])])
    err = capsys.readouterr().err
    assert rc == 2 and str(info.value) in err, err


def test_an_output_never_observed_is_refused_by_name(lorenz_problem):
    model, data, _ = lorenz_problem
    y = data.y[0].copy()
    y[:, 1] = np.nan
    with pytest.raises(DataError, match=r"output\(s\) \['y\[:, 1\]'\] are NaN in every row"):
        cc.refine_output_error(model, cc.Trajectories([y]), THETA)


def test_a_window_without_observations_is_refused(lorenz_problem):
    model, data, _ = lorenz_problem
    y = data.y[0].copy()
    y[:10] = np.nan
    with pytest.raises(DataError, match="first 10 samples"):
        cc.estimate_initial_state(model, y, THETA, window=10)


@pytest.mark.parametrize("make, words", [
    (lambda: cc.CEEMOptions(n_jobs=2.5), ["CEEMOptions.n_jobs", "an integer", "2.5"]),
    (lambda: cc.LearnerOptions(max_iters=2.5), ["LearnerOptions.max_iters", "an integer"]),
    (lambda: cc.CEEMOptions(max_iters="3"), ["CEEMOptions.max_iters", "an integer", "'3' (str)"]),
    (lambda: cc.SmootherOptions(rho_x="a"), ["SmootherOptions.rho_x", "a finite number"]),
    (lambda: cc.SmootherOptions(tol=float("nan")), ["SmootherOptions.tol", "a finite number"]),
    (lambda: cc.SmootherOptions(x_lower=[0.0, 1.0, 0.0], x_upper=[1.0, 0.0, 1.0]), ["lower bound", "entry 1"]),
    (lambda: cc.SmootherOptions(x_lower="low"), ["SmootherOptions.x_lower", "a number or a list"]),
    (lambda: cc.OutputErrorOptions(x_lower=2.0, x_upper=1.0), ["lower bound must not exceed"]),
    (lambda: cc.OutputErrorOptions(use_prior=1), ["OutputErrorOptions.use_prior", "true or false"]),
    (lambda: cc.NoiseCalibrationOptions(holdout_fraction="0.2"), ["NoiseCalibrationOptions.holdout_fraction"]),
    (lambda: cc.UncertaintyOptions(use_prior=1), ["UncertaintyOptions.use_prior", "true or false"]),
    (lambda: cc.learning.AdamOptions(epochs=2.0), ["AdamOptions.epochs", "None or an integer"]),
    (lambda: cc.CEEMOptions(smoother={"rho_x": 1.0}), ["CEEMOptions.smoother", "a SmootherOptions"]),
    (lambda: cc.CEEMOptions(joint_hessian="exact"), ["joint_hessian='exact'", "acceleration='joint'"]),
    (lambda: cc.CEEMOptions(acceleration="newton", joint_hessian="gauss-newton"), ["acceleration='newton'"]),
])
def test_options_are_checked_by_one_schema(make, words):
    """Bug 5: these were accepted (n_jobs=2.5, max_iter=2.5), or raised a raw TypeError or a CasADi
    assertion; every option dataclass now checks its annotated types and cross-field rules."""
    with pytest.raises(cc.OptionsError) as info:
        make()
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_schema_kinds_come_from_the_annotations():
    from ceem_casadi.runtime._schema import field_kinds

    kinds = field_kinds(cc.CEEMOptions)
    assert kinds["max_iters"].kind is int and not kinds["max_iters"].optional
    assert kinds["warm_start"].kind is int and kinds["warm_start"].optional
    assert kinds["smoother"].kind is cc.SmootherOptions
    # the file path (from_mapping) and the constructor give one message for one mistake
    with pytest.raises(cc.OptionsError) as a:
        cc.CEEMOptions.from_mapping({"smoother": {"max_iters": 2.5}})
    with pytest.raises(cc.OptionsError) as b:
        cc.SmootherOptions(max_iters=2.5)
    assert str(a.value).replace("smoother.", "SmootherOptions.") == str(b.value)


def test_valid_options_and_strategy_pairs_are_accepted():
    cc.CEEMOptions(acceleration=cc.em.Joint(hessian="exact"))
    cc.SmootherOptions(x_lower=-1.0, x_upper=np.array([1.0, 2.0, 3.0]), chunk=0)
    cc.CEEMOptions(max_iters=np.int64(3), tol=0)


def test_trajectories_leading_takes_the_first_samples_of_every_trajectory():
    """`Trajectories.leading(n)`: the first n samples of outputs and inputs of each trajectory
    (the warm start and the block-model initialiser use it); the same object when none is longer."""
    from ceem_casadi.io import Trajectories

    y = [np.arange(10.0).reshape(5, 2), np.arange(6.0).reshape(3, 2)]
    u = [np.arange(5.0)[:, None], np.arange(3.0)[:, None]]
    data = Trajectories(y, u, dt=0.1)
    lead = data.leading(4)
    assert lead.lengths == (4, 3) and lead.dt == 0.1
    np.testing.assert_array_equal(lead.y[0], y[0][:4])
    np.testing.assert_array_equal(lead.u[0], u[0][:4])
    np.testing.assert_array_equal(lead.y[1], y[1])
    assert data.leading(5) is data
    assert Trajectories(y).leading(2).u is None
    heads = data.leading([2, 3])   # one length per trajectory (the search's and compare_structures' heads)
    assert heads.lengths == (2, 3) and heads.dt == 0.1 and data.leading([5, 3]) is data
    np.testing.assert_array_equal(heads.u[0], u[0][:2])
