"""Smoke run of scripts/bench_particle_vs_ceem.py (1 seed, 2 epochs of each method)."""
import json

import numpy as np

from scripts import bench_particle_vs_ceem


def test_bench_particle_vs_ceem_smoke(tmp_path):
    out = tmp_path / "out"
    assert bench_particle_vs_ceem.main(["--smoke", "--out", str(out), "--json", str(tmp_path / "r.json")]) == 0
    res = json.loads((tmp_path / "r.json").read_text())
    assert (out / "estimates_vs_epoch.png").stat().st_size > 0
    s = res["summary"]
    assert res["config"]["seeds"] == [0]
    for m in ("ceem", "pem"):
        assert res["runs"][0][m]["epochs"] == 2
        assert np.isfinite(s[m]["median_epoch_s"])  # timings are reported, never asserted
    assert np.isfinite(s["epoch_time_ratio_pem_over_ceem"])
    assert res["ekf"]["nx"] == 10 and np.isfinite([res["ekf"]["us_per_step"], res["ekf"]["us_per_step_casadi"]]).all()
