"""scripts/experiment_design.py --smoke: designed input vs PRBS vs multisine on Cascaded Tanks and Duffing."""
from __future__ import annotations

import json


def test_experiment_design_smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    from scripts import experiment_design as ed

    out = ed.main(["--smoke", "--out", str(tmp_path), "--json", str(tmp_path / "r.json")])
    assert (tmp_path / "experiment_design.png").is_file()
    assert json.loads((tmp_path / "r.json").read_text())["args"]["seeds"] == 3
    for res in out["results"]:
        s = res["summary"]
        # the design's claim, judged without noise: at the TRUTH (it was designed at a guess 10 % off) the
        # Cramer-Rao interval widths (geometric mean) of the designed input are narrower than those of every
        # PRBS and multisine drawn
        pw = {k: s[k]["predicted_width_at_truth_per_seed"] for k in s}
        assert pw["designed"]["max"] < min(pw["prbs"]["min"], pw["multisine"]["min"]), (res["model"], pw)
        pred = {k: s[k]["predicted_geomean_width_at_truth"] for k in s}
        # the fits of the designed records converge and the realised widths agree with the prediction
        assert s["designed"]["failed"] == 0
        assert 0.5 < s["designed"]["geomean_width"] / pred["designed"] < 2.0
        # estimates of the designed records are consistent with their intervals (3 seeds x n parameters)
        assert s["designed"]["coverage"] >= 0.75, (res["model"], s["designed"])
