"""Restricted torch.save reader: both formats, genuine torch fixtures, malicious pickles refused."""
import io
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ceem_casadi.io import torchfile as tf

DATA = Path(__file__).parent / "data"


def _sample(seed=0):
    rng = np.random.default_rng(seed)
    return (np.arange(500, dtype=np.float64) * 0.02, rng.normal(size=(500, 19)).astype(np.float32),
            rng.normal(size=(500, 4)))


@pytest.mark.parametrize("legacy", [False, True])
def test_roundtrip_both_formats(tmp_path, legacy):
    obj = _sample()
    p = tmp_path / "traj.pt"
    tf.save(obj, p, legacy=legacy)
    assert zipfile.is_zipfile(p) != legacy
    back = tf.load(p)
    assert isinstance(back, tuple) and len(back) == 3
    for a, b in zip(obj, back):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/ceem_pwned",))


def test_malicious_zip_refused(tmp_path):
    p = tmp_path / "evil.pt"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("evil/data.pkl", pickle.dumps((_Evil(),), protocol=2))
    with pytest.raises(tf.UnsafePickleError, match="system"):
        tf.load(p)


def test_malicious_legacy_refused(tmp_path):
    p = tmp_path / "evil_legacy.pt"
    buf = io.BytesIO()
    for o in (tf._MAGIC, tf._PROTOCOL, {}):
        buf.write(pickle.dumps(o, protocol=2))
    buf.write(pickle.dumps(_Evil(), protocol=2))
    p.write_bytes(buf.getvalue())
    with pytest.raises(tf.UnsafePickleError):
        tf.load(p)
    assert isinstance(tf.UnsafePickleError("x"), ValueError)


def test_not_a_torch_file(tmp_path):
    p = tmp_path / "junk.pt"
    p.write_bytes(pickle.dumps(42, protocol=2))
    with pytest.raises(tf.TorchFileError, match="magic"):
        tf.load(p)


@pytest.mark.parametrize("name", ["torch_zip.pt", "torch_legacy.pt"])
def test_genuine_torch_fixtures(name):
    """Files written by torch 2.13 itself (tests/data/make_torch_fixtures.py), both formats."""
    t, data, controls = tf.load(DATA / name)
    exp = np.load(DATA / "torch_fixture_expected.npz")
    for got, key in ((t, "time"), (data, "data"), (controls, "controls")):
        assert got.dtype == exp[key].dtype and got.shape == exp[key].shape
        np.testing.assert_array_equal(got, exp[key])


@pytest.mark.parametrize("name", ["torch_views_zip.pt", "torch_views_legacy.pt"])
def test_genuine_torch_views_dtypes_and_containers(name):
    """Shared storages (offset, transpose, step), int/bool/half, 0-d and empty tensors, plain values."""
    got = tf.load(DATA / name)
    exp = np.load(DATA / "torch_fixture_expected.npz")
    assert got["meta"] == {"name": "fixture", "T": 40, "dt": 0.02, "flags": [True, None]}
    tensors = {k: v for k, v in got.items() if k != "meta"}
    assert set(tensors) == {k[len("views_"):] for k in exp.files if k.startswith("views_")}
    for key, arr in tensors.items():
        want = exp[f"views_{key}"]
        assert arr.dtype == want.dtype and arr.shape == want.shape, key
        np.testing.assert_array_equal(arr, want)
    np.testing.assert_array_equal(tensors["transposed"], tensors["base"].T)
