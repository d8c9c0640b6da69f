"""Inputs of the command line interface, validated at the boundary.

Every value that comes from a user (flags, JSON, TOML, data files) is checked here and a bad one
raises :class:`UsageError`: one line saying what was expected, what was given and which flag
fixes it; the CLI turns it into exit code 2. Readers of trajectory tables (CSV/Parquet/npz) live
here too.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import tomllib

log = logging.getLogger("ceem_casadi.cli")
TRAJECTORY_COLUMN = "trajectory"        # written by 'simulate' and 'smooth', read by default
TIME_COLUMNS = ("t", "time")


class UsageError(Exception):
    """Bad command line input: reported in one line, exit code 2."""


# --- scalars, lists, JSON ----------------------------------------------------------------------
def json_arg(text: str | None, what: str):
    """Parsed JSON text, or the contents of a ``.json`` file; None for None."""
    if text is None:
        return None
    try:
        if text.endswith(".json"):
            return json.loads(Path(text).read_text())
        return json.loads(text)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{what}: expected JSON text or a .json file, got {text!r} ({exc})") from None


def json_object(text: str | None, what: str) -> dict:
    """A JSON object (``{}`` for None)."""
    value = json_arg(text, what)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{what}: expected a JSON object like '{{\"name\": value}}', got {value!r}")
    return value


def names(text: str | None) -> list[str] | None:
    return None if text is None else [s.strip() for s in text.split(",") if s.strip()]


def int_list(text: str, what: str, minimum: int = 1) -> list[int]:
    """Comma-separated integers >= ``minimum``."""
    out = []
    for s in names(text) or []:
        try:
            v = int(s)
        except ValueError:
            raise UsageError(f"{what}: expected comma-separated integers >= {minimum}, got {text!r}") from None
        if v < minimum:
            raise UsageError(f"{what}: expected integers >= {minimum}, got {v}")
        out.append(v)
    if not out:
        raise UsageError(f"{what}: expected comma-separated integers >= {minimum}, got {text!r}")
    return out


def at_least(value, minimum, what: str, unit: str = ""):
    """``value`` unless it is below ``minimum`` (or not finite)."""
    if value is not None and not (math.isfinite(value) and value >= minimum):
        raise UsageError(f"{what}: expected a number >= {minimum}{unit}, got {value}")
    return value


def states(text: str | None, what: str, nx: int, batch: int | None = None) -> np.ndarray | None:
    """Initial state(s) from JSON: ``nx`` numbers or a list of such lists, as (B, nx) (B = ``batch``
    copies of a single state when given)."""
    value = json_arg(text, what)
    if value is None:
        return None
    try:
        x = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise UsageError(f"{what}: expected {nx} numbers or lists of {nx} numbers, got {text!r}") from None
    if x.ndim == 1 and batch is not None:
        x = np.tile(x, (batch, 1))
    x = np.atleast_2d(x)
    if x.ndim != 2 or x.shape[1] != nx or (batch is not None and len(x) != batch) or len(x) == 0:
        want = f"{nx} numbers" + (f" or {batch} lists of them" if batch is not None else " or lists of them")
        raise UsageError(f"{what}: expected {want}, got shape {np.shape(value)}")
    if not np.all(np.isfinite(x)):
        raise UsageError(f"{what}: the initial states must be finite, got {value}")
    return x


def theta_arg(model, text: str | None, what: str, base: dict | None = None) -> dict | None:
    """Parameters from JSON (missing names: from ``base``, else the declared initial values)."""
    from .errors import CeemError

    given = json_object(text, what) if text is not None else None
    if given is None:
        return None
    try:
        return model.params.validate({**(base or {}), **given}, partial=True)
    except CeemError as exc:
        raise UsageError(f"{what}: {exc}") from None


def writable(path, what: str, directory: bool = False) -> Path:
    """``path`` if a file (or, with ``directory``, a folder) can be written there, checked before any work."""
    path = Path(path)
    if path.exists() and path.is_dir() != directory:
        raise UsageError(f"{what} {path}: is {'a file' if directory else 'a folder'}; give a "
                         f"{'folder' if directory else 'file name'}")
    parent = path if directory else path.parent
    existing = parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{what} {path}: {existing} is not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".ceem-write-test-"):
            pass
        if path.exists() and not directory and not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is read-only")
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot write there ({exc}); choose another {what}") from None
    return path


# --- data files -----------------------------------------------------------------------------------
def read_table(path: Path):
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such data file")
    try:
        if path.suffix.lower() == ".csv":
            return pd.read_csv(path)
        if path.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(path)
    except ImportError as exc:
        raise UsageError(f"{path}: reading Parquet needs pyarrow or fastparquet ({exc})") from None
    except (ValueError, OSError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot parse the table ({exc})") from None
    raise UsageError(f"{path}: unsupported data file type (use .csv, .parquet or .npz)")


def columns(df, path, wanted, prefix, n, kind) -> list[str]:
    cols = [str(c) for c in df.columns]
    if wanted is None:
        wanted = [c for c in cols if re.fullmatch(rf"{prefix}\d*(_.*)?|{prefix}_.*", c)]
        if len(wanted) != n:
            raise UsageError(f"{path}: found {kind} columns {wanted} (names starting with '{prefix}'), the model "
                             f"has {n}; name them with --{kind}")
    missing = [c for c in wanted if c not in cols]
    if missing:
        raise UsageError(f"{path}: missing column(s) {missing}; columns in the file: {cols}")
    if len(wanted) != n:
        raise UsageError(f"--{kind}: the model has {n} {kind}, got {len(wanted)} columns {wanted}")
    return wanted


def _check_time(g, path, b, dt, used) -> None:
    """Warn when a time column is not increasing or its step differs from the model's dt."""
    col = next((c for c in g.columns if str(c).lower() in TIME_COLUMNS and str(c) not in used), None)
    if col is None:
        return
    t = g[col].to_numpy()
    if not np.issubdtype(t.dtype, np.number) or len(t) < 2:
        return
    d = np.diff(t.astype(float))
    if np.any(~(d > 0)):
        k = int(np.flatnonzero(~(d > 0))[0]) + 1
        log.warning("%s, trajectory %d: rows are not sorted by the time column %r (row %d: %s after %s); they "
                    "are used in file order: sort the file by time", path, b, col, k, t[k], t[k - 1])
    elif dt and np.max(np.abs(d - dt)) > 1e-6 * dt:
        log.warning("%s, trajectory %d: the time column %r has steps %.6g..%.6g, the model's dt is %.6g: the rows "
                    "are used as samples dt apart (resample the data or fix dt in --model-kwargs)",
                    path, b, col, d.min(), d.max(), dt)


def load_data(paths, model, *, outputs=None, inputs=None, trajectory_column=None):
    """Trajectories from CSV/Parquet tables (one trajectory per file, or per value of
    ``trajectory_column``; default: the column ``trajectory`` when present, as written by
    ``simulate``) or ``.npz`` files (``y`` (T, ny) or (B, T, ny), optional ``u``).
    Returns (data, description)."""
    import ceem_casadi as cc

    ys, us, desc = [], [], {"files": [], "outputs": None, "inputs": None}
    used_column = trajectory_column
    for path in map(Path, paths):
        desc["files"].append(str(path))
        if path.suffix.lower() == ".npz":
            if not path.is_file():
                raise UsageError(f"{path}: no such data file")
            try:
                with np.load(path, allow_pickle=False) as z:
                    if "y" not in z.files:
                        raise UsageError(f"{path}: missing array 'y' (arrays in the file: {z.files})")
                    y = np.asarray(z["y"], float)
                    u = np.asarray(z["u"], float) if "u" in z.files else None
            except (ValueError, TypeError, OSError, zipfile.BadZipFile) as exc:  # object arrays, text, corrupt zip
                raise UsageError(f"{path}: not a readable .npz of numeric arrays y, u ({exc})") from None
            if y.ndim not in (2, 3) or (u is not None and u.ndim != y.ndim):
                raise UsageError(f"{path}: expected y of shape (T, ny) or (B, T, ny) and u alike, got y {y.shape}"
                                 f"{'' if u is None else f', u {u.shape}'}")
            y = y[None] if y.ndim == 2 else y
            u = (np.zeros(y.shape[:2] + (0,)) if u is None else (u[None] if u.ndim == 2 else u))
            ys += list(y)
            us += list(u)
            continue
        df = read_table(path)
        ycols = columns(df, path, outputs, "y", model.ny, "outputs")
        ucols = columns(df, path, inputs, "u", model.nu, "inputs") if model.nu else []
        desc["outputs"], desc["inputs"] = ycols, ucols
        column = trajectory_column
        if column is None and TRAJECTORY_COLUMN in df.columns and TRAJECTORY_COLUMN not in ycols + ucols:
            column = TRAJECTORY_COLUMN
            log.info("%s: one trajectory per value of the column %r", path, column)
        if column is not None and column not in df.columns:
            raise UsageError(f"{path}: missing column(s) ['{column}'] (--trajectory-column); "
                             f"columns in the file: {list(df.columns)}")
        if column is not None:
            used_column = column
            if df[column].isna().any():
                rows = np.flatnonzero(df[column].isna().to_numpy())[:5].tolist()
                raise UsageError(f"{path}: the trajectory column {column!r} is empty at rows {rows}; give every row "
                                 f"a trajectory id")
        groups = [df] if column is None else [g for _, g in df.groupby(column, sort=False)]
        for g in groups:
            _check_time(g, path, len(ys), model.dt, set(ycols + ucols))
            try:
                ys.append(g[ycols].to_numpy(float))
                us.append(g[ucols].to_numpy(float) if ucols else np.zeros((len(g), 0)))
            except (ValueError, TypeError) as exc:
                raise UsageError(f"{path}: non-numeric values in the data columns ({exc})") from None
    for b, (y, u) in enumerate(zip(ys, us)):
        if y.ndim != 2 or y.shape[1] != model.ny or len(y) < 2:
            raise UsageError(f"trajectory {b}: expected outputs of shape (T >= 2, {model.ny}), got {y.shape}")
        if u.shape != (len(y), model.nu):
            raise UsageError(f"trajectory {b}: expected inputs of shape {(len(y), model.nu)}, got {u.shape}")
        bad = np.flatnonzero(~np.all(np.isfinite(u), axis=1))
        if bad.size:
            raise UsageError(f"trajectory {b}: inputs contain NaN/inf at rows {bad[:5].tolist()}"
                             f"{'...' if bad.size > 5 else ''} (inputs must be finite; outputs may be NaN = missing)")
        if np.all(np.isnan(y)):
            raise UsageError(f"trajectory {b}: every output is missing (NaN)")
        if np.any(np.isinf(y)):
            raise UsageError(f"trajectory {b}: outputs contain inf (use NaN for missing values)")
    if not ys:
        raise UsageError("no data: give --data FILE")
    empty = [j for j in range(model.ny) if all(np.all(np.isnan(y[:, j])) for y in ys)]
    if empty:
        cols = [desc["outputs"][j] for j in empty] if desc["outputs"] else [f"y[:, {j}]" for j in empty]
        raise UsageError(f"all outputs missing: output(s) {cols} are NaN in every row of every trajectory; check "
                         f"the data file or choose the columns with --outputs")
    data = cc.Trajectories(ys, us if model.nu else None, model.dt)
    desc.update(lengths=list(data.lengths), ny=model.ny, nu=model.nu, dt=model.dt, trajectory_column=used_column)
    return data, desc


# --- model, options ----------------------------------------------------------------------------------
def model_ref(ref: str) -> str:
    """``--model`` with a file path made absolute (so that a model file names it from anywhere)."""
    from .modelsource import is_file_ref

    module, sep, attr = ref.rpartition(":")
    if sep and is_file_ref(module):
        return f"{Path(module).expanduser().resolve()}:{attr}"
    return ref


def model_from_args(args):
    """(model, theta, SavedModel or None) from ``--model-file`` or ``--model`` / ``--model-kwargs``."""
    from .modelfile import build_model, load_model

    if getattr(args, "model_file", None):
        saved = load_model(args.model_file, trust_source=getattr(args, "trust_source", False))
        return saved.model, saved.theta, saved
    if not getattr(args, "model", None):
        raise UsageError("give --model package.module:factory or path/to/file.py:factory (or --model-file)")
    model = build_model(model_ref(args.model), json_object(args.model_kwargs, "--model-kwargs"))
    return model, model.params.initial(), None


def initial_states(model, theta_vec, data, x0_arg=None) -> np.ndarray:
    """(B, nx): ``--x0``, else the model's x1_mean, else the EKF/RTS estimate at t = 0 from the data."""
    from .initialise import eks_states

    if x0_arg is not None:
        return states(x0_arg, "--x0", model.nx, len(data))
    if model.noise.x1_mean is not None:
        return np.tile(model.noise.x1_mean, (len(data), 1))
    return np.array([x[0] for x in eks_states(model, theta_vec, data)])


FLAG_MAP = {"max_iters": ("ceem", "max_iters"), "tol": ("ceem", "tol"), "acceleration": ("ceem", "acceleration"),
            "n_jobs": ("ceem", "n_jobs"), "rho_x": ("smoother", "rho_x"), "rho_theta": ("learner", "rho_theta"),
            "smoother_max_iter": ("smoother", "max_iter"), "learner_max_iter": ("learner", "max_iter"),
            "smoother_hessian": ("smoother", "hessian"), "learner_hessian": ("learner", "hessian"),
            "time_limit": ("ceem", "time_limit")}


def build_options(config: str | None, args):
    """CEEMOptions from a TOML file (top-level CEEMOptions keys, tables [smoother] and [learner])
    overridden by command line flags, through :meth:`CEEMOptions.from_mapping` (types checked)."""
    from .options import CEEMOptions

    raw: dict = {}
    if config:
        try:
            raw = tomllib.loads(Path(config).read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"--config {config}: {exc}") from None
        try:
            CEEMOptions.from_mapping(raw)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--config {config}: {exc}") from None
    mapping = {k: (dict(v) if k in ("smoother", "learner") and isinstance(v, dict) else v) for k, v in raw.items()}
    for flag, (sec, key) in FLAG_MAP.items():
        if getattr(args, flag, None) is not None:
            (mapping if sec == "ceem" else mapping.setdefault(sec, {}))[key] = getattr(args, flag)
    if getattr(args, "no_prior", False):
        mapping.setdefault("learner", {})["use_prior"] = False
    try:
        options = CEEMOptions.from_mapping(mapping)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid options: {exc}") from None
    cores = os.cpu_count() or 1
    if options.n_jobs > 4 * cores:
        raise UsageError(f"n_jobs = {options.n_jobs}: this machine has {cores} cores; more than {4 * cores} "
                         f"processes only slow the fit down (give --n-jobs {cores})")
    return options
