"""Command line interface ``ceem-casadi``: fit, evaluate, simulate, smooth, codegen, plot.

Exit codes: 0 success; 1 the fit did not converge (results are still written); 2 bad input (a
one-line message on stderr, no traceback); 130 interrupted (the last checkpoint is kept).
See ``docs/usage_cli.md`` and ``ceem-casadi <command> --help``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import zipfile
from pathlib import Path

import numpy as np
import tomllib

from .errors import CeemError

log = logging.getLogger("ceem_casadi.cli")
PROG = "ceem-casadi"


class UsageError(Exception):
    """Bad command line input: reported in one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # '--max-iter' must not silently mean '--max-iters'
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line instead of usage + message
        raise UsageError(f"{message} (see {self.prog} --help)")


# --- inputs ------------------------------------------------------------------------------------
def _json_arg(text: str | None, what: str):
    if text is None:
        return None
    p = Path(text)
    try:
        if text.endswith(".json"):
            return json.loads(p.read_text())
        return json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{what}: expected JSON text or a .json file, got {text!r} ({exc})") from None


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [s.strip() for s in text.split(",") if s.strip()]


def _read_table(path: Path):
    import pandas as pd

    if not path.is_file():
        raise UsageError(f"{path}: no such data file")
    try:
        if path.suffix.lower() == ".csv":
            return pd.read_csv(path)
        if path.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(path)
    except ImportError as exc:
        raise UsageError(f"{path}: reading Parquet needs pyarrow or fastparquet ({exc})") from None
    except (ValueError, pd.errors.ParserError) as exc:
        raise UsageError(f"{path}: cannot parse the table ({exc})") from None
    raise UsageError(f"{path}: unsupported data file type (use .csv, .parquet or .npz)")


def _columns(df, path, wanted, prefix, n, kind) -> list[str]:
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


def load_data(paths, model, *, outputs=None, inputs=None, trajectory_column=None):
    """Trajectories from CSV/Parquet tables (one trajectory per file or per ``trajectory_column``
    value) or ``.npz`` files (``y`` (T, ny) or (B, T, ny), optional ``u``). Returns (data, description)."""
    import ceem_casadi as cc

    ys, us, desc = [], [], {"files": [], "outputs": None, "inputs": None}
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
            except (ValueError, TypeError, zipfile.BadZipFile) as exc:  # object arrays, text, corrupt zip
                raise UsageError(f"{path}: not a readable .npz of numeric arrays y, u ({exc})") from None
            y = y[None] if y.ndim == 2 else y
            u = (np.zeros(y.shape[:2] + (0,)) if u is None else (u[None] if u.ndim == 2 else u))
            ys += list(y)
            us += list(u)
            continue
        df = _read_table(path)
        ycols = _columns(df, path, outputs, "y", model.ny, "outputs")
        ucols = _columns(df, path, inputs, "u", model.nu, "inputs") if model.nu else []
        desc["outputs"], desc["inputs"] = ycols, ucols
        if trajectory_column is not None and trajectory_column not in df.columns:
            raise UsageError(f"{path}: missing column(s) ['{trajectory_column}'] (--trajectory-column); "
                             f"columns in the file: {list(df.columns)}")
        groups = [df] if trajectory_column is None else [g for _, g in df.groupby(trajectory_column, sort=False)]
        for g in groups:
            try:
                ys.append(g[ycols].to_numpy(float))
                us.append(g[ucols].to_numpy(float) if ucols else np.zeros((len(g), 0)))
            except ValueError as exc:
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
    data = cc.Trajectories(ys, us if model.nu else None, model.dt)
    desc.update(lengths=list(data.lengths), ny=model.ny, nu=model.nu, dt=model.dt,
                trajectory_column=trajectory_column)
    return data, desc


def _model_from_args(args):
    from .modelfile import build_model, load_model

    if getattr(args, "model_file", None):
        saved = load_model(args.model_file, rebuild=not getattr(args, "saved_functions", False))
        return saved.model, saved.theta, saved
    if not getattr(args, "model", None):
        raise UsageError("give --model package.module:factory (or --model-file)")
    kwargs = _json_arg(args.model_kwargs, "--model-kwargs") or {}
    if not isinstance(kwargs, dict):
        raise UsageError(f"--model-kwargs: expected a JSON object, got {kwargs!r}")
    model = build_model(args.model, kwargs)
    return model, model.params.initial(), None


def _data_from_args(args, model):
    return load_data(args.data, model, outputs=_names(args.outputs), inputs=_names(args.inputs),
                     trajectory_column=args.trajectory_column)


def _initial_states(model, theta_vec, data, x0_arg=None) -> np.ndarray:
    """(B, nx): ``--x0``, else the model's x1_mean, else the EKF/RTS estimate at t = 0 from the data."""
    from .initialise import eks_states

    if x0_arg is not None:
        x0 = np.asarray(_json_arg(x0_arg, "--x0"), float)
        x0 = np.tile(x0, (len(data), 1)) if x0.ndim == 1 else x0
        if x0.shape != (len(data), model.nx):
            raise UsageError(f"--x0: expected {model.nx} numbers or {len(data)} lists of them, got shape {x0.shape}")
        return x0
    if model.noise.x1_mean is not None:
        return np.tile(model.noise.x1_mean, (len(data), 1))
    return np.array([x[0] for x in eks_states(model, theta_vec, data)])


# --- options -------------------------------------------------------------------------------------
_FLAG_MAP = {"max_iters": ("ceem", "max_iters"), "tol": ("ceem", "tol"), "acceleration": ("ceem", "acceleration"),
             "n_jobs": ("ceem", "n_jobs"), "rho_x": ("smoother", "rho_x"), "rho_theta": ("learner", "rho_theta"),
             "smoother_max_iter": ("smoother", "max_iter"), "learner_max_iter": ("learner", "max_iter"),
             "smoother_hessian": ("smoother", "hessian"), "learner_hessian": ("learner", "hessian")}


def build_options(config: str | None, args):
    """CEEMOptions from a TOML file (top-level CEEMOptions keys, tables [smoother] and [learner])
    overridden by command line flags."""
    from .options import CEEMOptions, LearnerOptions, SmootherOptions

    sections = {"ceem": {}, "smoother": {}, "learner": {}}
    known = {"ceem": {f.name for f in dataclasses.fields(CEEMOptions)} - {"smoother", "learner"},
             "smoother": {f.name for f in dataclasses.fields(SmootherOptions)},
             "learner": {f.name for f in dataclasses.fields(LearnerOptions)}}
    if config:
        try:
            raw = tomllib.loads(Path(config).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"--config {config}: {exc}") from None
        for key, value in raw.items():
            if key in ("smoother", "learner") and isinstance(value, dict):
                for k, v in value.items():
                    if k not in known[key]:
                        raise UsageError(f"{config}: unknown option {k!r} in [{key}] (known: {sorted(known[key])})")
                    sections[key][k] = v
            elif key in known["ceem"]:
                sections["ceem"][key] = value
            else:
                raise UsageError(f"{config}: unknown option {key!r} (known: {sorted(known['ceem'])}, "
                                 f"tables [smoother], [learner])")
    for flag, (sec, key) in _FLAG_MAP.items():
        if getattr(args, flag, None) is not None:
            sections[sec][key] = getattr(args, flag)
    if getattr(args, "no_prior", False):
        sections["learner"]["use_prior"] = False
    try:
        return CEEMOptions(smoother=SmootherOptions(**sections["smoother"]),
                           learner=LearnerOptions(**sections["learner"]), **sections["ceem"])
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid options: {exc}") from None


# --- subcommands -----------------------------------------------------------------------------------
def cmd_fit(args) -> int:
    from .checkpoint import ceem_checkpointed, read_checkpoint
    from .modelfile import save_model
    from .progress import Progress

    if not args.model:
        raise UsageError("give the model as --model package.module:factory")
    model, theta_init, _ = _model_from_args(args)
    data, desc = _data_from_args(args, model)
    options = build_options(args.config, args)
    theta0 = _json_arg(args.theta0, "--theta0")
    theta0 = model.params.validate(theta0 or {}, partial=True) if theta0 is not None else theta_init
    kwargs = _json_arg(args.model_kwargs, "--model-kwargs") or {}
    out = Path(args.out)
    ckpt_path = Path(args.checkpoint) if args.checkpoint else out.with_name(out.name + ".ckpt.npz")
    if args.resume and not args.quiet:
        print(f"resuming from {ckpt_path} after {read_checkpoint(ckpt_path).iterations} iterations"
              if ckpt_path.exists() else f"no checkpoint {ckpt_path}; starting a new fit", file=sys.stderr)
    progress = Progress(options.max_iters, quiet=args.quiet)
    try:
        fit = ceem_checkpointed(model, data, theta0, ckpt_path, options=options, resume_fit=args.resume,
                                source={"source": args.model, "kwargs": kwargs}, callback=progress)
    finally:
        progress.close()
    progress.close(fit.status, fit.message)
    extra = {"x0": np.array([x[0] for x in fit.x])} if fit.x is not None else {}
    save_model(out, model, fit.theta, source=args.model, kwargs=kwargs, options=options, data=desc,
               history=fit.history, extra=extra, metadata={"status": fit.status, "message": fit.message})
    if args.states and fit.x is not None:
        np.savez(args.states, **{f"x_{b}": x for b, x in enumerate(fit.x)})
    print(json.dumps({"status": fit.status, "iterations": len(fit.history), "model_file": str(out),
                      "theta": {k: np.asarray(v).tolist() for k, v in fit.theta.items()}}))
    return 0 if fit.status == "converged" else 1


def cmd_evaluate(args) -> int:
    from .metrics import validation_report

    model, theta, saved = _model_from_args(args)
    data, _ = _data_from_args(args, model)
    pv = model.theta_vector(theta)
    x0 = _initial_states(model, pv, data, args.x0)
    ks = [int(k) for k in _names(args.k)] if args.k else []
    unc = saved.uncertainty if saved is not None else None
    try:
        if args.uncertainty:  # the Laplace covariance at theta from the given data
            from .uncertainty import UncertaintyOptions, parameter_uncertainty

            if not hasattr(model.params, "validate"):
                raise UsageError("--uncertainty needs the model source (the file was loaded without it)")
            unc = parameter_uncertainty(model, data, theta, options=UncertaintyOptions(hessian=args.uncertainty))
        report = validation_report(model, pv, data, x0=x0, k=ks, skip=args.skip, uncertainty=unc)
    except CeemError as exc:
        raise UsageError(str(exc)) from None
    print(report.to_dataframe().to_string(float_format=lambda v: f"{v:.6g}"))
    if unc is not None:
        u = report.to_dict()["parameters"]
        print(f"parameters (estimate ± standard error, {u['hessian']} Hessian):")
        print("\n".join(f"  {n} = {e:.6g} ± {s:.3g}" for n, e, s in zip(u["names"], u["estimate"], u["std_error"])))
        for w in u.get("warnings", []):
            print(f"  warning: {w}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2))
    return 0


def cmd_simulate(args) -> int:
    import pandas as pd

    import ceem_casadi as cc

    model, theta, _ = _model_from_args(args)
    if args.theta:
        given = _json_arg(args.theta, "--theta")
        if not isinstance(given, dict):
            raise UsageError(f"--theta: expected a JSON object name -> value, got {given!r}")
        theta = (model.params.validate(given, partial=True) if hasattr(model.params, "validate")
                 else {**theta, **given})
    x0 = np.atleast_2d(np.asarray(_json_arg(args.x0, "--x0"), float)) if args.x0 else None
    if x0 is None:
        if model.noise.x1_mean is None:
            raise UsageError(f"give the initial state(s) as --x0 (JSON list of {model.nx} numbers, or lists)")
        x0 = model.noise.x1_mean[None]
    u = None
    if model.nu:
        if not args.input_file:
            raise UsageError(f"the model has {model.nu} inputs: give --input-file with u columns")
        df = _read_table(Path(args.input_file))
        u = [df[_columns(df, args.input_file, _names(args.inputs), "u", model.nu, "inputs")].to_numpy(float)] * len(x0)
    horizon = args.horizon if u is None else len(u[0])
    data, xs = cc.simulate(model, theta, x0, horizon, u=u, process_std=args.process_std,
                           measurement_std=args.measurement_std, seed=args.seed)
    frames = []
    for b, (y, x) in enumerate(zip(data.y, xs)):
        cols = {"trajectory": b, "t": np.arange(len(y)) * (model.dt or 1.0)}
        cols.update({f"y{j}": y[:, j] for j in range(model.ny)})
        cols.update({f"u{j}": data.inputs(b)[:, j] for j in range(model.nu)})
        cols.update({f"x{j}": x[:, j] for j in range(model.nx)})
        frames.append(pd.DataFrame(cols))
    pd.concat(frames).to_csv(args.out, index=False)
    print(f"wrote {args.out}: {len(xs)} trajectories of {horizon} samples")
    return 0


def cmd_smooth(args) -> int:
    import pandas as pd

    from .initialise import eks_states

    model, theta, _ = _model_from_args(args)
    data, _ = _data_from_args(args, model)
    pv = model.theta_vector(theta)
    xs = eks_states(model, pv, data)
    if args.method == "ce":
        from .smoother import Smoother

        if not hasattr(model.params, "validate"):
            raise UsageError("the CE smoother needs the model from its factory: drop --saved-functions "
                             "or use --method eks")
        res = Smoother(model).solve(pv, data, xs)
        xs = [r.x for r in res]
    frames = [pd.DataFrame({"trajectory": b, "t": np.arange(len(x)) * (model.dt or 1.0),
                            **{f"x{j}": x[:, j] for j in range(model.nx)}}) for b, x in enumerate(xs)]
    pd.concat(frames).to_csv(args.out, index=False)
    print(f"wrote {args.out}")
    return 0


def cmd_codegen(args) -> int:
    from .codegen import compile_example, generate_ekf

    model, theta, saved = _model_from_args(args)
    pv = model.theta_vector(theta)
    x0 = np.asarray(_json_arg(args.x0, "--x0"), float) if args.x0 else (
        saved.extra["x0"][0] if saved is not None and "x0" in saved.extra else None)
    try:
        gen = generate_ekf(model, pv, args.out_dir, name=args.name, x0=x0,
                           theta_as_argument=args.theta_as_argument)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {gen.source}, {gen.header}, {gen.example}")
    if args.compile:
        try:
            print(f"compiled {compile_example(gen)}")
        except RuntimeError as exc:
            raise UsageError(str(exc)) from None
    return 0


def cmd_plot(args) -> int:
    from . import plots
    from .initialise import eks_states

    model, theta, saved = _model_from_args(args)
    out, ext = Path(args.out_dir), f".{args.format}"
    written = []
    if saved is not None and saved.history:
        written.append(plots.plot_history(saved.history, out / f"history{ext}", title=saved.source or ""))
    if args.data:
        data, _ = _data_from_args(args, model)
        b = args.trajectory
        if not 0 <= b < len(data):
            raise UsageError(f"--trajectory: expected 0..{len(data) - 1}, got {b}")
        pv = model.theta_vector(theta)
        x = eks_states(model, pv, data)[b]
        u = data.inputs(b)
        y_fit = np.asarray(model.g.map(len(x))(x.T, u.T, pv)).T
        written.append(plots.plot_states(x, data.y[b], out / f"states{ext}", y_fit=y_fit, dt=model.dt))
        x0 = _initial_states(model, pv, data[b:b + 1], args.x0)[0]
        if saved is not None:
            pred = saved.predict(data.y[b], u, x0=x0).y_pred
        else:
            from .baselines.ekf import EKF

            n = model.noise
            pred = EKF(model).run(pv, data.y[b], u, x0=x0, Sigma0=n.process_std ** 2, Q=n.process_std ** 2,
                                  R=n.measurement_std ** 2).y_pred
        written.append(plots.plot_prediction(data.y[b], pred, out / f"prediction{ext}", dt=model.dt,
                                             label="EKF one-step prediction"))
    if not written:
        raise UsageError("nothing to plot: give --model-file with a fit history and/or --data")
    for p in written:
        print(f"wrote {p}")
    return 0


# --- parser ---------------------------------------------------------------------------------------------
def _add_model(p, *, file_only=False, file_allowed=True):
    if file_allowed:
        p.add_argument("--model-file", help="model file written by 'fit' (.npz)", required=file_only)
        p.add_argument("--saved-functions", action="store_true",
                       help="use the model functions stored in the model file instead of importing its factory")
    if not file_only:
        p.add_argument("--model", help="model factory as package.module:factory (importable; e.g. models.lorenz:single_lorenz)")
        p.add_argument("--model-kwargs", help="JSON object (or .json file) of keyword arguments for the factory")


def _add_data(p, required=True):
    p.add_argument("--data", action="append", required=required, metavar="FILE",
                   help="CSV/Parquet table or .npz (arrays y, u); repeat for several trajectories")
    p.add_argument("--outputs", help="comma-separated output columns (default: columns named y*)")
    p.add_argument("--inputs", help="comma-separated input columns (default: columns named u*)")
    p.add_argument("--trajectory-column", help="column whose values split a table into trajectories")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog=PROG, description="Identify, evaluate and deploy state-space models with CE-EM (CasADi).")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("fit", help="identify a model from data (CE-EM) and write a model file",
                       description="Fit with CE-EM; writes the model file, a checkpoint per iteration, a JSON summary.")
    _add_model(p, file_allowed=False)
    _add_data(p)
    p.add_argument("--theta0", help="initial parameters: JSON object (or .json file), missing names = factory's values")
    p.add_argument("--config", help="TOML options: CEEMOptions keys at top level, tables [smoother], [learner]")
    p.add_argument("--max-iters", type=int)
    p.add_argument("--tol", type=float)
    p.add_argument("--acceleration", choices=["none", "squarem", "newton"])
    p.add_argument("--n-jobs", type=int)
    p.add_argument("--rho-x", type=float)
    p.add_argument("--rho-theta", type=float)
    p.add_argument("--smoother-max-iter", type=int)
    p.add_argument("--learner-max-iter", type=int)
    p.add_argument("--smoother-hessian")
    p.add_argument("--learner-hessian")
    p.add_argument("--no-prior", action="store_true", help="ignore the parameters' priors")
    p.add_argument("--out", default="model.npz", help="model file to write (default model.npz)")
    p.add_argument("--checkpoint", help="checkpoint file (default <out>.ckpt.npz)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint if it exists")
    p.add_argument("--states", help="also write the smoothed states (.npz, x_0, x_1, ...)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("evaluate", help="validation report: RMSE/NRMSE/fit %% of free-run and k-step prediction")
    _add_model(p)
    _add_data(p)
    p.add_argument("--k", default="1", help="comma-separated prediction horizons (samples), default 1")
    p.add_argument("--skip", type=int, default=0, help="leading samples left out of the metrics")
    p.add_argument("--x0", help="initial state(s) JSON; default x1_mean, else the EKF/RTS estimate from the data")
    p.add_argument("--json", help="write the report as JSON to this file")
    p.add_argument("--uncertainty", choices=("exact", "gauss-newton"),
                   help="compute parameter standard errors from this data (default: those stored in the model file)")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("simulate", help="simulate the model and write a CSV (t, y*, u*, x*)")
    _add_model(p)
    p.add_argument("--theta", help="parameters JSON (default: from the model file or the factory)")
    p.add_argument("--x0", help="initial state(s): JSON list of nx numbers, or a list of such lists")
    p.add_argument("--horizon", type=int, default=100, help="samples per trajectory (default 100)")
    p.add_argument("--input-file", help="CSV/Parquet with input columns (models with inputs)")
    p.add_argument("--inputs", help="comma-separated input columns (default u*)")
    p.add_argument("--process-std", type=float, default=0.0)
    p.add_argument("--measurement-std", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="CSV file to write")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("smooth", help="smoothed state trajectories (CE smoother or EKF/RTS) as CSV")
    _add_model(p)
    _add_data(p)
    p.add_argument("--method", choices=["ce", "eks"], default="ce")
    p.add_argument("--out", required=True, help="CSV file to write (trajectory, t, x*)")
    p.set_defaults(func=cmd_smooth)

    p = sub.add_parser("codegen", help="C99 source of the EKF predictor (+ example program)")
    _add_model(p)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--name", default="ekf", help="C prefix and file name (default ekf)")
    p.add_argument("--x0", help="initial state JSON (default: the fit's first initial state, else x1_mean/zeros)")
    p.add_argument("--theta-as-argument", action="store_true", help="theta settable at run time")
    p.add_argument("--compile", action="store_true", help="compile the example program with gcc -Werror")
    p.set_defaults(func=cmd_codegen)

    p = sub.add_parser("plot", help="figures: history, smoothed states with outputs, predicted vs measured")
    _add_model(p)
    _add_data(p, required=False)
    p.add_argument("--trajectory", type=int, default=0, help="trajectory to plot (default 0)")
    p.add_argument("--x0", help="initial state JSON for the prediction (default: EKF/RTS estimate)")
    p.add_argument("--format", choices=["png", "svg"], default="png")
    p.add_argument("--out-dir", required=True)
    p.set_defaults(func=cmd_plot)
    return ap


def main(argv=None) -> int:
    if os.getcwd() not in sys.path and "" not in sys.path:  # as 'python -m': models importable from cwd
        sys.path.insert(0, os.getcwd())
    parser = build_parser()
    command = None
    try:
        args = parser.parse_args(argv)
        command = args.command
        logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                            format="%(levelname)s %(name)s: %(message)s")
        return int(args.func(args))
    except (UsageError, CeemError, OSError) as exc:
        where = f"{PROG} {command}" if command else PROG
        msg = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{where}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (a fit keeps the checkpoint of its last complete iteration; continue "
              f"with --resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
