"""The layout of issue 16 keeps old files and old import paths working: a checkpoint written
before ``IterationRecord.decrease`` was renamed ``increase`` reads under the new name; ``cc.read_trajectories`` reads the files the CLI reads."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import ceem_casadi as cc
from ceem_casadi import filtering
from ceem_casadi.em._checkpoint import read_checkpoint, write_checkpoint


def test_old_checkpoint_history_reads_decrease_as_increase(tmp_path):
    old = {"iteration": 1, "J": 2.0, "objective": 2.0, "decrease": 0.5, "smooth_s": 0.1, "learn_s": 0.1,
           "smooth_status": ["Solve_Succeeded"], "learn_status": "Solve_Succeeded", "theta": {"a": 1.0},
           "accepted": True, "kind": "em"}
    path = write_checkpoint(tmp_path / "old.npz", {"a": np.array(1.0)}, [old])
    (rec,) = read_checkpoint(path).history
    assert rec["increase"] == 0.5 and "decrease" not in rec


def test_rts_smoother_of_a_kalman_result_needs_A():
    res = filtering.kalman_filter(0.9, 1.0, 0.1, 0.1, np.ones((5, 1)), x0=[0.0], Sigma0=1.0)
    assert res.A is None
    with pytest.raises(ValueError, match="dynamics matrix A"):
        filtering.rts_smoother(res)


def test_read_trajectories_csv_and_errors(tmp_path):
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.9 * x + u, lambda x, u, p: x, nx=1, nu=1)
    df = pd.DataFrame({"trajectory": [0] * 4 + [1] * 3, "u0": np.arange(7.0), "y0": np.arange(7.0) ** 2})
    df.to_csv(tmp_path / "d.csv", index=False)
    data = cc.read_trajectories(tmp_path / "d.csv", model)
    assert list(data.lengths) == [4, 3]
    np.testing.assert_array_equal(data.y[1][:, 0], [16.0, 25.0, 36.0])
    np.testing.assert_array_equal(data.inputs(0)[:, 0], [0.0, 1.0, 2.0, 3.0])
    with pytest.raises(cc.io.DataFileError, match="missing column"):
        cc.read_trajectories(tmp_path / "d.csv", model, outputs=["y7"])
