"""Helicopter pipeline (paper §4.2) on the SYNTHETIC stand-in: reader (both torch formats),
refusal of code-executing files, conversion, and the smoke pipeline ranking NL < SID < naive."""
import itertools
import json
import os
import pickle
import zipfile

import numpy as np
import pytest

from ceem_casadi.io import torchfile
from scripts import heli_convert, heli_standin


@pytest.mark.parametrize("legacy", [False, True])
def test_standin_roundtrip_both_formats(tmp_path, legacy):
    root = heli_standin.write(tmp_path, n_train=2, n_valid=1, n_test=1, T=60, seed=3, legacy=legacy)
    f = sorted((root / "train").glob("*.pt"))[0]
    assert zipfile.is_zipfile(f) is (not legacy)
    arr = heli_convert.read_folder(root)
    assert arr["train_y"].shape == (2, 60, 6) and arr["train_u"].shape == (2, 60, 10)
    assert bool(arr["synthetic"])
    # independent oracle: regenerate the raw trajectories and normalise by hand
    sysm, rng = heli_standin.system(), np.random.default_rng(3)
    raw = [heli_standin.trajectory(rng, sysm, 60) for _ in range(4)]
    d = np.concatenate([r[1] for r in raw[:2]])
    c = np.concatenate([r[2] for r in raw[:2]])
    dn = (raw[3][1] - d.mean(0)) / d.std(0)
    cn = (raw[3][2] - c.mean(0)) / c.std(0)
    np.testing.assert_allclose(arr["test_y"][0], dn[:, -6:], atol=1e-12)
    np.testing.assert_allclose(arr["test_u"][0], np.hstack([cn, dn[:, 7:13]]), atol=1e-12)
    np.testing.assert_allclose(arr["test_y"][0] * arr["y_std"] + arr["y_mean"], raw[3][1][:, -6:], atol=1e-9)
    out = heli_convert.main([str(root), "--out", str(tmp_path / "h.npz")])
    back = heli_convert.load_npz(out)
    np.testing.assert_array_equal(back["valid_u"], arr["valid_u"])


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/heli_pwned",))


def test_code_executing_file_refused(tmp_path):
    root = heli_standin.write(tmp_path, n_train=1, n_valid=1, n_test=1, T=30)
    bad = root / "test" / "synthetic_test_0000.pt"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps((_Evil(),), protocol=2))
    with pytest.raises(torchfile.UnsafePickleError, match="system"):
        heli_convert.read_folder(root)
    assert not os.path.exists("/tmp/heli_pwned")


# Ranking on the stand-in, measured for seeds 0-4 (smoke size, --skip-lstm; test RMSE NL / SID / naive):
# 1.74/2.75/21.9, 1.79/2.02/24.0, 2.59/3.19/31.7, 2.08/3.41/20.3, 2.29/3.84/24.1. NL/SID <= 0.89 and
# SID/naive <= 0.17 in all of them: the asserted properties (NL < SID, SID < 0.3 naive) hold with margin.
def _assert_ranking(m):
    assert m["NL"] < m["SID"] < 0.3 * m["naive"], m


def test_smoke_pipeline_ranking(tmp_path):
    """Smoke run on the stand-in (8 x 200 training steps, 3 CE-EM iterations): test RMSE ranks
    NL < SID < naive. The stand-in's targets depend on hidden states with slow dynamics, so the
    state-space models must beat the memoryless naive MLP, and the MLP head must beat linear SID.
    The ranking holds for every seed tried (see above and the slow test over seeds below)."""
    from scripts import heli_pipeline
    res = heli_pipeline.main(["--smoke", "--skip-h25", "--seed", "0", "--out", str(tmp_path), "-q"])
    m = res["mean_test_rmse"]
    assert res["synthetic_standin"] and {"naive", "SID", "NL", "LSTM"} <= set(m)
    _assert_ranking(m)
    assert res["ceem"]["iterations"] >= 1 and res["ceem"]["status"] != "solver_failed", res["ceem"]
    J = res["ceem"]["J"]
    assert all(b >= a - 1e-6 * abs(a) for a, b in itertools.pairwise(J)), J  # CE-EM never lowers J
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["mean_test_rmse"] == m
    assert (tmp_path / "rmse_distribution.png").exists()


@pytest.mark.slow  # five pipeline runs, ~15 s of CPU each
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_smoke_pipeline_ranking_over_seeds(tmp_path, seed):
    from scripts import heli_pipeline
    res = heli_pipeline.main(["--smoke", "--skip-h25", "--skip-lstm", "--seed", str(seed), "--out", str(tmp_path),
                              "-q"])
    _assert_ranking(res["mean_test_rmse"])


def test_bench_epoch_smoke(tmp_path):
    """scripts/bench_heli_epoch --smoke: smoothing, Adam and IPOPT learning steps and one ceem()
    epoch timed; the Adam step does not raise the learning objective and the epoch raises J."""
    from scripts import bench_heli_epoch
    res = bench_heli_epoch.main(["--smoke", "--out", str(tmp_path)])
    assert res["learning_adam"]["F_after"] <= res["learning_adam"]["F_start"]
    assert res["epoch"]["J_after"] >= res["epoch"]["J_start"]
    assert json.loads((tmp_path / "bench_heli_epoch.json").read_text())["samples"]["observation"] == 600
    # issue 26: the floor of each phase beside its time, and the IPOPT peer on a subset agrees
    smooth = res["floor"]["smoothing"]
    assert smooth["floor_s"] > 0 and smooth["ratio"] * smooth["floor_s"] == pytest.approx(res["smoothing"]["total_s"])
    assert res["floor"]["learning_adam"]["floor_s"] > 0 and "epoch_learning" in res["floor"]
    assert res["smoothing_ipopt_subset"]["max_abs_state_difference"] < 1e-8
