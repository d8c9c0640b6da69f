"""Benchmark loaders: checksums, official split sizes and contents, missing/tampered file errors."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.io

from ceem_casadi.io._datasets import (
    SILVERBOX_DT,
    BenchmarkSplit,
    ChecksumError,
    DatasetNotFoundError,
    default_data_dir,
    load_cascaded_tanks,
    load_silverbox,
    simulation_rms,
    verify_file,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "SHA256SUMS").is_file(),
                                reason=f"real benchmark data not present at {DATA} (set up ../shared/data)")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@needs_data
def test_checksums_listed_match_independent_hash():
    for line in (DATA / "SHA256SUMS").read_text().splitlines():
        digest, rel = line.split()
        assert verify_file(DATA, rel) == DATA / rel
        assert _sha(DATA / rel) == digest


@needs_data
def test_cascaded_tanks_splits_equal_raw_file():
    s = load_cascaded_tanks(DATA)
    assert set(s) == {"estimation", "test"}
    raw = scipy.io.loadmat(str(DATA / "cascaded_tanks" / "dataBenchmark.mat"))
    for key, (yk, uk) in {"estimation": ("yEst", "uEst"), "test": ("yVal", "uVal")}.items():
        sp = s[key]
        assert isinstance(sp, BenchmarkSplit) and sp.name == key
        assert len(sp.data) == 1 and sp.y.shape == (1024, 1) and sp.u.shape == (1024, 1)
        assert sp.data.dt == 4.0 and sp.init_window == 5
        np.testing.assert_array_equal(sp.y, raw[yk])
        np.testing.assert_array_equal(sp.u, raw[uk])
    # the CSV copy holds the same numbers (independent source)
    csv = np.genfromtxt(DATA / "cascaded_tanks" / "dataBenchmark.csv", delimiter=",", names=True)
    np.testing.assert_allclose(csv["yEst"], s["estimation"].y[:, 0], atol=1e-4)
    np.testing.assert_allclose(csv["uVal"], s["test"].u[:, 0], atol=1e-4)


@needs_data
def test_silverbox_splits():
    s = load_silverbox(DATA)
    raw = scipy.io.loadmat(str(DATA / "silverbox" / "SNLS80mV.mat"))
    v1, v2 = raw["V1"].ravel(), raw["V2"].ravel()
    sizes = {"train": 65062, "test_multisine": 21688, "test_arrow_full": 40475,
             "test_arrow_no_extrapolation": 32000}
    assert {k: len(v) for k, v in s.items()} == sizes
    for sp in s.values():
        assert sp.data.dt == SILVERBOX_DT == 2**14 / 1e7 and sp.init_window == 50
    np.testing.assert_array_equal(s["train"].u[:, 0], v1[40650:40650 + 65062])
    np.testing.assert_array_equal(s["test_multisine"].y[:, 0], v2[40650 + 65062:127400])
    np.testing.assert_array_equal(s["test_arrow_full"].y[:, 0], v2[100:40575])
    np.testing.assert_array_equal(s["test_arrow_no_extrapolation"].u[:, 0], v1[100:32100])


def test_missing_file_error_names_path_and_env(tmp_path):
    (tmp_path / "SHA256SUMS").write_text("0" * 64 + "  cascaded_tanks/dataBenchmark.mat\n")
    with pytest.raises(DatasetNotFoundError) as e:
        load_cascaded_tanks(tmp_path)
    msg = str(e.value)
    assert str(tmp_path / "cascaded_tanks" / "dataBenchmark.mat") in msg and "CEEM_DATA" in msg
    assert isinstance(e.value, FileNotFoundError)


def test_missing_checksum_list(tmp_path):
    (tmp_path / "cascaded_tanks").mkdir()
    (tmp_path / "cascaded_tanks" / "dataBenchmark.mat").write_bytes(b"x")
    with pytest.raises(DatasetNotFoundError, match="SHA256SUMS"):
        load_cascaded_tanks(tmp_path)


@needs_data
def test_tampered_copy_is_refused(tmp_path):
    (tmp_path / "cascaded_tanks").mkdir()
    shutil.copy(DATA / "SHA256SUMS", tmp_path / "SHA256SUMS")
    dst = tmp_path / "cascaded_tanks" / "dataBenchmark.mat"
    shutil.copy(DATA / "cascaded_tanks" / "dataBenchmark.mat", dst)
    dst.chmod(0o644)
    assert len(load_cascaded_tanks(tmp_path)["test"]) == 1024      # the intact copy loads
    b = bytearray(dst.read_bytes())
    b[-1] ^= 0xFF
    dst.write_bytes(bytes(b))
    with pytest.raises(ChecksumError) as e:
        load_cascaded_tanks(tmp_path)
    assert _sha(DATA / "cascaded_tanks" / "dataBenchmark.mat") in str(e.value)
    assert _sha(dst) in str(e.value)


def test_default_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("CEEM_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    with pytest.raises(DatasetNotFoundError, match="CEEM_DATA"):
        load_silverbox()


def test_simulation_rms():
    y = np.arange(10.0)[:, None]
    yhat = y + np.r_[np.full(5, 100.0), [1.0, -1.0, 1.0, -1.0, 2.0]][:, None]
    assert simulation_rms(y, yhat, 5) == pytest.approx(np.sqrt((4 * 1 + 4) / 5))
    yhat[7] = np.nan
    assert simulation_rms(y, yhat, 5) == np.inf       # a diverged simulation is not ignored
    assert simulation_rms(y, yhat, 8) == pytest.approx(np.sqrt((1 + 4) / 2))
