"""scripts/bench_wh_long.py --smoke: the whole path of issue 24, item 3 (initialiser with its
output-error polish, CE-EM with a warm start of 1,000 samples) on T = 3,000, and its JSON row."""
import json

from scripts import bench_wh_long


def test_bench_wh_long_smoke_converges_to_the_noise_level(tmp_path):
    out = tmp_path / "row.json"
    assert bench_wh_long.main(["--smoke", "--no-floor", "--rss-phases", "--json", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row["status"] == "converged" and row["warm_status"] == "converged" and row["warm_length"] == 1000
    assert row["polish_status"] == "converged"
    # free run on a fresh record: at the noise level, as the truth's own run, and better than the initialiser's
    assert row["test_rms_over_noise"] < 1.1 and row["test_rms"] < 1.05 * row["test_rms_truth"]
    assert row["test_rms"] < row["test_rms_init"]
    assert row["theta_err"] < 0.05 and row["peak_rss_mb"] > 0
    # --rss-phases: every phase's largest resident set, at most the process's peak (sampled every 20 ms)
    assert {"initial_states", "learning", "newton_step"} <= set(row["rss_by_phase_mb"])
    assert max(row["rss_by_phase_mb"].values()) <= row["peak_rss_mb"] + 1 and row["seconds_by_phase"]["learning"] > 0
