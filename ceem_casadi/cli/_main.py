"""Command line interface ``ceem-casadi``: the parser and the mapping of errors to exit codes (0 success, 1 not
converged, results written; 2 bad input, one line; 130 interrupted); docs/usage_cli.md.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from ..errors import CeemError
from ..runtime._schema import ACCELERATIONS
from ._commands import cmd_codegen, cmd_evaluate, cmd_plot, cmd_simulate, cmd_smooth
from ._design import add_design_parser
from ._fit import cmd_calibrate_noise, cmd_fit, cmd_refine
from ._inputs import OPTION_FLAGS, UsageError, cli_message

PROG = "ceem-casadi"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # '--max-iter' must not silently mean '--max-iters'
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line instead of usage + message
        exc = UsageError(f"{message} (see {self.prog} --help)")
        exc.where = self.prog
        raise exc


def _add_model(p, *, file_allowed=True):
    if file_allowed:
        p.add_argument("--model-file", help="model file written by 'fit' (.npz)")
        p.add_argument("--trust-source", action="store_true",
                       help="rebuild the model by importing and calling the factory named in the model file: this "
                            "RUNS CODE named by the file, only for files you made (default: the stored expression "
                            "graphs, no code runs)")
        p.add_argument("--saved-functions", action="store_true",
                       help="deprecated, the default: use the model functions stored in the model file")
    p.add_argument("--model", help="model factory as path/to/file.py:factory or package.module:factory "
                                   "(e.g. models/lorenz.py:single_lorenz)")
    p.add_argument("--model-kwargs", help="JSON object (or .json file) of keyword arguments for the factory")


def _add_data(p, required=True):
    p.add_argument("--data", action="append", required=required, metavar="FILE",
                   help="CSV/Parquet table or .npz (arrays y, u); repeat for several trajectories")
    p.add_argument("--outputs", help="comma-separated output columns (default: columns named y*)")
    p.add_argument("--inputs", help="comma-separated input columns (default: columns named u*)")
    p.add_argument("--trajectory-column", help="column whose values split a table into trajectories (default: the "
                                               "column 'trajectory' when present, as written by simulate)")


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
    for dest, (_, _, keywords) in OPTION_FLAGS.items():
        p.add_argument(f"--{dest.replace('_', '-')}", **keywords)
    p.add_argument("--no-prior", action="store_true", help="ignore the parameters' priors")
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
    p.add_argument("--residuals", action="store_true", help="residual analysis: whiteness (Ljung-Box) and input "
                                                            "independence of the one-step and free-run residuals")
    p.add_argument("--bands", action="store_true", help="95 %% bands of the free run (and of the --k predictions) "
                                                        "from the parameter covariance")
    p.add_argument("--plot", help="with --residuals/--bands: directory for their figures (.png)")
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
    p.add_argument("--build-example", action="store_true", help="build the example program with gcc -Werror")
    p.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)  # deprecated: --build-example
    p.set_defaults(func=cmd_codegen)

    p = sub.add_parser("plot", help="figures: history, smoothed states with outputs, predicted vs measured")
    _add_model(p)
    _add_data(p, required=False)
    p.add_argument("--trajectory", type=int, default=0, help="trajectory to plot (default 0)")
    _add_x0(p)
    p.add_argument("--format", choices=["png", "svg"], default="png")
    p.add_argument("--out-dir", required=True)
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("refine", help="output-error (simulation-error) refinement of theta and x0; writes a model file",
                       description="Fit the free parameters and every trajectory's initial state to the free-run "
                                   "simulation error (cc.refine_output_error), e.g. after 'fit'.")
    _add_model(p)
    _add_data(p)
    p.add_argument("--theta0", help="starting parameters JSON (default: the model file's or the factory's)")
    p.add_argument("--shooting", type=int, help="multiple shooting with segments of this many samples "
                                                "(default: single shooting)")
    p.add_argument("--solver", choices=("lm", "ipopt"), default="lm",
                   help="lm: the Levenberg-Marquardt engine (default); ipopt: one IPOPT NLP (Gauss-Newton)")
    p.add_argument("--max-iter", type=int, default=None,
                   help="iterations of the solver (default: OutputErrorOptions' max_iters, 200)")
    p.add_argument("--time-limit", type=float, help="wall-clock budget in seconds (status time_limit)")
    p.add_argument("--x0", help="starting initial states JSON (default: estimated from --x0-window samples)")
    p.add_argument("--x0-window", type=int, help="samples used to estimate the starting x0 (default min(T, 10 nx))")
    p.add_argument("--no-prior", action="store_true", help="ignore the parameters' priors")
    p.add_argument("--out", required=True, help="model file to write (.npz; theta and x0)")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line on stderr")
    p.set_defaults(func=cmd_refine)

    p = sub.add_parser("calibrate-noise", help="CE-EM over a grid of process-noise levels, one chosen by a criterion",
                       description="Fit CE-EM at every process-noise level of --grid (multipliers of the model's "
                                   "process_std) and write the chosen fit (cc.calibrate_noise).")
    _add_model(p)
    _add_data(p)
    p.add_argument("--theta0", help="starting parameters JSON (default: the model file's or the factory's)")
    p.add_argument("--grid", help="comma-separated multipliers of the model's process_std (default 7 levels 0.032..32)")
    p.add_argument("--criterion", choices=("innovation", "holdout"), default="innovation")
    p.add_argument("--max-iters", type=int, default=50, help="CE-EM iterations per level (default 50)")
    p.add_argument("--acceleration", choices=list(ACCELERATIONS),
                   help="default: the API's, NoiseCalibrationOptions().ceem.acceleration")
    p.add_argument("--n-jobs", type=int, default=1, help="processes (default 1)")
    p.add_argument("--time-limit", type=float, help="budget of the whole calibration in seconds")
    p.add_argument("--holdout-fraction", type=float, default=0.25, help="tail held out by 'holdout' (default 0.25)")
    p.add_argument("--x0-window", type=int, default=10, help="samples for each tail's x0 by 'holdout' (default 10)")
    p.add_argument("--out", required=True, help="model file of the chosen level to write (.npz)")
    p.add_argument("--table", help="write the table (one row per level) as CSV")
    p.add_argument("--plot", help="write the criterion and J against the level (.png/.svg)")
    p.add_argument("-q", "--quiet", action="store_true", help="no table and summary on stderr")
    p.set_defaults(func=cmd_calibrate_noise)

    add_design_parser(sub, _add_model)
    return ap


def _command_flags(parser, command: str | None) -> list[str]:
    """The option strings of ``command`` (e.g. ``--grid``), from the ``parser``."""
    for action in parser._subparsers._group_actions:
        sub = action.choices.get(command)
        if sub is not None:
            return [o for a in sub._actions for o in a.option_strings]
    return []


def drop_working_directory() -> None:
    """Remove the working directory ('' or its path) from ``sys.path`` (``python -m`` puts it first)."""
    cwd = os.path.realpath(os.getcwd())
    sys.path[:] = [p for p in sys.path if p != "" and os.path.realpath(p) != cwd]


def main(argv=None) -> int:
    """Run the ``ceem-casadi`` command line (the console script and ``python -m ceem_casadi.cli``).

    Parameters
    ----------
    argv : list of str, optional
        The arguments after the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit status: 0 success; 1 not converged (results written); 2 bad input (one line on stderr); 130
        interrupted.

    Examples
    --------
    A model that is neither ``package.module:factory`` nor ``file.py:factory`` is bad input (exit status 2):

    >>> from ceem_casadi.cli import main
    >>> main(["evaluate", "--model", "missing.ceem.json", "--data", "missing.csv"])
    2
    """
    started = time.perf_counter()  # --time-limit counts from here: reading and building are part of it
    parser = build_parser()
    command = None
    try:
        args, extra = parser.parse_known_args(argv)
        args.started = started
        command = args.command
        if extra:  # named by the command they were given to, like every other bad input
            raise UsageError(f"unrecognized arguments: {' '.join(extra)} (see {PROG} {command} --help)")
        logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                            format="%(levelname)s %(name)s: %(message)s")
        logging.captureWarnings(True)  # every library warning (logged or warnings.warn) reaches stderr
        return int(args.func(args))
    except (UsageError, CeemError, OSError) as exc:
        where = f"{PROG} {command}" if command else getattr(exc, "where", PROG)
        print(f"{where}: error: {cli_message(exc, command, _command_flags(parser, command))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_message(command), file=sys.stderr)
        return 130


CHECKPOINTED = ("fit",)  # the commands that write a checkpoint and take --resume


def interrupted_message(command: str | None) -> str:
    """The line printed on Ctrl-C: the checkpoint and ``--resume`` only for a command that has them."""
    if command in CHECKPOINTED:
        return (f"{PROG} {command}: interrupted (the checkpoint of the last complete iteration is kept; continue "
                f"with --resume)")
    return f"{PROG} {command or ''}".rstrip() + ": interrupted (this command keeps no checkpoint: run it again)"
