"""Smoke runs of the paper's Lorenz experiment scripts (outputs exist, numbers finite)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from scripts import lorenz_bias, lorenz_coupled, lorenz_vs_particle


def test_bias_table_smoke(tmp_path):
    table = lorenz_bias.main(["--smoke", "--out", str(tmp_path)])
    assert set(table.parameter) == {"sigma", "rho", "beta"}
    # both smoke seeds reach the truth's basin: every mean within 2 % of the truth
    for _, r in table.iterrows():
        assert abs(r["mean"] - r["truth"]) < 0.02 * r["truth"]
    md = (tmp_path / "table1.md").read_text()  # the markdown table shows this run's means and SEs
    for _, r in table.iterrows():
        assert f"{r['mean']:.3f} ({r['se']:.3f})" in md


def test_vs_particle_smoke(tmp_path):
    summary = lorenz_vs_particle.main(["--smoke", "--out", str(tmp_path)])
    assert np.isfinite(summary["epoch_time_ratio_pem_over_ceem"])  # measured, not asserted (timing)
    runs = json.loads((tmp_path / "vs_particle.json").read_text())["runs"]
    assert len(runs[0]["ceem"]["path"]) == len(runs[0]["pem"]["path"]) == 3


@pytest.mark.slow  # six coupled Lorenz attractors (paper section 4.1.3): ~100-200 s on 2 shared cores
def test_coupled_smoke(tmp_path):
    result = lorenz_coupled.main(["--smoke", "--out", str(tmp_path)])
    eps = result["ceem"][0]["eps"]
    assert eps[-1] < eps[0]  # two CE-EM epochs lower the dynamics error
    assert np.isfinite(result["median_final_eps"][2])


def test_monotone_report_separates_descent_from_settling():
    # the descent of a real run (B = 4, seed 0): eps dips to 0.0911 and settles at the fixed point's 0.1003
    eps = [26.0, 22.06, 9.69, 7.06, 4.46, 1.71, 0.3095, 0.0911, 0.0999, 0.1003, 0.1003]
    rep = lorenz_coupled.monotone_report(eps)
    assert rep["monotone_descent"] and not rep["monotone"] and rep["settle_epoch"] == 7
    assert abs(rep["max_settling_rise"] - (0.0999 - 0.0911) / 0.1003) < 1e-12
    # a first step that raises eps (29.6 -> 38.8) is not a monotone descent
    assert not lorenz_coupled.monotone_report([29.6, 38.8, 28.6, 0.42, 0.4215])["monotone_descent"]
