"""``python -m scripts.bench_scale --smoke`` runs parts (b) and (c) end to end on a real
LocalCluster (1, then 2 workers) and writes every figure the docs quote."""
import json

import pytest

from scripts import bench_scale


def test_bench_scale_smoke(tmp_path):
    pytest.importorskip("distributed", reason="dask[distributed] is not installed (pip install -e '.[distributed]')")
    out = tmp_path / "scale.json"
    bench_scale.main(["--smoke", "--parts", "b,c", "--json", str(out)])
    res = json.loads(out.read_text())
    rows = res["part_b"]
    assert sorted((r["workers"], r["B"]) for r in rows) == [(1, 2), (1, 4), (2, 2), (2, 4)]
    for r in rows:
        m = r["per_iter_median"]
        assert r["iterations"] == 2 and m["wall_s"] > 0 and m["slowest_shard_s"] > 0
        assert m["sent_bytes"] > 0 and m["received_bytes"] > 0 and m["learn_calls"] >= 1
        assert r["speedup"] > 0 and len(r["repeat_walls_s"]) == 1
        # the client's serial part: the wall time no shard's compute covers, at most the iteration's wall time
        assert 0 <= m["client_serial_s"] <= m["wall_s"] and m["parallel_s"] > 0
    pred = res["part_c"]["lorenz"]["prediction"]
    assert set(pred) == {"2", "4", "1024"} and set(pred["1024"]) == {"16", "64"}
