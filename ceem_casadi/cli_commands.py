"""Bodies of the CLI subcommands ``refine`` and ``calibrate-noise``, and the initial-state rule shared
by ``evaluate`` and ``plot`` (argument parsing: :mod:`ceem_casadi.cli`; validation helpers:
:mod:`ceem_casadi.cli_inputs`).

Exit codes as in :mod:`ceem_casadi.cli`: 0 success, 1 the solver did not converge (the model file is
still written), 2 bad input (:class:`~ceem_casadi.cli_inputs.UsageError`).
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from .cli_inputs import (
    UsageError,
    at_least,
    json_object,
    load_data,
    model_from_args,
    model_ref,
    names,
    states,
    theta_arg,
    writable,
)
from .errors import CeemError

ESTIMATE = "estimate"


def data_from_args(args, model):
    """(Trajectories, description) of ``--data`` with ``--outputs``, ``--inputs``, ``--trajectory-column``."""
    return load_data(args.data, model, outputs=names(args.outputs), inputs=names(args.inputs),
                     trajectory_column=args.trajectory_column)


def positive_seconds(value, what: str):
    """``value`` (seconds) unless it is not a finite number > 0; None passes."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{what}: expected a finite number of seconds > 0, got {value}")
    return value


def float_list(text: str, what: str) -> list[float]:
    """Comma-separated distinct finite numbers > 0."""
    try:
        values = [float(s) for s in names(text) or []]
    except ValueError:
        raise UsageError(f"{what}: expected comma-separated numbers > 0 like 0.3,1,3, got {text!r}") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise UsageError(f"{what}: expected comma-separated finite numbers > 0 like 0.3,1,3, got {text!r}")
    if len(set(values)) != len(values):
        raise UsageError(f"{what}: the levels must be distinct, got {text!r}")
    return values


def model_source(args, saved):
    """(source, kwargs) to record in a derived model file: the factory given with ``--model``, or the
    one named in ``--model-file`` only with ``--trust-source`` (saving a source imports it)."""
    if saved is None:
        return model_ref(args.model), json_object(args.model_kwargs, "--model-kwargs")
    if getattr(args, "trust_source", False):
        return saved.source, saved.kwargs
    return None, None


def default_x0_window(model, lengths) -> int:
    """The window of :func:`~ceem_casadi.validation_report`: ``min(T_min - 1, max(10 nx, 2))``."""
    return int(min(min(lengths) - 1, max(10 * model.nx, 2)))


def initial_states_cli(model, theta_vec, data, x0_arg=None, window=None):
    """Initial states (B, nx) for ``evaluate`` and ``plot``, a sentence saying where they come from,
    and the window used (None unless estimated).

    ``--x0 JSON`` is used as given; ``--x0 estimate``, ``--x0-window N``, or a model without
    ``x1_mean`` estimate every trajectory's x0 from its first N samples
    (:func:`~ceem_casadi.estimate_initial_state`, N default ``min(T_min - 1, 10 nx)``); else the
    model's ``x1_mean``."""
    from .initial_state import estimate_initial_state

    shortest = min(data.lengths)
    if window is not None and not 1 <= window < shortest:
        raise UsageError(f"--x0-window: expected an integer in [1, {shortest - 1}] (samples used to estimate x0, "
                         f"fewer than the shortest trajectory's {shortest}), got {window}")
    explicit = x0_arg is not None and x0_arg.strip() != ESTIMATE
    if explicit and window is not None:
        raise UsageError("--x0-window estimates the initial state, --x0 gives it: give one of them")
    if explicit:
        return states(x0_arg, "--x0", model.nx, len(data)), "x0 given with --x0", None
    if x0_arg is None and window is None and model.noise.x1_mean is not None:
        return np.tile(model.noise.x1_mean, (len(data), 1)), "x0 = the model's x1_mean", None
    window = default_x0_window(model, data.lengths) if window is None else window
    try:
        x0 = estimate_initial_state(model, theta_vec, data, window=window)
    except CeemError as exc:
        raise UsageError(f"estimating x0 from the first {window} samples failed ({exc}); give --x0 or another "
                         f"--x0-window") from None
    rows = "; ".join(" ".join(f"{v:.6g}" for v in x) for x in x0[:5]) + (" ..." if len(x0) > 5 else "")
    return x0, f"x0 estimated from the first {window} samples of each trajectory (--x0-window): {rows}", window


def _summary_line(text: str, quiet: bool) -> None:
    if not quiet:
        print(text, file=sys.stderr)


# --- refine ------------------------------------------------------------------------------------------
def cmd_refine(args) -> int:
    from .modelfile import save_model
    from .output_error import OutputErrorOptions, refine_output_error

    out = writable(args.out, "--out")
    if args.shooting is not None and args.shooting < 1:
        raise UsageError(f"--shooting: expected an integer >= 1 (samples per multiple-shooting segment), "
                         f"got {args.shooting}")
    positive_seconds(args.time_limit, "--time-limit")
    if args.max_iter < 1:
        raise UsageError(f"--max-iter: expected an integer >= 1 (IPOPT iterations), got {args.max_iter}")
    model, theta, saved = model_from_args(args)
    theta = theta_arg(model, args.theta0, "--theta0", base=theta) or theta
    data, desc = data_from_args(args, model)
    shortest = min(data.lengths)
    if args.x0_window is not None and not 1 <= args.x0_window <= shortest:
        raise UsageError(f"--x0-window: expected an integer in [1, {shortest}] (shortest trajectory), "
                         f"got {args.x0_window}")
    if args.x0 is not None and args.x0_window is not None:
        raise UsageError("--x0-window estimates the starting initial states, --x0 gives them: give one of them")
    x0 = states(args.x0, "--x0", model.nx, len(data)) if args.x0 is not None else None
    options = OutputErrorOptions(max_iter=args.max_iter, hessian=args.hessian, use_prior=not args.no_prior,
                                 time_limit=args.time_limit, x0_window=args.x0_window)
    res = refine_output_error(model, theta, data, shooting=args.shooting, x0=x0, options=options)
    source, kwargs = model_source(args, saved)
    summary = {"status": str(res.status), "message": res.message, "iterations": res.iterations,
               "cost_before": res.initial_cost, "cost_after": res.cost, "seconds": round(res.wall_s, 3),
               "shooting": args.shooting, "constraint_violation": res.constraint_violation}
    save_model(out, model, res.theta, source=source, kwargs=kwargs, options=options, data=desc,
               extra={"x0": res.x0}, metadata={"status": str(res.status), "message": res.message,
                                              "refine": summary, "started_from": str(args.model_file or args.model)})
    how = "single shooting" if args.shooting is None else f"multiple shooting, {args.shooting}-sample segments"
    _summary_line(f"output-error refinement ({how}): cost {res.initial_cost:.6g} -> {res.cost:.6g}, "
                  f"{res.iterations} IPOPT iterations, {res.wall_s:.1f} s, status {res.status}", args.quiet)
    summary.update(model_file=str(out), theta={k: np.asarray(v).tolist() for k, v in res.theta.items()},
                   x0=res.x0.tolist())
    print(json.dumps(summary))
    return 0 if res.status == "converged" else 1


# --- calibrate-noise ---------------------------------------------------------------------------------
def _calibration_options(args):
    from .noise_calibration import NoiseCalibrationOptions
    from .options import CEEMOptions

    cores = os.cpu_count() or 1
    if args.n_jobs < 1 or args.n_jobs > 4 * cores:
        raise UsageError(f"--n-jobs: expected an integer in [1, {4 * cores}] (this machine has {cores} cores), "
                         f"got {args.n_jobs}")
    if args.max_iters < 1:
        raise UsageError(f"--max-iters: expected an integer >= 1 (CE-EM iterations per level), got {args.max_iters}")
    positive_seconds(args.time_limit, "--time-limit")
    if not 0 < args.holdout_fraction < 1:
        raise UsageError(f"--holdout-fraction: expected a number in (0, 1), got {args.holdout_fraction}")
    at_least(args.x0_window, 1, "--x0-window")
    try:
        ceem = CEEMOptions(max_iters=args.max_iters, acceleration=args.acceleration)
        return NoiseCalibrationOptions(ceem=ceem, n_jobs=args.n_jobs, time_limit=args.time_limit,
                                       holdout_fraction=args.holdout_fraction, x0_window=args.x0_window)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid options: {exc}") from None


def calibration_table(result):
    """The calibration table as written by ``--table``: one row per level, ``process_std`` split into
    ``process_std_0 ...`` columns, ``chosen`` marks the chosen level (no fit objects)."""
    import pandas as pd

    df = result.table.drop(columns=["fit", "process_std"]).copy()
    stds = np.array([list(p) for p in result.table["process_std"]], float)
    for j in range(stds.shape[1]):
        df.insert(1 + j, f"process_std_{j}", stds[:, j])
    df["chosen"] = np.isclose(df["level"].to_numpy(float), result.best.level)
    return pd.DataFrame(df)


def cmd_calibrate_noise(args) -> int:
    from .modelfile import save_model
    from .noise_calibration import calibrate_noise

    out = writable(args.out, "--out")
    for flag in ("table", "plot"):
        if getattr(args, flag):
            writable(getattr(args, flag), f"--{flag}")
    grid = float_list(args.grid, "--grid") if args.grid is not None else None
    options = _calibration_options(args)
    model, theta, saved = model_from_args(args)
    theta = theta_arg(model, args.theta0, "--theta0", base=theta) or theta
    data, desc = data_from_args(args, model)
    try:
        res = calibrate_noise(model, data, theta, grid=grid, criterion=args.criterion, options=options)
    except (ValueError, CeemError) as exc:
        raise UsageError(str(exc)) from None
    best, fit = res.best, res.best.fit
    table = calibration_table(res)
    if args.table:
        table.to_csv(args.table, index=False)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ax = res.plot()
        ax.figure.savefig(args.plot, dpi=120, bbox_inches="tight")
        plt.close(ax.figure)
    source, kwargs = model_source(args, saved)
    extra = {"x0": np.array([x[0] for x in fit.x])} if fit.x is not None else {}
    meta = {"status": str(fit.status), "message": fit.message,
            "noise_calibration": {"criterion": args.criterion, "level": best.level, "criterion_value": best.criterion,
                                  "process_std": best.process_std.tolist(), "seconds": round(res.seconds, 3),
                                  "table": json.loads(table.to_json(orient="records"))},
            "started_from": str(args.model_file or args.model)}
    save_model(out, best.model, best.theta, source=source, kwargs=kwargs, options=options.ceem, data=desc,
               history=fit.history, extra=extra, metadata=meta)
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


# --- parsers -----------------------------------------------------------------------------------------
def add_parsers(sub, add_model, add_data) -> None:
    """Add the ``refine`` and ``calibrate-noise`` subcommands (``add_model``, ``add_data``: the shared
    flag groups of :mod:`ceem_casadi.cli`)."""
    _add_refine(sub, add_model, add_data)
    _add_calibrate_noise(sub, add_model, add_data)


def _add_refine(sub, _add_model, _add_data):
    p = sub.add_parser("refine", help="output-error (simulation-error) refinement of theta and x0; writes a model file",
                       description="Fit the free parameters and every trajectory's initial state to the free-run "
                                   "simulation error (cc.refine_output_error), e.g. after 'fit'.")
    _add_model(p)
    _add_data(p)
    p.add_argument("--theta0", help="starting parameters JSON (default: the model file's or the factory's)")
    p.add_argument("--shooting", type=int, help="multiple shooting with segments of this many samples "
                                                "(default: single shooting)")
    p.add_argument("--hessian", choices=("gauss-newton", "exact"), default="gauss-newton")
    p.add_argument("--max-iter", type=int, default=500, help="IPOPT iterations (default 500)")
    p.add_argument("--time-limit", type=float, help="wall-clock budget in seconds (status time_limit)")
    p.add_argument("--x0", help="starting initial states JSON (default: estimated from --x0-window samples)")
    p.add_argument("--x0-window", type=int, help="samples used to estimate the starting x0 (default min(T, 10 nx))")
    p.add_argument("--no-prior", action="store_true", help="ignore the parameters' priors")
    p.add_argument("--out", required=True, help="model file to write (.npz; theta and x0)")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line on stderr")
    p.set_defaults(func=cmd_refine)


def _add_calibrate_noise(sub, _add_model, _add_data):
    p = sub.add_parser("calibrate-noise", help="CE-EM over a grid of process-noise levels, one chosen by a criterion",
                       description="Fit CE-EM at every process-noise level of --grid (multipliers of the model's "
                                   "process_std) and write the chosen fit (cc.calibrate_noise).")
    _add_model(p)
    _add_data(p)
    p.add_argument("--theta0", help="starting parameters JSON (default: the model file's or the factory's)")
    p.add_argument("--grid", help="comma-separated multipliers of the model's process_std (default 7 levels "
                                  "0.032..32)")
    p.add_argument("--criterion", choices=("innovation", "holdout"), default="innovation")
    p.add_argument("--max-iters", type=int, default=50, help="CE-EM iterations per level (default 50)")
    p.add_argument("--acceleration", choices=["none", "squarem", "newton"], default="newton")
    p.add_argument("--n-jobs", type=int, default=1, help="processes (default 1)")
    p.add_argument("--time-limit", type=float, help="budget of the whole calibration in seconds")
    p.add_argument("--holdout-fraction", type=float, default=0.25, help="tail held out by 'holdout' (default 0.25)")
    p.add_argument("--x0-window", type=int, default=10, help="samples for each tail's x0 by 'holdout' (default 10)")
    p.add_argument("--out", required=True, help="model file of the chosen level to write (.npz)")
    p.add_argument("--table", help="write the table (one row per level) as CSV")
    p.add_argument("--plot", help="write the criterion and J against the level (.png/.svg)")
    p.add_argument("-q", "--quiet", action="store_true", help="no table and summary on stderr")
    p.set_defaults(func=cmd_calibrate_noise)
