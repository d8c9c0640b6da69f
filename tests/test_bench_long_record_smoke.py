"""scripts/bench_long_record.py --smoke: the bench runs and the joint acceleration meets its target
(relative change of J below 1e-9, a better test simulation than the initial guess)."""
import json

from scripts import bench_long_record


def test_bench_long_record_smoke(tmp_path):
    out = tmp_path / "out.json"
    assert bench_long_record.main(["--smoke", "--problems", "segments", "--accelerations", "joint",
                                   "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["status"] == "converged" and row["kinds"] == {"em": 2, "joint": 1}
    assert row["final_rel_change_J"] < 1e-9
    assert row["test_rms"] < 0.1 * row["test_rms_initial"]
