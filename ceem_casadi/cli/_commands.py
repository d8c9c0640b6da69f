"""CLI subcommands that use a model: ``evaluate``, ``simulate``, ``smooth``, ``codegen``, ``plot``."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..errors import CeemError
from ..io._readers import columns, read_table
from ..runtime._atomic import atomic_path, atomic_write_text
from ._assess import assess
from ._inputs import (
    UsageError,
    at_least,
    data_from_args,
    given_x0,
    model_from_args,
    names,
    numbers,
    states,
    theta_arg,
    writable,
)


def initial_states_cli(model, theta_vec, data, x0_arg=None, window=None):
    """(x0 (B, nx), a sentence saying where it comes from, the estimation window or None) of ``evaluate`` and
    ``plot``: ``--x0 JSON``; else estimated from the first N samples (``--x0 estimate``, ``--x0-window``, or no
    ``x1_mean``; N default ``min(T_min - 1, 10 nx)`` as `validation_report`); else the model's ``x1_mean``."""
    from ..workflow._initial_state import default_window, estimate_initial_state

    x0 = given_x0(x0_arg, window, model.nx, data, min(data.lengths) - 1)
    if x0 is not None:
        return x0, "x0 given with --x0", None
    if x0_arg is None and window is None and model.noise.x1_mean is not None:
        return np.tile(model.noise.x1_mean, (len(data), 1)), "x0 = the model's x1_mean", None
    window = default_window(model, min(data.lengths) - 1, data.y) if window is None else window
    try:
        x0 = estimate_initial_state(model, data, theta_vec, window=window)
    except CeemError as exc:
        raise UsageError(f"estimating x0 from the first {window} samples failed ({exc}); give --x0 or another "
                         f"--x0-window") from None
    rows = "; ".join(" ".join(f"{v:.6g}" for v in x) for x in x0[:5]) + (" ..." if len(x0) > 5 else "")
    return x0, f"x0 estimated from the first {window} samples of each trajectory (--x0-window): {rows}", window


def fit_outcome(saved, theta):
    """``theta`` with the status recorded in the model file ``saved`` (the fit's ``theta``, ``status`` and no states
    ``x``), for [`parameter_uncertainty`][ceem_casadi.parameter_uncertainty], which warns when the fit did not
    converge; ``theta`` itself without a recorded status."""
    meta = saved.meta.get("metadata") if saved is not None and isinstance(saved.meta, dict) else None
    status = meta.get("status") if isinstance(meta, dict) else None
    return SimpleNamespace(theta=theta, status=status, x=None) if isinstance(status, str) else theta


def cmd_evaluate(args) -> int:
    from ..workflow.assessment._metrics import validation_report

    ks = numbers(args.k, "--k", "comma-separated integers >= 1", kind=int, ok=lambda v: v >= 1) if args.k else []
    at_least(args.skip, 0, "--skip", " (leading samples left out)")
    if args.json:
        writable(args.json, "--json")
    model, theta, saved = model_from_args(args)
    data, _ = data_from_args(args, model)
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
            from ..workflow.assessment._uncertainty import parameter_uncertainty
            from ..workflow.assessment._uncertainty_options import UncertaintyOptions

            if not hasattr(model.params, "validate"):
                raise UsageError("--uncertainty needs the model source (the file was loaded without it)")
            unc = parameter_uncertainty(model, data, fit_outcome(saved, theta),
                                        options=UncertaintyOptions(hessian=args.uncertainty))
        report = validation_report(model, data, theta_vec, x0=x0, k=ks, skip=skip, uncertainty=unc)
    except CeemError as exc:
        raise UsageError(str(exc)) from None
    print(report.to_dataframe().to_string(float_format=lambda v: f"{v:.6g}"))
    if unc is not None:
        u = report.to_dict()["parameters"]
        print(f"parameters (estimate ± standard error, {u['hessian']} Hessian):")
        print("\n".join(f"  {n} = {e:.6g} ± {s:.3g}" for n, e, s in zip(u["names"], u["estimate"], u["std_error"])))
        for w in u.get("warnings", []):
            print(f"  warning: {w}")
    extras = assess(args, model, data, theta_vec, x0, skip, ks, unc)
    if args.json:
        atomic_write_text(args.json, json.dumps({**report.to_dict(), **extras}, indent=2))
    return 0


def write_trajectories(path, dt, trajectories) -> None:
    """CSV of columns ``trajectory, t`` and ``<name><j>`` of every (T, n) array of each dict of ``trajectories``."""
    import pandas as pd

    frames = [pd.DataFrame({"trajectory": b, "t": np.arange(len(next(iter(arrays.values())))) * (dt or 1.0),
                            **{f"{name}{j}": a[:, j] for name, a in arrays.items() for j in range(a.shape[1])}})
              for b, arrays in enumerate(trajectories)]
    with atomic_path(path) as tmp:
        pd.concat(frames).to_csv(tmp, index=False)


def cmd_simulate(args) -> int:
    import ceem_casadi as cc

    at_least(args.horizon, 2, "--horizon", " (samples per trajectory)")
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
    write_trajectories(args.out, model.dt, [{"y": y, "u": data.inputs(b), "x": x} for b, (y, x) in
                                            enumerate(zip(data.y, xs))])
    print(f"wrote {args.out}: {len(xs)} trajectories of {horizon} samples")
    return 0


def cmd_smooth(args) -> int:
    from ..smoothing._initial_states import eks_states

    writable(args.out, "--out")
    model, theta, _ = model_from_args(args)
    data, _ = data_from_args(args, model)
    theta_vec = model.theta_vector(theta)
    xs = eks_states(model, theta_vec, data)
    if args.method == "ce":
        from ..smoothing._smoother import Smoother

        res = Smoother(model).solve(theta_vec, data, xs)
        xs = [r.x for r in res]
    write_trajectories(args.out, model.dt, [{"x": x} for x in xs])
    print(f"wrote {args.out}")
    return 0


def cmd_codegen(args) -> int:
    from ..deploy._codegen import compile_example, generate_ekf

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
    if args.compile:  # one meaning of "compile" in the library: CasADi Functions to native code
        print("codegen --compile is deprecated: use --build-example", file=sys.stderr)
    if args.build_example or args.compile:
        try:
            print(f"compiled {compile_example(gen)}")
        except RuntimeError as exc:
            raise UsageError(str(exc)) from None
    return 0


def cmd_plot(args) -> int:
    import ceem_casadi as cc

    from .. import plots
    from ..filtering import EKF
    from ..filtering._result import ekf_settings
    from ..smoothing._initial_states import eks_states

    out, ext = writable(args.out_dir, "--out-dir", directory=True), f".{args.format}"
    model, theta, saved = model_from_args(args)
    written = []
    if saved is not None and saved.history:
        written.append(plots.plot_history(saved.history, out / f"history{ext}", title=saved.source or ""))
    if args.data:
        data, _ = data_from_args(args, model)
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
        _, Sigma0, Q, R = ekf_settings(model)  # as SavedModel.predict, with or without a model file
        pred = EKF(model).run(theta_vec, data.y[b], u, x0=x0, Sigma0=Sigma0, Q=Q, R=R).y_pred
        written.append(plots.plot_prediction(data.y[b], pred, out / f"prediction{ext}", dt=model.dt,
                                             label="EKF one-step prediction"))
    if not written:
        raise UsageError("nothing to plot: give --model-file with a fit history and/or --data")
    for p in written:
        print(f"wrote {p}")
    return 0
