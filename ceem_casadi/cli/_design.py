"""CLI subcommand ``design-input`` ([`design_input`][ceem_casadi.design_input])."""
from __future__ import annotations

import json

import numpy as np

from ..errors import CeemError
from ..runtime._atomic import atomic_path, atomic_write_text
from ._inputs import UsageError, at_least, model_from_args, numbers, states, theta_arg, writable


def cmd_design_input(args) -> int:
    from ..workflow.design._experiment_design import DesignOptions, design_input

    at_least(args.horizon, 2, "--horizon", " (samples of the experiment)")
    lo, hi = numbers(args.u_bounds, "--u-bounds", "comma-separated finite numbers", n=2)
    if lo > hi:
        raise UsageError(f"--u-bounds: expected LOWER,UPPER with LOWER <= UPPER, got {args.u_bounds!r}")
    if args.rate_bound is not None and not args.rate_bound > 0:
        raise UsageError(f"--rate-bound: expected a positive number (largest input change per value), "
                         f"got {args.rate_bound}")
    at_least(args.starts, 1, "--starts")
    out = writable(args.out, "--out")
    if out.suffix not in (".npz", ".csv"):
        raise UsageError(f"--out {args.out}: expected a .npz or .csv file name")
    try:
        options = DesignOptions(hold=args.hold, max_iters=args.max_iter)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid options: {exc}") from None
    model, theta, _ = model_from_args(args)
    theta = theta_arg(model, args.theta, "--theta", base=theta) or theta
    x0 = states(args.x0, "--x0", model.nx)
    x0 = None if x0 is None else np.asarray(x0, float).reshape(-1, model.nx)[0]
    if model.nu < 1:
        raise UsageError("the model has no input (nu = 0): there is nothing to design")
    try:
        res = design_input(model, theta, args.horizon, u_bounds=(lo, hi), rate_bounds=args.rate_bound,
                           criterion=args.criterion, x0=x0, starts=args.starts, seed=args.seed, options=options)
    except CeemError as exc:
        raise UsageError(str(exc)) from None
    if out.suffix == ".npz":
        with atomic_path(out) as tmp:
            np.savez(tmp, u=res.u, information=res.information, names=np.array(res.names), value=res.value,
                     criterion=res.criterion, x0=res.x0, dt=np.nan if model.dt is None else model.dt)
    else:
        import pandas as pd

        t = np.arange(res.u.shape[0]) * (model.dt or 1.0)
        with atomic_path(out) as tmp:
            pd.DataFrame({"t": t, **{f"u{j}": res.u[:, j] for j in range(model.nu)}}).to_csv(tmp, index=False)
    if args.json:
        atomic_write_text(args.json, json.dumps(res.to_dict(), indent=2))
    print(res.table())
    print(f"wrote {out}: {res.u.shape[0]} samples, {res.criterion}-criterion {res.value:.6g}, status {res.status}")
    return 0 if res.status == "converged" else 1


def add_design_parser(sub, add_model) -> None:
    """Add the ``design-input`` subcommand to the CLI's subparsers ``sub`` (``add_model`` adds the
    model flags as for the other commands)."""
    p = sub.add_parser("design-input", help="optimal experiment design: the input maximising the parameters' "
                                            "information (D or A criterion)",
                       description="Design the input sequence of an experiment (cc design_input): IPOPT over the "
                                   "inputs, several random starts; writes the input as .npz or .csv.")
    add_model(p)
    p.add_argument("--theta", help="parameters JSON at which to design (default: the model file's or the factory's)")
    p.add_argument("--horizon", type=int, required=True, help="samples of the experiment")
    p.add_argument("--u-bounds", required=True, help="LOWER,UPPER of every input")
    p.add_argument("--rate-bound", type=float, help="largest change between consecutive input values")
    p.add_argument("--criterion", choices=("D", "A"), default="D")
    p.add_argument("--x0", help="known initial state, JSON list of nx numbers (default x1_mean, else zeros)")
    p.add_argument("--hold", type=int, default=1, help="samples each input value is held (default 1)")
    p.add_argument("--starts", type=int, default=4, help="random starts (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-iter", type=int, default=300, help="IPOPT iterations per start (default 300)")
    p.add_argument("--out", required=True, help="file to write: .npz (u, information, names, ...) or .csv (t, u*)")
    p.add_argument("--json", help="also write the result (per-start table, information) as JSON")
    p.set_defaults(func=cmd_design_input)
