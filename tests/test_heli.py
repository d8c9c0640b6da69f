"""Helicopter pipeline (paper §4.2) on the SYNTHETIC stand-in: reader (both torch formats),
refusal of code-executing files, conversion, and the smoke pipeline ranking NL < SID < naive."""
import json
import os
import pickle
import zipfile

import numpy as np
import pytest

from ceem_casadi import torchfile
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


def test_smoke_pipeline_without_nl(tmp_path):
    """Naive/H25/SID + EKF evaluation on the stand-in; SID (hidden states) beats naive.

    The CE-EM NL fit is not in this test: one CE-EM iteration of the 2246-parameter model did not
    finish within 400 s on the shared machine (see docs/results_heli.md).
    """
    from scripts import heli_pipeline
    res = heli_pipeline.main(["--smoke", "--skip-nl", "--out", str(tmp_path)])
    m = res["mean_test_rmse"]
    assert res["synthetic_standin"] and set(m) == {"naive", "H25", "SID"}
    assert m["SID"] < 0.5 * m["naive"], m
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["mean_test_rmse"] == m
    assert (tmp_path / "rmse_distribution.png").exists()
