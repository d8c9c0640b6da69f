"""Trajectory files (CSV and Parquet tables, ``.npz`` arrays read without pickle), read and validated for a
model by [`read_trajectories`][ceem_casadi.io.read_trajectories], also for the CLI's ``--data``."""
from __future__ import annotations

import logging
import re
import zipfile
from pathlib import Path

import numpy as np

from ..errors import DataError
from ._limits import InputLimitError, check_file_size, check_npz, max_data_bytes
from ._validate import check_outputs

log = logging.getLogger("ceem_casadi.io")
TRAJECTORY_COLUMN = "trajectory"        # written by 'simulate' and 'smooth', read by default
TIME_COLUMNS = ("t", "time")
TABLE_READERS = {".csv": "read_csv", ".parquet": "read_parquet", ".pq": "read_parquet"}  # pandas reader by suffix

__all__ = ["DataFileError", "columns", "read_table", "read_trajectories"]


class DataFileError(DataError):
    """A data file is missing, unreadable or does not fit the model (the message names the file and the fix).

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> try:
    ...     cc.io.read_table("missing.csv")
    ... except cc.io.DataFileError as err:
    ...     print(type(err).__name__)
    DataFileError
    """


def read_table(path):
    """A pandas DataFrame from a ``.csv`` or ``.parquet``/``.pq`` file.

    Parameters
    ----------
    path : str or pathlib.Path

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    DataFileError
        The file is missing, unparsable, of another type, or Parquet without pyarrow.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from ceem_casadi.io import read_table
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
    >>> _ = path.write_text("u,y\\n1,2\\n3,4\\n")
    >>> read_table(path).shape
    (2, 2)
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such data file")
    try:
        check_file_size(path, str(path), max_data_bytes(), env="CEEM_MAX_DATA_MB")
    except InputLimitError as exc:
        raise DataFileError(str(exc)) from None
    reader = TABLE_READERS.get(path.suffix.lower())
    if reader is None:
        raise DataFileError(f"{path}: unsupported data file type (use .csv, .parquet or .npz)")
    try:
        return getattr(pd, reader)(path)
    except ImportError as exc:
        raise DataFileError(f"{path}: reading Parquet needs pyarrow or fastparquet ({exc})") from None
    except (ValueError, OSError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise DataFileError(f"{path}: cannot parse the table ({exc})") from None


def columns(df, path, wanted, prefix, n, kind) -> list[str]:
    """The ``n`` column names of ``kind`` (``"outputs"``/``"inputs"``) in the table ``df`` read from ``path``:
    ``wanted``, or the columns named ``<prefix>``, ``<prefix><digits>`` or ``<prefix>_...`` (e.g. ``y0, y_pos``)."""
    cols = [str(c) for c in df.columns]
    if wanted is None:
        wanted = [c for c in cols if re.fullmatch(rf"{prefix}\d*(_.*)?|{prefix}_.*", c)]
        if len(wanted) != n:
            raise DataFileError(f"{path}: found {kind} columns {wanted} (names starting with '{prefix}'), the model "
                             f"has {n}; name them with {kind}= (--{kind})")
    missing = [c for c in wanted if c not in cols]
    if missing:
        raise DataFileError(f"{path}: missing column(s) {missing}; columns in the file: {cols}")
    if len(wanted) != n:
        raise DataFileError(f"{kind} (--{kind}): the model has {n} {kind}, got {len(wanted)} columns {wanted}")
    return wanted


def _check_time(g, path, b, dt, used) -> None:
    """Warn when a time column is not increasing or its step differs from the model's dt."""
    col = next((c for c in g.columns if str(c).lower() in TIME_COLUMNS and str(c) not in used), None)
    t = None if col is None else g[col].to_numpy()
    if t is None or not np.issubdtype(t.dtype, np.number) or len(t) < 2:
        return
    d = np.diff(t.astype(float))
    if np.any(~(d > 0)):
        k = int(np.flatnonzero(~(d > 0))[0]) + 1
        log.warning("%s, trajectory %d: rows are not sorted by the time column %r (row %d: %s after %s); they "
                    "are used in file order: sort the file by time", path, b, col, k, t[k], t[k - 1])
    elif dt and np.max(np.abs(d - dt)) > 1e-6 * dt:
        log.warning("%s, trajectory %d: the time column %r has steps %.6g..%.6g, the model's dt is %.6g: the rows "
                    "are used as samples dt apart (resample the data or fix the model's dt)",
                    path, b, col, d.min(), d.max(), dt)


def read_trajectories(paths, model, *, outputs=None, inputs=None, trajectory_column=None,
                      describe: bool = False):
    """Trajectories for ``model`` from CSV, Parquet or ``.npz`` files (``y``, ``u``; no pickle), validated; the
    file layouts: docs/usage_cli.md ("Data").

    Parameters
    ----------
    paths : str, pathlib.Path or list of them
        The data files (their trajectories concatenated in order).
    model : StateSpaceModel
        Gives ny, nu and dt.
    outputs, inputs : list of str, optional
        Column names of the ny outputs and nu inputs (default: columns named ``y...``/``u...``).
    trajectory_column : str, optional
        The column whose values split a table into trajectories (default ``trajectory`` when present).
    describe : bool
        Also return a description (files, columns, lengths, ny, nu, dt, trajectory column).

    Returns
    -------
    Trajectories or (Trajectories, dict)

    Raises
    ------
    DataFileError
        A file or column is missing, or the values do not fit the model (the message names the fix).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.csv"
    >>> _ = path.write_text("y0,u0\\n0.0,1.0\\n1.0,0.5\\n1.0,0.0\\n")
    >>> data = cc.read_trajectories(path, model)
    >>> len(data.y), data.lengths, data.y[0].ravel().tolist()
    (1, (3,), [0.0, 1.0, 1.0])
    """
    data, desc = _read(paths, model, outputs, inputs, trajectory_column)
    return (data, desc) if describe else data


def _read_npz(path: Path) -> list:
    """[(y (T, ny), u (T, nu))] of a ``.npz`` holding ``y`` (T, ny) or (B, T, ny) and optionally ``u`` alike."""
    if not path.is_file():
        raise DataFileError(f"{path}: no such data file")
    try:  # sizes and dtypes from the headers, before any array is allocated
        check_npz(path, str(path), max_data_bytes())
    except InputLimitError as exc:
        raise DataFileError(str(exc).replace("CEEM_MAX_ARCHIVE_MB", "CEEM_MAX_DATA_MB")) from None
    try:
        with np.load(path, allow_pickle=False) as z:
            if "y" not in z.files:
                raise DataFileError(f"{path}: missing array 'y' (arrays in the file: {z.files})")
            y = np.asarray(z["y"], float)
            u = np.asarray(z["u"], float) if "u" in z.files else None
    except (ValueError, TypeError, OSError, zipfile.BadZipFile) as exc:  # object arrays, text, corrupt zip
        raise DataFileError(f"{path}: not a readable .npz of numeric arrays y, u ({exc})") from None
    if y.ndim not in (2, 3) or (u is not None and u.ndim != y.ndim):
        raise DataFileError(f"{path}: expected y of shape (T, ny) or (B, T, ny) and u alike, got y {y.shape}"
                            f"{'' if u is None else f', u {u.shape}'}")
    y = y[None] if y.ndim == 2 else y
    u = (np.zeros(y.shape[:2] + (0,)) if u is None else (u[None] if u.ndim == 2 else u))
    return list(zip(y, u))


def _read_columns(path: Path, model, desc: dict, first: int, *, outputs, inputs, trajectory_column) -> list:
    """[(y (T, ny), u (T, nu))] of a CSV/Parquet table, one per value of the trajectory column (trajectory
    numbers from ``first`` on); records the columns used in ``desc``."""
    df = read_table(path)
    ycols = columns(df, path, outputs, "y", model.ny, "outputs")
    ucols = columns(df, path, inputs, "u", model.nu, "inputs") if model.nu else []
    if len(set(ycols + ucols)) < len(ycols + ucols):   # e.g. the output given as the input too: a fit to itself
        raise DataFileError(f"{path}: a column is given twice among the outputs {ycols} and the inputs {ucols}")
    desc["outputs"], desc["inputs"] = ycols, ucols
    column = trajectory_column
    if column is None and TRAJECTORY_COLUMN in df.columns and TRAJECTORY_COLUMN not in ycols + ucols:
        column = TRAJECTORY_COLUMN
        log.info("%s: one trajectory per value of the column %r", path, column)
    if column is not None and column not in df.columns:
        raise DataFileError(f"{path}: missing column(s) ['{column}'] (trajectory_column, --trajectory-column); "
                            f"columns in the file: {list(df.columns)}")
    if column is not None and df[column].isna().any():
        rows = np.flatnonzero(df[column].isna().to_numpy())[:5].tolist()
        raise DataFileError(f"{path}: the trajectory column {column!r} is empty at rows {rows}; give every row "
                            f"a trajectory id")
    if column is not None:
        desc["trajectory_column"] = column
    out = []
    for g in [df] if column is None else [g for _, g in df.groupby(column, sort=False)]:
        _check_time(g, path, first + len(out), model.dt, set(ycols + ucols))
        try:
            out.append((g[ycols].to_numpy(float), g[ucols].to_numpy(float) if ucols else np.zeros((len(g), 0))))
        except (ValueError, TypeError) as exc:
            raise DataFileError(f"{path}: non-numeric values in the data columns ({exc})") from None
    return out


def _check_trajectory(b: int, y: np.ndarray, u: np.ndarray, model) -> None:
    """Outputs (T >= 2, ny) without inf, inputs (T, nu) finite, of trajectory ``b``."""
    if y.ndim != 2 or y.shape[1] != model.ny or len(y) < 2:
        raise DataFileError(f"trajectory {b}: expected outputs of shape (T >= 2, {model.ny}), got {y.shape}")
    if u.shape != (len(y), model.nu):
        raise DataFileError(f"trajectory {b}: expected inputs of shape {(len(y), model.nu)}, got {u.shape}")
    bad = np.flatnonzero(~np.all(np.isfinite(u), axis=1))
    if bad.size:
        raise DataFileError(f"trajectory {b}: inputs contain NaN/inf at rows {bad[:5].tolist()}"
                            f"{'...' if bad.size > 5 else ''} (inputs must be finite; outputs may be NaN = missing)")
    if np.any(np.isinf(y)):
        raise DataFileError(f"trajectory {b}: outputs contain inf (use NaN for missing values)")


def _read(paths, model, outputs, inputs, trajectory_column):
    """(Trajectories, description) of the files ``paths`` (see `read_trajectories`)."""
    from ._data import Trajectories

    paths = [paths] if isinstance(paths, (str, Path)) else paths
    pairs, desc = [], {"files": [], "outputs": None, "inputs": None, "trajectory_column": trajectory_column}
    for path in map(Path, paths):
        desc["files"].append(str(path))
        if path.suffix.lower() == ".npz":
            pairs += _read_npz(path)
        else:  # a table (read_table names the types it reads)
            pairs += _read_columns(path, model, desc, len(pairs), outputs=outputs, inputs=inputs,
                                   trajectory_column=trajectory_column)
    for b, (y, u) in enumerate(pairs):
        _check_trajectory(b, y, u, model)
    if not pairs:
        raise DataFileError("no data: give at least one data file (--data FILE)")
    ys, us = [y for y, _ in pairs], [u for _, u in pairs]
    # the library's one check of the outputs (same message as every public entry point)
    check_outputs(ys, desc["outputs"] or None, error=DataFileError)
    data = Trajectories(ys, us if model.nu else None, model.dt)
    desc.update(lengths=list(data.lengths), ny=model.ny, nu=model.nu, dt=model.dt)
    return data, desc
