"""Inputs of the command line, validated at the boundary: a bad flag, JSON, TOML or file raises `UsageError`, one
line saying what was expected, what was given and which flag fixes it (exit code 2)."""
from __future__ import annotations

import math
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import tomllib

from ..errors import CeemError
from ..io._limits import InputLimitError, check_text, loads_json, read_text_file
from ..io._readers import read_trajectories
from ..runtime._schema import ACCELERATIONS


class UsageError(Exception):
    """Bad command line input: reported in one line, exit code 2."""


# advice for a library error that carries its ``cause`` (the API's advice names API arguments)
ADVICE = {"fit": "try a --theta0 closer to the truth or a larger process_std in --model-kwargs",
          "calibrate-noise": "try a --theta0 closer to the truth or other --grid levels",
          "refine": "try a --theta0 closer to the truth or give --x0"}
# API argument -> CLI option, by command: a library message naming the argument names the option
API_OPTIONS = {"grid": "--grid", "theta0": "--theta0", "time_limit": "--time-limit", "window": "--x0-window",
               "max_iters": "--max-iters", "shooting": "--shooting", "max_iter": "--max-iter",
               "holdout_fraction": "--holdout-fraction", "x0_window": "--x0-window"}


def cli_message(exc: BaseException, command: str | None, flags=()) -> str:
    """One line for ``exc`` raised by ``command``: a library error's API advice replaced by the CLI's, API argument
    names (``grid:``, ``raise time_limit``) by the command's option strings ``flags`` (``--grid``, ``--time-limit``)."""
    msg = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, UsageError) or command is None:
        return msg
    cause = getattr(exc, "cause", None)
    if cause:  # a library error with API advice: give the CLI's instead
        msg = f"{' '.join(str(cause).split())}; {ADVICE.get(command, 'check the model and --data')}"
    flags = set(flags)
    for arg, flag in API_OPTIONS.items():
        if flag in flags:
            msg = re.sub(rf"(^|[\s(;]){arg}(?=[:=\s)]|$)", rf"\g<1>{flag}", msg)
    return msg


# --- scalars, lists, JSON ----------------------------------------------------------------------
def json_arg(text: str | None, what: str):
    """Parsed JSON text, or the contents of a ``.json`` file; None for None."""
    if text is None:
        return None
    try:
        if text.endswith(".json"):
            return loads_json(read_text_file(text, f"{what} {text}"), f"{what} {text}")
        return loads_json(text, what)
    except InputLimitError as exc:
        raise UsageError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{what}: expected JSON text or a .json file, got {shorten(text)} ({exc})") from None


def shorten(text: str, n: int = 80) -> str:
    """``repr(text)`` cut to about ``n`` characters (a message quotes what was given, not megabytes of it)."""
    return repr(text) if len(text) <= n else f"{text[:n]!r}... ({len(text)} characters)"


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


def numbers(text: str, what: str, expected: str, *, kind=float, ok=math.isfinite, n: int | None = None,
                distinct: bool = False) -> list:
    """Comma-separated numbers of type ``kind`` passing ``ok`` (``n`` of them when given, ``distinct`` if asked);
    a refusal says ``expected``."""
    try:
        values = [kind(s) for s in names(text) or []]
    except ValueError:
        raise UsageError(f"{what}: expected {expected}, got {text!r}") from None
    if n is not None and len(values) != n:
        raise UsageError(f"{what}: expected {n} {expected}, got {len(values)} ({text!r})")
    if not values or not all(ok(v) for v in values):
        raise UsageError(f"{what}: expected {expected}, got {text!r}")
    if distinct and len(set(values)) != len(values):
        raise UsageError(f"{what}: the levels must be distinct, got {text!r}")
    return values


def at_least(value, minimum, what: str, unit: str = ""):
    """``value`` unless it is below ``minimum`` (or not finite); None passes."""
    if value is not None and not (math.isfinite(value) and value >= minimum):
        kind = "an integer" if isinstance(value, int) else "a number"
        raise UsageError(f"{what}: expected {kind} >= {minimum}{unit}, got {value}")
    return value


def positive_seconds(value, what: str):
    """``value`` (seconds) unless it is not a finite number > 0; None passes."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{what}: expected a finite number of seconds > 0, got {value}")
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


def given_x0(x0_arg: str | None, window: int | None, nx: int, data, largest: int) -> np.ndarray | None:
    """Initial states (B, nx) given with ``--x0`` (None when absent or ``estimate``), after checking that
    ``--x0-window`` is in [1, ``largest``] and that not both flags are given."""
    if window is not None and not 1 <= window <= largest:
        raise UsageError(f"--x0-window: expected an integer in [1, {largest}] (samples used to estimate x0; the "
                         f"shortest trajectory has {min(data.lengths)}), got {window}")
    if x0_arg is None or x0_arg.strip() == "estimate":
        return None
    if window is not None:
        raise UsageError("--x0-window estimates the initial states, --x0 gives them: give one of them")
    return states(x0_arg, "--x0", nx, len(data))


def theta_arg(model, text: str | None, what: str, base: dict | None = None) -> dict | None:
    """Parameters from JSON (missing names: from ``base``, else the declared initial values)."""
    given = json_object(text, what) if text is not None else None
    if given is None:
        return None
    try:
        return model.params.validate({**(base or {}), **given}, partial=True)
    except CeemError as exc:
        raise UsageError(f"{what}: {exc}") from None


def writable(path, what: str, directory: bool = False) -> Path:
    """``path`` if a file (or, with ``directory``, a folder) can be written there, checked before any work
    (in the nearest existing folder: nothing is created, so a refused command leaves no empty folder)."""
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
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".ceem-write-test-"):
            pass
        if path.exists() and not directory and not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is read-only")
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot write there ({exc}); choose another {what}") from None
    return path


def figure_path(path, what: str) -> Path:
    """``path`` when its suffix is a figure format the plots write (``.png``, ``.svg``), checked
    before any work (a wrong suffix found after an hour of fitting loses the results)."""
    from ..plots import SUFFIXES

    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise UsageError(f"{what} {path}: expected a file name ending in {' or '.join(SUFFIXES)}, got "
                         f"{path.suffix or 'no suffix'!r}")
    return path


def optional_output(write, what: str, path) -> bool:
    """Run ``write()`` (an optional output such as a figure, after the results are written); a
    failure is reported on stderr as a warning and does not lose the results. True when written."""
    try:
        write()
    except Exception as exc:  # any failure of an optional output: report, never lose the results
        msg = " ".join(str(exc).split()) or type(exc).__name__
        print(f"warning: {what} {path} not written ({type(exc).__name__}: {msg}); the results were written",
              file=sys.stderr)
        return False
    return True


def data_from_args(args, model):
    """(Trajectories, description) of ``--data`` with ``--outputs``, ``--inputs``, ``--trajectory-column``."""
    return read_trajectories(args.data, model, outputs=names(args.outputs), inputs=names(args.inputs),
                             trajectory_column=args.trajectory_column, describe=True)


# --- model, options ----------------------------------------------------------------------------------
def model_ref(ref: str) -> str:
    """``--model`` with a file path made absolute (so that a model file names it from anywhere)."""
    from ..model._source import is_file_ref

    module, sep, attr = ref.rpartition(":")
    if sep and is_file_ref(module):
        return f"{Path(module).expanduser().resolve()}:{attr}"
    return ref


def model_from_args(args):
    """(model, theta, SavedModel or None) from ``--model-file`` or ``--model`` / ``--model-kwargs``."""
    from ..deploy._modelfile import build_model, load_model

    if getattr(args, "model_file", None) and (getattr(args, "model", None) or getattr(args, "model_kwargs", None)):
        raise UsageError("--model-file gives the model, --model/--model-kwargs build one: give one of them (to "
                         "rebuild the file's model from its factory use --model-file with --trust-source)")
    if getattr(args, "model_file", None):
        saved = load_model(args.model_file, trust_source=getattr(args, "trust_source", False))
        return saved.model, saved.theta, saved
    if not getattr(args, "model", None):
        raise UsageError("give --model package.module:factory or path/to/file.py:factory (or --model-file)")
    model = build_model(model_ref(args.model), json_object(args.model_kwargs, "--model-kwargs"))
    return model, model.params.initial(), None


# fit's option flags: dest -> (section of CEEMOptions ("ceem": top level), field, keywords of add_argument)
OPTION_FLAGS = {
    "max_iters": ("ceem", "max_iters", {"type": int}),
    "tol": ("ceem", "tol", {"type": float}),
    "acceleration": ("ceem", "acceleration", {"choices": list(ACCELERATIONS)}),
    "n_jobs": ("ceem", "n_jobs", {"type": int}),
    "rho_x": ("smoother", "rho_x", {"type": float}),
    "rho_theta": ("learner", "rho_theta", {"type": float}),
    "smoother_max_iter": ("smoother", "max_iters", {"type": int}),
    "learner_max_iter": ("learner", "max_iters", {"type": int}),
    "smoother_hessian": ("smoother", "hessian", {}),
    "learner_hessian": ("learner", "hessian", {}),
    "time_limit": ("ceem", "time_limit", {"type": float, "help": "wall-clock budget of the fit in seconds (status "
                                                                  "time_limit)"})}


def build_options(config: str | None, args):
    """CEEMOptions from a TOML file (top-level CEEMOptions keys, tables [smoother] and [learner]) overridden by
    the flags of `OPTION_FLAGS`, through [`CEEMOptions.from_mapping`][ceem_casadi.CEEMOptions.from_mapping]."""
    from ..em._options import CEEMOptions

    raw: dict = {}
    if config:
        try:
            what = f"--config {config}"
            raw = tomllib.loads(check_text(read_text_file(config, what), what, toml=True))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, InputLimitError) as exc:
            raise UsageError(f"--config {config}: {exc}" if not isinstance(exc, InputLimitError) else str(exc)) \
                from None
        except RecursionError:
            raise UsageError(f"--config {config}: nested too deeply to parse") from None
        try:
            CEEMOptions.from_mapping(raw)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"--config {config}: {exc}") from None
    mapping = {k: (dict(v) if k in ("smoother", "learner") and isinstance(v, dict) else v) for k, v in raw.items()}
    for flag, (sec, key, _) in OPTION_FLAGS.items():
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
