"""CLI subcommands that fit and write a model file: ``fit``, ``refine``, ``calibrate-noise``."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import CeemError
from ..runtime._atomic import atomic_path
from ..runtime._solve import deadline
from ._inputs import (
    UsageError,
    at_least,
    build_options,
    data_from_args,
    figure_path,
    given_x0,
    json_object,
    model_from_args,
    model_ref,
    numbers,
    optional_output,
    positive_seconds,
    theta_arg,
    writable,
)


def model_source(args, saved):
    """(source, kwargs) to record in a derived model file: the factory given with ``--model``, or the
    one named in ``--model-file`` only with ``--trust-source`` (saving a source imports it)."""
    if saved is None:
        return model_ref(args.model), json_object(args.model_kwargs, "--model-kwargs")
    if getattr(args, "trust_source", False):
        return saved.source, saved.kwargs
    return None, None


def _summary_line(text: str, quiet: bool) -> None:
    if not quiet:
        print(text, file=sys.stderr)


def cmd_fit(args) -> int:
    if not args.model:
        raise UsageError("give the model as --model package.module:factory or path/to/file.py:factory")
    if args.resume and args.overwrite:
        raise UsageError("--resume continues the checkpoint, --overwrite replaces it: give one of them")
    out = writable(args.out, "--out")
    ckpt_path = writable(args.checkpoint or out.with_name(out.name + ".ckpt.npz"), "--checkpoint")
    if args.states:
        writable(args.states, "--states")
        if Path(args.states).suffix.lower() != ".npz":  # np.savez would write <name>.npz instead
            raise UsageError(f"--states {args.states}: expected a file name ending in .npz (arrays x_0, x_1, ...)")
    if ckpt_path.exists() and not (args.resume or args.overwrite):
        raise UsageError(f"checkpoint {ckpt_path} exists (an earlier fit): continue it with --resume, or start "
                         f"again with --overwrite")
    options = build_options(args.config, args)
    # --time-limit from the start of the command: reading the data and building count (a 10^7-row file
    # read past the limit gives a fit that returns at once, with theta0 and status time_limit)
    with deadline(None if args.time_limit is None else getattr(args, "started", time.perf_counter()) + args.time_limit):
        return _fit_within_limit(args, options, out, ckpt_path)


def _fit_within_limit(args, options, out, ckpt_path) -> int:
    from ..deploy._modelfile import save_model
    from ..em._checkpoint import ceem_checkpointed, read_checkpoint
    from ..em._progress import Progress

    model, theta_init, _ = model_from_args(args)
    try:
        options.smoother.state_bounds(model.nx)  # the lengths of [smoother] x_lower / x_upper, before any work
    except CeemError as exc:
        raise UsageError(f"--config {args.config} [smoother]: {exc}") from None
    data, desc = data_from_args(args, model)
    theta0 = theta_arg(model, args.theta0, "--theta0") or theta_init
    source, kwargs = model_source(args, None)
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
        with atomic_path(args.states) as tmp:
            np.savez(tmp, **{f"x_{b}": x for b, x in enumerate(fit.x)})
    elif args.states:  # the time limit passed before the whole record's states were computed
        _summary_line(f"--states {args.states}: not written, the fit has no states ({fit.message})", args.quiet)
    print(json.dumps({"status": fit.status, "iterations": len(fit.history), "model_file": str(out),
                      "theta": {k: np.asarray(v).tolist() for k, v in fit.theta.items()}}))
    return 0 if fit.status == "converged" else 1


def cmd_refine(args) -> int:
    from ..deploy._modelfile import save_model
    from ..workflow.output_error._output_error import refine_output_error
    from ..workflow.output_error._output_error_options import OutputErrorOptions

    out = writable(args.out, "--out")
    at_least(args.shooting, 1, "--shooting", " (samples per multiple-shooting segment)")
    positive_seconds(args.time_limit, "--time-limit")
    at_least(args.max_iter, 1, "--max-iter", " (solver iterations)")
    model, theta, saved = model_from_args(args)
    theta = theta_arg(model, args.theta0, "--theta0", base=theta) or theta
    data, desc = data_from_args(args, model)
    x0 = given_x0(args.x0, args.x0_window, model.nx, data, min(data.lengths))
    options = OutputErrorOptions(solver=args.solver, use_prior=not args.no_prior,
                                 time_limit=args.time_limit, x0_window=args.x0_window,
                                 **({} if args.max_iter is None else {"max_iters": args.max_iter}))
    res = refine_output_error(model, data, theta, shooting=args.shooting, x0=x0, options=options)
    source, kwargs = model_source(args, saved)
    summary = {"status": str(res.status), "message": res.message, "iterations": res.iterations,
               "cost_before": res.initial_cost, "cost_after": res.cost, "seconds": round(res.wall_s, 3),
               "shooting": args.shooting, "constraint_violation": res.constraint_violation}
    save_model(out, model, res.theta, source=source, kwargs=kwargs, options=options, data=desc,
               extra={"x0": res.x0}, metadata={"status": str(res.status), "message": res.message,
                                              "refine": summary, "started_from": str(args.model_file or args.model)})
    how = "single shooting" if args.shooting is None else f"multiple shooting, {args.shooting}-sample segments"
    _summary_line(f"output-error refinement ({how}): cost {res.initial_cost:.6g} -> {res.cost:.6g}, "
                  f"{res.iterations} {'IPOPT' if args.solver == 'ipopt' else 'Levenberg-Marquardt'} iterations, "
                  f"{res.wall_s:.1f} s, status {res.status}", args.quiet)
    summary.update(model_file=str(out), theta={k: np.asarray(v).tolist() for k, v in res.theta.items()},
                   x0=res.x0.tolist())
    print(json.dumps(summary))
    return 0 if res.status == "converged" else 1


def _calibration_options(args):
    from ..em._options import CEEMOptions
    from ..workflow._noise_calibration_options import NoiseCalibrationOptions

    cores = os.cpu_count() or 1
    if args.n_jobs < 1 or args.n_jobs > 4 * cores:
        raise UsageError(f"--n-jobs: expected an integer in [1, {4 * cores}] (this machine has {cores} cores), "
                         f"got {args.n_jobs}")
    positive_seconds(args.time_limit, "--time-limit")
    # the options' own checks: an OptionsError, its field names replaced by the flags (cli_message)
    acceleration = args.acceleration or NoiseCalibrationOptions().ceem.acceleration  # the API's default
    ceem = CEEMOptions.from_mapping({"max_iters": args.max_iters, "acceleration": acceleration})
    return NoiseCalibrationOptions(ceem=ceem, n_jobs=args.n_jobs, time_limit=args.time_limit,
                                   holdout_fraction=args.holdout_fraction, x0_window=args.x0_window)


def calibration_table(result):
    """The calibration table as written by ``--table``: one row per level, ``process_std`` split into
    ``process_std_0 ...`` columns, ``chosen`` marks the chosen level (no fit objects)."""
    df = result.levels.drop(columns=["fit", "process_std"])
    stds = np.array([list(p) for p in result.levels["process_std"]], float)
    for j in range(stds.shape[1]):
        df.insert(1 + j, f"process_std_{j}", stds[:, j])
    df["chosen"] = np.isclose(df["level"].to_numpy(float), result.best.level)
    return df


def _save_calibration_plot(res, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = res.plot()
    try:
        with atomic_path(path) as tmp:
            ax.figure.savefig(tmp, dpi=120, bbox_inches="tight", format=Path(path).suffix[1:].lower() or None)
    finally:
        plt.close(ax.figure)


def cmd_calibrate_noise(args) -> int:
    from ..deploy._modelfile import save_model
    from ..workflow._noise_calibration import calibrate_noise

    out = writable(args.out, "--out")
    for flag in ("table", "plot"):
        if getattr(args, flag):
            writable(getattr(args, flag), f"--{flag}")
    if args.plot:
        figure_path(args.plot, "--plot")
    grid = None if args.grid is None else numbers(
        args.grid, "--grid", "comma-separated finite numbers > 0 like 0.3,1,3", ok=lambda v: math.isfinite(v) and v > 0,
        distinct=True)
    options = _calibration_options(args)
    model, theta, saved = model_from_args(args)
    theta = theta_arg(model, args.theta0, "--theta0", base=theta) or theta
    data, desc = data_from_args(args, model)
    if options.time_limit is not None:  # --time-limit from the start of the command: reading counts
        left = getattr(args, "started", time.perf_counter()) + options.time_limit - time.perf_counter()
        options = dataclasses.replace(options, time_limit=max(left, 1e-3))
    try:
        res = calibrate_noise(model, data, theta, grid=grid, criterion=args.criterion, options=options)
    except ValueError as exc:  # the library's plain ValueErrors too: one line (CeemErrors: by main)
        if isinstance(exc, CeemError):
            raise
        raise UsageError(str(exc)) from None
    best, fit = res.best, res.best.fit
    table = calibration_table(res)
    source, kwargs = model_source(args, saved)
    extra = {"x0": np.array([x[0] for x in fit.x])} if fit.x is not None else {}
    meta = {"status": str(fit.status), "message": fit.message,
            "noise_calibration": {"criterion": args.criterion, "level": best.level, "criterion_value": best.criterion,
                                  "process_std": best.process_std.tolist(), "seconds": round(res.seconds, 3),
                                  "table": json.loads(table.to_json(orient="records"))},
            "started_from": str(args.model_file or args.model)}
    save_model(out, best.model, best.theta, source=source, kwargs=kwargs, options=options.ceem, data=desc,
               history=fit.history, extra=extra, metadata=meta)  # the result first, then the optional outputs
    if args.table:
        with atomic_path(args.table) as tmp:
            table.to_csv(tmp, index=False)
    if args.plot:
        optional_output(lambda: _save_calibration_plot(res, args.plot), "--plot", args.plot)
    if not args.quiet:
        print(table.to_string(index=False, float_format=lambda v: f"{v:.6g}"), file=sys.stderr)
    _summary_line(f"{args.criterion} criterion chose level {best.level:g} (process_std "
                  f"{' '.join(f'{v:.4g}' for v in best.process_std)}) in {res.seconds:.1f} s; chosen fit: "
                  f"{fit.status} after {len(fit.history)} iterations", args.quiet)
    print(json.dumps({"status": str(fit.status), "criterion": args.criterion, "level": best.level,
                      "process_std": best.process_std.tolist(), "model_file": str(out),
                      "table": None if not args.table else str(Path(args.table)),
                      "theta": {k: np.asarray(v).tolist() for k, v in best.theta.items()}}))
    return 0 if fit.status == "converged" else 1
