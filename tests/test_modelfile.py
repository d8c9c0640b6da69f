"""Model files: save -> load -> predict bit-identical; tampered / newer / changed-source files refused."""
from __future__ import annotations

import hashlib
import io
import json
import zipfile

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.deploy._modelfile import (
    FORMAT,
    ModelFileError,
    ModelSourceError,
    load_model,
    read_archive,
    save_model,
    write_archive,
)
from models import lorenz

REF = "models.lorenz:single_lorenz"
KW = {"measurement_std": 0.1, "process_std": 0.02}
THETA = {"sigma": 10.3, "rho": 27.1, "beta": 2.55}


@pytest.fixture()
def saved(tmp_path):
    model = lorenz.single_lorenz(**KW)
    data, _ = cc.simulate(model, lorenz.TRUE, np.array([[-6.0, -6.0, 24.0]]), 200, measurement_std=0.1, seed=0)
    y = data.y[0].copy()
    y[::7, 1] = np.nan
    rec = cc.em.IterationRecord(1, -12.5, -12.5, 3.0, 0.1, 0.2, ["Solve_Succeeded"], "Solve_Succeeded",
                             {k: np.asarray(v) for k, v in THETA.items()})
    path = save_model(tmp_path / "m.npz", model, THETA, source=REF, kwargs=KW, options=cc.CEEMOptions(max_iters=7),
                      data={"files": ["train.csv"], "lengths": [200]}, history=[rec],
                      extra={"x0": np.array([[-6.0, -6.0, 24.0]])}, metadata={"note": "test"})
    return model, y, path


def _predict(model, y):
    from ceem_casadi.filtering import EKF

    n = model.noise
    return EKF(model).run(model.theta_vector(THETA), y, x0=np.array([-6.0, -6.0, 24.0]),
                          Sigma0=n.process_std ** 2, Q=n.process_std ** 2, R=n.measurement_std ** 2)


def test_round_trip_bit_identical(saved):
    model, y, path = saved
    ref = _predict(model, y)
    for trust in (True, False):
        sm = load_model(path, trust_source=trust)
        assert isinstance(sm.model, cc.StateSpaceModel)
        res = sm.predict(y)
        assert np.array_equal(res.y_pred, ref.y_pred) and np.array_equal(res.x_filt, ref.x_filt)
        assert np.array_equal(res.P_filt, ref.P_filt)
        assert res.loglik == ref.loglik
    assert {k: float(v) for k, v in sm.theta.items()} == THETA
    assert sm.meta["options"]["max_iters"] == 7 and sm.meta["data"]["lengths"] == [200]
    assert sm.history[0]["theta"]["rho"] == 27.1 and sm.meta["metadata"] == {"note": "test"}
    assert sm.meta["library_version"] == cc.__version__ and sm.source == REF and sm.kwargs == KW
    assert np.array_equal(sm.extra["x0"], [[-6.0, -6.0, 24.0]])
    np.testing.assert_array_equal(load_model(path).model.noise.measurement_std, [0.1, 0.1])


def _rewrite(path, out, change, rehash=True):
    """Copy the zip, applying ``change(name, bytes) -> bytes`` to each member; with ``rehash`` the
    whole-file SHA-256 (zip comment) is recomputed, so only the content digest can catch the edit."""
    buf = io.BytesIO()
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(buf, "w") as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, change(item.filename, zin.read(item.filename)))
        zout.comment = b"0" * 64
    raw = buf.getvalue()[:-64]
    out.write_bytes(raw + (hashlib.sha256(raw).hexdigest().encode() if rehash else b"0" * 64))
    return out


def test_tampered_file_refused(saved, tmp_path):
    _, _, path = saved

    def new_theta(name, raw):
        if name != "theta.npy":
            return raw
        a = np.load(io.BytesIO(raw))
        a[1] = 28.0
        b = io.BytesIO()
        np.save(b, a)
        return b.getvalue()

    with pytest.raises(ModelFileError, match="mismatch of the content"):
        load_model(_rewrite(path, tmp_path / "t1.npz", new_theta))
    with pytest.raises(ModelFileError, match="of the file"):
        load_model(_rewrite(path, tmp_path / "t1b.npz", new_theta, rehash=False))
    load_model(_rewrite(path, tmp_path / "t1c.npz", lambda name, raw: raw))  # an unchanged copy loads

    def new_meta(name, raw):
        if name != "__meta__.npy":
            return raw
        meta = json.loads(np.load(io.BytesIO(raw)).tobytes())
        meta["kwargs"]["measurement_std"] = 1.0
        b = io.BytesIO()
        np.save(b, np.frombuffer(json.dumps(meta).encode(), np.uint8))
        return b.getvalue()

    with pytest.raises(ModelFileError, match="mismatch of the content"):
        load_model(_rewrite(path, tmp_path / "t2.npz", new_meta))
    raw = bytearray(path.read_bytes())           # a flipped byte: zip CRC or digest catches it
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "t3.npz").write_bytes(bytes(raw))
    with pytest.raises(ModelFileError):
        load_model(tmp_path / "t3.npz")
    (tmp_path / "t4.npz").write_bytes(b"not a zip")
    with pytest.raises(ModelFileError, match="corrupted or wrong type"):
        load_model(tmp_path / "t4.npz")


def test_newer_format_and_pickle_refused(saved, tmp_path):
    _, _, path = saved
    meta, arrays = read_archive(path, expected_format=FORMAT, max_version=2)
    meta["format_version"] = 99
    meta.pop("sha256")
    write_archive(tmp_path / "new.npz", meta, arrays)
    with pytest.raises(ModelFileError, match="format version 99 is newer"):
        load_model(tmp_path / "new.npz")
    model = lorenz.single_lorenz()
    with pytest.raises(TypeError, match="no pickle"):
        save_model(tmp_path / "p.npz", model, THETA, extra={"bad": np.array([object()])})


def test_changed_or_missing_source(saved, monkeypatch):
    _, y, path = saved
    monkeypatch.setattr(lorenz, "single_lorenz", _other)
    with pytest.raises(ModelFileError, match="source changed"):
        load_model(path, trust_source=True)
    assert np.all(np.isfinite(load_model(path, trust_source=True, check_source=False).predict(y).y_pred))
    load_model(path)      # without trust_source the factory is never called: the stored graphs load
    with pytest.raises(ModelSourceError, match="cannot import module"):
        save_model(path.with_name("x.npz"), lorenz.single_lorenz(), THETA, source="no_such_pkg.mod:f")
    with pytest.raises(ModelSourceError, match="package.module:factory"):
        save_model(path.with_name("x.npz"), lorenz.single_lorenz(), THETA, source="models.lorenz")


_orig_single = lorenz.single_lorenz


def _other(**kw):
    """Lorenz observed through a different C: same sizes, different values."""
    return _orig_single(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), **kw)
