"""Command line interface ``ceem-casadi``: fit, calibrate-noise, refine, evaluate, simulate, smooth, codegen, plot.

Exit codes: 0 success; 1 the fit did not converge (results are still written); 2 bad input (a
one-line message on stderr, no traceback); 130 interrupted (the last checkpoint is kept).
See ``docs/usage_cli.md`` and ``ceem-casadi <command> --help``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np

from .cli_commands import add_parsers, data_from_args, initial_states_cli
from .cli_inputs import (
    UsageError,
    at_least,
    build_options,
    int_list,
    json_object,
    load_data,  # noqa: F401  (re-exported: ceem_casadi.cli.load_data)
    model_from_args,
    model_ref,
    names,
    states,
    theta_arg,
    writable,
)
from .errors import CeemError
from .io.trajectories import columns, read_table

log = logging.getLogger("ceem_casadi.cli")
PROG = "ceem-casadi"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # '--max-iter' must not silently mean '--max-iters'
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line instead of usage + message
        exc = UsageError(f"{message} (see {self.prog} --help)")
        exc.where = self.prog
        raise exc


_data_from_args = data_from_args


# --- subcommands -----------------------------------------------------------------------------------
def cmd_fit(args) -> int:
    from .checkpoint import ceem_checkpointed, read_checkpoint
    from .modelfile import save_model
    from .progress import Progress

    if not args.model:
        raise UsageError("give the model as --model package.module:factory or path/to/file.py:factory")
    if args.resume and args.overwrite:
        raise UsageError("--resume continues the checkpoint, --overwrite replaces it: give one of them")
    out = writable(args.out, "--out")
    ckpt_path = writable(args.checkpoint or out.with_name(out.name + ".ckpt.npz"), "--checkpoint")
    if args.states:
        writable(args.states, "--states")
    if ckpt_path.exists() and not (args.resume or args.overwrite):
        raise UsageError(f"checkpoint {ckpt_path} exists (an earlier fit): continue it with --resume, or start "
                         f"again with --overwrite")
    options = build_options(args.config, args)
    model, theta_init, _ = model_from_args(args)
    data, desc = _data_from_args(args, model)
    theta0 = theta_arg(model, args.theta0, "--theta0") or theta_init
    kwargs = json_object(args.model_kwargs, "--model-kwargs")
    source = model_ref(args.model)
    if args.resume and not args.quiet:
        print(f"resuming from {ckpt_path} after {read_checkpoint(ckpt_path).iterations} iterations"
              if ckpt_path.exists() else f"no checkpoint {ckpt_path}; starting a new fit", file=sys.stderr)
    progress = Progress(options.max_iters, quiet=args.quiet)
    try:
        fit = ceem_checkpointed(model, data, theta0, ckpt_path, options=options, resume_fit=args.resume,
                                source={"source": source, "kwargs": kwargs}, callback=progress)
    finally:
        progress.close()
    progress.close(fit.status, fit.message)
    extra = {"x0": np.array([x[0] for x in fit.x])} if fit.x is not None else {}
    save_model(out, model, fit.theta, source=source, kwargs=kwargs, options=options, data=desc,
               history=fit.history, extra=extra, metadata={"status": fit.status, "message": fit.message})
    if args.states and fit.x is not None:
        np.savez(args.states, **{f"x_{b}": x for b, x in enumerate(fit.x)})
    print(json.dumps({"status": fit.status, "iterations": len(fit.history), "model_file": str(out),
                      "theta": {k: np.asarray(v).tolist() for k, v in fit.theta.items()}}))
    return 0 if fit.status == "converged" else 1


def cmd_evaluate(args) -> int:
    from .metrics import validation_report

    ks = int_list(args.k, "--k") if args.k else []
    at_least(args.skip, 0, "--skip", " (leading samples left out)")
    if args.json:
        writable(args.json, "--json")
    model, theta, saved = model_from_args(args)
    data, _ = _data_from_args(args, model)
    theta_vec = model.theta_vector(theta)
    x0, x0_note, window = initial_states_cli(model, theta_vec, data, args.x0, args.x0_window)
    skip = args.skip if args.skip is not None else (window or 0)
    if skip >= min(data.lengths):
        raise UsageError(f"--skip: expected fewer than {min(data.lengths)} samples (the shortest trajectory), "
                         f"got {skip}")
    if ks and max(ks) >= min(data.lengths) - skip:
        raise UsageError(f"--k: expected horizons below {min(data.lengths) - skip} (samples of the shortest "
                         f"trajectory after --skip), got {max(ks)}")
    print(x0_note + (f"; the metrics leave out the first {skip} samples (--skip)" if skip else ""))
    unc = saved.uncertainty if saved is not None else None
    try:
        if args.uncertainty:  # the Laplace covariance at theta from the given data
            from .uncertainty import UncertaintyOptions, parameter_uncertainty

            if not hasattr(model.params, "validate"):
                raise UsageError("--uncertainty needs the model source (the file was loaded without it)")
            unc = parameter_uncertainty(model, data, theta, options=UncertaintyOptions(hessian=args.uncertainty))
        report = validation_report(model, theta_vec, data, x0=x0, k=ks, skip=skip, uncertainty=unc)
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

    if args.horizon < 2:
        raise UsageError(f"--horizon: expected an integer >= 2 (samples per trajectory), got {args.horizon}")
    at_least(args.process_std, 0, "--process-std")
    at_least(args.measurement_std, 0, "--measurement-std")
    at_least(args.seed, 0, "--seed")
    writable(args.out, "--out")
    model, theta, _ = model_from_args(args)
    theta = theta_arg(model, args.theta, "--theta", base=theta) or theta
    x0 = states(args.x0, "--x0", model.nx)
    if x0 is None:
        if model.noise.x1_mean is None:
            raise UsageError(f"give the initial state(s) as --x0 (JSON list of {model.nx} numbers, or lists)")
        x0 = model.noise.x1_mean[None]
    u = None
    if model.nu:
        if not args.input_file:
            raise UsageError(f"the model has {model.nu} inputs: give --input-file with u columns")
        df = read_table(Path(args.input_file))
        try:
            u = [df[columns(df, args.input_file, names(args.inputs), "u", model.nu, "inputs")].to_numpy(float)]
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{args.input_file}: non-numeric values in the input columns ({exc})") from None
        if len(u[0]) < 2 or not np.all(np.isfinite(u[0])):
            raise UsageError(f"{args.input_file}: expected at least 2 rows of finite inputs")
        u = u * len(x0)
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

    writable(args.out, "--out")
    model, theta, _ = model_from_args(args)
    data, _ = _data_from_args(args, model)
    theta_vec = model.theta_vector(theta)
    xs = eks_states(model, theta_vec, data)
    if args.method == "ce":
        from .smoother import Smoother

        res = Smoother(model).solve(theta_vec, data, xs)
        xs = [r.x for r in res]
    frames = [pd.DataFrame({"trajectory": b, "t": np.arange(len(x)) * (model.dt or 1.0),
                            **{f"x{j}": x[:, j] for j in range(model.nx)}}) for b, x in enumerate(xs)]
    pd.concat(frames).to_csv(args.out, index=False)
    print(f"wrote {args.out}")
    return 0


def cmd_codegen(args) -> int:
    from .codegen import compile_example, generate_ekf

    writable(args.out_dir, "--out-dir", directory=True)
    model, theta, saved = model_from_args(args)
    theta_vec = model.theta_vector(theta)
    x0 = states(args.x0, "--x0", model.nx)[0] if args.x0 else (
        saved.extra["x0"][0] if saved is not None and "x0" in saved.extra else None)
    try:
        gen = generate_ekf(model, theta_vec, args.out_dir, name=args.name, x0=x0,
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
    import ceem_casadi as cc

    from . import plots
    from .initialise import eks_states

    out, ext = writable(args.out_dir, "--out-dir", directory=True), f".{args.format}"
    model, theta, saved = model_from_args(args)
    written = []
    if saved is not None and saved.history:
        written.append(plots.plot_history(saved.history, out / f"history{ext}", title=saved.source or ""))
    if args.data:
        data, _ = _data_from_args(args, model)
        b = args.trajectory
        if not 0 <= b < len(data):
            raise UsageError(f"--trajectory: expected 0..{len(data) - 1}, got {b}")
        theta_vec = model.theta_vector(theta)
        x = eks_states(model, theta_vec, data)[b]
        u = data.inputs(b)
        y_fit = np.asarray(model.g.map(len(x))(x.T, u.T, theta_vec)).T
        written.append(plots.plot_states(x, data.y[b], out / f"states{ext}", y_fit=y_fit, dt=model.dt))
        x0, x0_note, window = initial_states_cli(model, theta_vec, data[b:b + 1], args.x0, args.x0_window)
        x0 = x0[0]
        print(x0_note + (f"; the simulation is scored from sample {window} on" if window else ""))
        y_sim = np.array(cc.simulate_output(model, theta_vec, u, x0), float)
        y_sim[:window or 0] = np.nan  # as evaluate: the samples that fitted x0 are not scored
        written.append(plots.plot_prediction(data.y[b], y_sim, out / f"simulation{ext}", dt=model.dt,
                                             label="free-run simulation"))
        if saved is not None:
            pred = saved.predict(data.y[b], u, x0=x0).y_pred
        else:
            from .filtering import EKF

            n = model.noise
            pred = EKF(model).run(theta_vec, data.y[b], u, x0=x0, Sigma0=n.process_std ** 2, Q=n.process_std ** 2,
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
        p.add_argument("--trust-source", action="store_true",
                       help="rebuild the model by importing and calling the factory named in the model file: this "
                            "RUNS CODE named by the file, only for files you made (default: the stored expression "
                            "graphs, no code runs)")
        p.add_argument("--saved-functions", action="store_true",
                       help="deprecated, the default: use the model functions stored in the model file")
    if not file_only:
        p.add_argument("--model", help="model factory as path/to/file.py:factory or package.module:factory "
                                       "(e.g. models/lorenz.py:single_lorenz)")
        p.add_argument("--model-kwargs", help="JSON object (or .json file) of keyword arguments for the factory")


def _add_data(p, required=True):
    p.add_argument("--data", action="append", required=required, metavar="FILE",
                   help="CSV/Parquet table or .npz (arrays y, u); repeat for several trajectories")
    p.add_argument("--outputs", help="comma-separated output columns (default: columns named y*)")
    p.add_argument("--inputs", help="comma-separated input columns (default: columns named u*)")
    p.add_argument("--trajectory-column", help="column whose values split a table into trajectories "
                                               "(default: the column 'trajectory' when present, as written by simulate)")


def _add_x0(p):
    p.add_argument("--x0", help="initial state(s) JSON, or 'estimate'; default x1_mean, else estimated from the first "
                                "--x0-window samples of each trajectory")
    p.add_argument("--x0-window", type=int, help="estimate x0 from this many leading samples (default min(T - 1, "
                                                 "10 nx)); also for a model with x1_mean")


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
    p.add_argument("--time-limit", type=float, help="wall-clock budget of the fit in seconds (status time_limit)")
    p.add_argument("--out", default="model.npz", help="model file to write (default model.npz)")
    p.add_argument("--checkpoint", help="checkpoint file (default <out>.ckpt.npz)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint if it exists")
    p.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint (start a new fit)")
    p.add_argument("--states", help="also write the smoothed states (.npz, x_0, x_1, ...)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("evaluate", help="validation report: RMSE/NRMSE/fit %% of free-run and k-step prediction")
    _add_model(p)
    _add_data(p)
    p.add_argument("--k", default="1", help="comma-separated prediction horizons (samples), default 1")
    p.add_argument("--skip", type=int, help="leading samples left out of the metrics (default: the --x0-window "
                                           "samples when x0 is estimated, else 0)")
    _add_x0(p)
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
    _add_x0(p)
    p.add_argument("--format", choices=["png", "svg"], default="png")
    p.add_argument("--out-dir", required=True)
    p.set_defaults(func=cmd_plot)
    add_parsers(sub, _add_model, _add_data)
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
        where = f"{PROG} {command}" if command else getattr(exc, "where", PROG)
        msg = " ".join(str(exc).split()) or type(exc).__name__
        if getattr(exc, "cause", None):  # a library error with API advice: give the CLI's instead
            msg = f"{exc.cause}; try a --theta0 closer to the truth or a larger process_std in --model-kwargs"
        print(f"{where}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted (a fit keeps the checkpoint of its last complete iteration; continue "
              f"with --resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
