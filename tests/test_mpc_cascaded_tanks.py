"""scripts/mpc_cascaded_tanks.py --smoke: identify on the real data, export, NMPC + EKF on a perturbed plant."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ceem_casadi.io._datasets import DatasetNotFoundError, default_data_dir


def test_mpc_smoke_tracks_within_noise_and_respects_bounds(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    try:
        default_data_dir()
    except DatasetNotFoundError:
        pytest.skip("Cascaded Tanks data not available")
    from scripts import mpc_cascaded_tanks as mpc

    res = mpc.main(["--smoke", "--out", str(tmp_path), "--json", str(tmp_path / "r.json")])
    u = np.asarray(res["u"])
    assert np.all(u >= mpc.U_MIN) and np.all(u <= mpc.U_MAX)
    assert res["input_bound_violations"] == 0 and res["solver_not_converged"] == 0
    # after the 7 V step has settled (last 20 of 80 samples, 80 s) the noise-free plant output stays within
    # 0.15 V of the reference: 3x the sensor noise std (0.05 V) the EKF filters, although the plant's
    # parameters differ from the controller's model (offset-free through the disturbance state)
    assert res["final_error_rms_last20"] < 0.15
    # the reference step is 2 V: without control the output would not follow it at all
    r, y = np.asarray(res["r"]), np.asarray(res["y_true"])
    assert abs(y[-1] - r[-1]) < 0.3 and abs(y[0] - r[-1]) > 3.0
    # the hidden upper level is estimated from the lower level alone, from a prior h1 = 0.8 h2, ~8 V below the plant's
    assert res["upper_level_estimate_rms_after_60"] < 1.0
    assert (tmp_path / "mpc_cascaded_tanks.png").is_file()
    assert json.loads((tmp_path / "r.json").read_text())["export"]["files"]["F"].endswith("F.casadi")
