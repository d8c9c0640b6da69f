"""Loaders of the real benchmarks Cascaded Tanks and Silverbox with their official splits, checked against
``SHA256SUMS``, and their metric [`simulation_rms`][ceem_casadi.io.simulation_rms] (docs/results_real.md)."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CeemError, ShapeError
from ._data import Trajectories
from ._measures import rmse

__all__ = ["BenchmarkSplit", "ChecksumError", "DatasetNotFoundError", "default_data_dir",
           "load_cascaded_tanks", "load_silverbox", "simulation_rms", "verify_file",
           "SILVERBOX_DT", "TANKS_DT"]

#: Cascaded Tanks sample time (s).
TANKS_DT = 4.0
#: Silverbox sample time (s): fs = 1e7 / 2**14 Hz.
SILVERBOX_DT = 2.0**14 / 1e7

_TANKS_FILE = "cascaded_tanks/dataBenchmark.mat"
_SILVERBOX_FILE = "silverbox/SNLS80mV.mat"


class DatasetNotFoundError(CeemError, FileNotFoundError):
    """A benchmark data file (or the data folder) is missing; the message says where to put it.

    Examples
    --------
    >>> from ceem_casadi.io import DatasetNotFoundError
    >>> issubclass(DatasetNotFoundError, FileNotFoundError)
    True
    """


class ChecksumError(CeemError, ValueError):
    """A data file's SHA-256 digest differs from the one listed in ``SHA256SUMS``.

    Examples
    --------
    >>> from ceem_casadi.io import ChecksumError
    >>> issubclass(ChecksumError, Exception)
    True
    """


@dataclass(frozen=True)
class BenchmarkSplit:
    """One official split of a benchmark.

    Attributes
    ----------
    name : str
        Split name (e.g. ``"estimation"``, ``"test"``).
    data : Trajectories
        A single trajectory, ``y`` (T, 1) and ``u`` (T, 1) in volts, ``dt`` in seconds.
    init_window : int
        Leading samples that may be used to estimate the initial state (the metric skips them).

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.io import BenchmarkSplit, Trajectories
    >>> split = BenchmarkSplit("estimation", Trajectories([np.zeros((20, 1))]), init_window=5)
    >>> split.name, split.data.lengths, split.init_window
    ('estimation', (20,), 5)
    """

    name: str
    data: Trajectories
    init_window: int

    @property
    def y(self) -> np.ndarray:
        """(T, 1) output."""
        return self.data.y[0]

    @property
    def u(self) -> np.ndarray:
        """(T, 1) input."""
        return self.data.u[0]

    def __len__(self) -> int:
        return self.data.y[0].shape[0]


def default_data_dir() -> Path:
    """The data folder of a loader given ``data_dir=None``: ``$CEEM_DATA``, else ``<repository>/../shared/data`` if
    it exists; else [`DatasetNotFoundError`][ceem_casadi.io.DatasetNotFoundError]."""
    env = os.environ.get("CEEM_DATA")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    cand = repo.parent / "shared" / "data"
    if cand.is_dir():
        return cand
    raise DatasetNotFoundError(
        f"no benchmark data folder: expected {cand} (next to the repository) or the environment "
        "variable CEEM_DATA pointing to a folder with cascaded_tanks/, silverbox/ and SHA256SUMS")


def _expected_digests(data_dir: Path) -> dict[str, str]:
    sums = data_dir / "SHA256SUMS"
    if not sums.is_file():
        raise DatasetNotFoundError(
            f"checksum list not found: expected {sums} (lines '<sha256>  <relative path>'); "
            "pass data_dir= or set CEEM_DATA to the folder that holds it")
    rows = [line.split() for line in sums.read_text().splitlines()]  # '<sha256>  [*]<relative path>'
    return {row[1].lstrip("*"): row[0].lower() for row in rows if len(row) >= 2}


def verify_file(data_dir, relpath: str) -> Path:
    """``<data_dir>/<relpath>`` after checking it exists (else `DatasetNotFoundError`, naming the path and
    ``CEEM_DATA``) and matches its digest in ``SHA256SUMS`` (else `ChecksumError`)."""
    data_dir = Path(data_dir)
    path = data_dir / relpath
    if not path.is_file():
        raise DatasetNotFoundError(
            f"benchmark file not found: expected {path}; put the file there, or pass data_dir= / set "
            "the environment variable CEEM_DATA to the folder holding "
            f"'{relpath}' and SHA256SUMS")
    expected = _expected_digests(data_dir).get(relpath)
    if expected is None:
        raise ChecksumError(f"{relpath} is not listed in {data_dir / 'SHA256SUMS'}; cannot verify it")
    with open(path, "rb") as fh:
        got = hashlib.file_digest(fh, "sha256").hexdigest()
    if got != expected:
        raise ChecksumError(f"SHA-256 mismatch for {path}: expected {expected}, got {got} "
                            "(corrupted or different file)")
    return path


def _load(data_dir, relpath: str) -> dict:
    """The arrays of the checksummed MATLAB file ``relpath`` of ``data_dir`` (default `default_data_dir`)."""
    from scipy.io import loadmat  # imported lazily to keep import time low

    return loadmat(str(verify_file(default_data_dir() if data_dir is None else Path(data_dir), relpath)))


def _split(name: str, y, u, dt: float, init_window: int) -> BenchmarkSplit:
    y = np.asarray(y, float).reshape(-1, 1)
    u = np.asarray(u, float).reshape(-1, 1)
    return BenchmarkSplit(name=name, data=Trajectories([y], [u], dt=dt), init_window=init_window)


def load_cascaded_tanks(data_dir=None) -> dict[str, BenchmarkSplit]:
    """Cascaded Tanks benchmark, official splits.

    Parameters
    ----------
    data_dir : str or pathlib.Path, optional
        Folder holding ``cascaded_tanks/`` and ``SHA256SUMS``; default `default_data_dir`.

    Returns
    -------
    dict of str to BenchmarkSplit
        ``"estimation"`` and ``"test"``: 1024 samples each, volts, ``dt = 4`` s, ``init_window = 5``.

    Raises
    ------
    DatasetNotFoundError, ChecksumError
        The file is not there, or differs from its SHA-256.

    Examples
    --------
    >>> import tempfile, ceem_casadi as cc
    >>> try:
    ...     cc.load_cascaded_tanks(tempfile.mkdtemp())
    ... except cc.io.DatasetNotFoundError as err:
    ...     print(type(err).__name__)
    DatasetNotFoundError
    """
    m = _load(data_dir, _TANKS_FILE)
    dt = float(np.asarray(m.get("Ts", TANKS_DT)).ravel()[0])
    out = {"estimation": _split("estimation", m["yEst"], m["uEst"], dt, 5),
           "test": _split("test", m["yVal"], m["uVal"], dt, 5)}
    for s in out.values():
        if len(s) != 1024:
            raise ShapeError(f"cascaded tanks {s.name}: expected 1024 samples, got {len(s)}")
    return out


def load_silverbox(data_dir=None) -> dict[str, BenchmarkSplit]:
    """Silverbox benchmark (``SNLS80mV.mat``), official splits (0-based slices, u = V1, y = V2 in volts).

    Parameters
    ----------
    data_dir : str or pathlib.Path, optional
        As for [`load_cascaded_tanks`][ceem_casadi.load_cascaded_tanks].

    Returns
    -------
    dict of str to BenchmarkSplit
        ``"train"``, ``"test_multisine"``, ``"test_arrow_full"``, ``"test_arrow_no_extrapolation"`` (ranges:
        docs/results_real.md); ``dt = 2**14 / 1e7`` s and ``init_window = 50`` for all.

    Raises
    ------
    DatasetNotFoundError, ChecksumError
        As for [`load_cascaded_tanks`][ceem_casadi.load_cascaded_tanks].

    Examples
    --------
    >>> import tempfile, ceem_casadi as cc
    >>> try:
    ...     cc.load_silverbox(tempfile.mkdtemp())
    ... except cc.io.DatasetNotFoundError as err:
    ...     print(type(err).__name__)
    DatasetNotFoundError
    """
    m = _load(data_dir, _SILVERBOX_FILE)
    u = np.asarray(m["V1"], float).ravel()
    y = np.asarray(m["V2"], float).ravel()
    if u.shape != (131072,) or y.shape != (131072,):
        raise ShapeError(f"silverbox: expected V1, V2 of 131072 samples, got {u.shape}, {y.shape}")
    train_end = 40650 + 65062  # 0-based ranges: the multisine part is [40650:127400], the arrow [100:40575]
    ranges = {"train": (40650, train_end), "test_multisine": (train_end, 127400), "test_arrow_full": (100, 40575),
              "test_arrow_no_extrapolation": (100, 100 + 32000)}
    return {name: _split(name, y[a:b], u[a:b], SILVERBOX_DT, 50) for name, (a, b) in ranges.items()}


def simulation_rms(y, yhat, skip: int = 0) -> float:
    """Benchmark simulation RMS ``sqrt(mean((y[skip:] - yhat[skip:])**2))`` over all outputs.

    Parameters
    ----------
    y, yhat : numpy.ndarray
        (T,) or (T, ny) measured and simulated outputs (NaN in ``y`` ignored).
    skip : int
        Leading samples excluded (the initialisation window).

    Returns
    -------
    float
        The RMS in the units of y; ``inf`` when ``yhat`` is not finite after ``skip``.

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.io import simulation_rms
    >>> simulation_rms(np.array([[1.0], [2.0], [3.0]]), np.array([[9.0], [2.0], [4.0]]), skip=1)
    0.7071067811865476
    """
    y, yhat = np.asarray(y, float), np.asarray(yhat, float)
    if y.shape != yhat.shape:
        raise ShapeError(f"y and yhat must have the same shape, got {y.shape} and {yhat.shape}")
    if not 0 <= int(skip) < y.shape[0]:
        raise ShapeError(f"skip must be in [0, {y.shape[0]}), got {skip}")
    y, yhat = y[int(skip):].reshape(-1), yhat[int(skip):].reshape(-1)
    if not np.all(np.isfinite(yhat[~np.isnan(y)])):
        return float("inf")
    return float(rmse(y, yhat))
