"""How often does ``cc.calibrate_noise`` choose the true process-noise level? (simulated data, known noise)

Problems (both simulated with process noise ``sigma_w`` on every state and measurement noise
``sigma_v``; the model is told a nominal process std and the grid multiplies it):

* ``pendulum``: damped pendulum ``x1' = x1 + dt x2``, ``x2' = x2 + dt (-a sin x1 - b x2 + u)``
  (dt = 0.1, a = 2, b = 0.3), angle observed (sigma_v = 0.05), angular velocity hidden, piecewise
  constant random input; B = 2 trajectories of T = 200; initial guess a = 1.5, b = 0.5.
  Nominal process std 0.1.
* ``lorenz``: single Lorenz (``models.lorenz``, RK4, dt = 0.04), x1 and x3 observed (sigma_v = 0.1),
  x2 hidden; B = 2 trajectories of T = 128 with the generator's x1 prior; initial guess 10 % off.
  Nominal process std 0.1.

For each problem, true ``sigma_w`` and seed, `ceem_casadi.calibrate_noise` runs over the
grid ``nominal * logspace(-2, 1, 13)`` (3 decades, a factor 1.78 apart) with each criterion; the
table reports, per problem / truth / criterion, how often the chosen std is within a factor 3
(and within one grid step, a factor 1.78) of the truth, and the median chosen/true ratio.

    python -m scripts.noise_calibration_study [--seeds 10] [--problems pendulum lorenz]
        [--criteria innovation holdout] [--json out.json] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import time

import casadi as ca
import numpy as np
import pandas as pd

import ceem_casadi as cc
from models import lorenz

NOMINAL = 0.1
GRID = np.logspace(-2, 1, 13)
TRUTHS = {"pendulum": (0.005, 0.02, 0.08), "lorenz": (0.01, 0.05, 0.2)}


def pendulum_problem(sigma_w: float, seed: int, T: int = 200, B: int = 2):
    """(model with the nominal process std, data, theta0) of the pendulum problem."""
    dt, sv = 0.1, 0.05
    P = cc.Parameters(cc.Param("a", 1.5, lower=0.01), cc.Param("b", 0.5, lower=0.0))

    def step(x, u, p):
        return ca.vertcat(x[0] + dt * x[1], x[1] + dt * (-p.a * ca.sin(x[0]) - p.b * x[1] + u[0]))

    model = cc.StateSpaceModel.from_discrete(step, lambda x, u, p: x[0], nx=2, nu=1, params=P,
                                             process_std=NOMINAL, measurement_std=sv)
    rng = np.random.default_rng([seed, 7])
    u = [np.repeat(rng.normal(0, 1.5, T // 10), 10)[:, None] for _ in range(B)]
    data, _ = cc.simulate(model, {"a": 2.0, "b": 0.3}, x0=rng.normal(0, 0.5, (B, 2)), horizon=T, u=u,
                          process_std=sigma_w, measurement_std=sv, seed=rng)
    return model, data, model.params.initial()


def lorenz_problem(sigma_w: float, seed: int, T: int = 128, B: int = 2):
    """(model with the nominal process std, data, theta0) of the single-Lorenz problem."""
    sv = 0.1
    rng = np.random.default_rng([seed, 11])
    model = lorenz.single_lorenz(process_std=NOMINAL, measurement_std=sv, x1_prior=True)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(B, 1, seed=rng), T,
                          process_std=sigma_w, measurement_std=sv, seed=rng)
    return model, data, lorenz.perturbed(lorenz.TRUE, 0.1, seed=rng)


PROBLEMS = {"pendulum": pendulum_problem, "lorenz": lorenz_problem}


def run(problems, criteria, seeds, grid=GRID, max_iters: int = 50, truths=TRUTHS) -> list[dict]:
    runs = []
    opts = cc.NoiseCalibrationOptions(ceem=cc.CEEMOptions(max_iters=max_iters, acceleration="newton"))
    for name in problems:
        for sigma_w in truths[name]:
            for seed in seeds:
                model, data, theta0 = PROBLEMS[name](sigma_w, seed)
                for crit in criteria:
                    t0 = time.perf_counter()
                    res = cc.calibrate_noise(model, data, theta0, grid=grid, criterion=crit, options=opts)
                    chosen = float(res.best.process_std[0])
                    runs.append({"problem": name, "sigma_w": sigma_w, "seed": seed, "criterion": crit,
                                 "chosen": chosen, "ratio": chosen / sigma_w, "seconds": time.perf_counter() - t0,
                                 "iterations": int(res.levels["iterations"].sum()),
                                 "statuses": sorted(set(res.levels["status"]))})
                    print(f"{name} sigma_w={sigma_w:g} seed={seed} {crit}: chosen {chosen:.4g} "
                          f"(ratio {chosen / sigma_w:.3g}, {runs[-1]['seconds']:.1f} s)", flush=True)
    return runs


def summarise(runs: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(runs)
    r = np.log(df["ratio"].to_numpy())
    df["within_3"] = np.abs(r) <= np.log(3) + 1e-9
    df["within_step"] = np.abs(r) <= np.log(GRID[1] / GRID[0]) + 1e-9
    g = df.groupby(["problem", "sigma_w", "criterion"], sort=False)
    return g.agg(n=("seed", "size"), within_3=("within_3", "sum"), within_1_step=("within_step", "sum"),
                 median_ratio=("ratio", "median"), min_ratio=("ratio", "min"), max_ratio=("ratio", "max"),
                 seconds=("seconds", "mean")).reset_index()


def main(argv=None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0 .. N-1 per setting")
    ap.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    ap.add_argument("--criteria", nargs="+", default=["innovation", "holdout"], choices=["innovation", "holdout"])
    ap.add_argument("--json", default=None, help="write every run and the summary to this JSON file")
    ap.add_argument("--smoke", action="store_true", help="one seed, one truth, a 4-level grid")
    args = ap.parse_args(argv)
    grid, truths = GRID, TRUTHS
    if args.smoke:
        args.seeds = 1
        truths = {k: v[1:2] for k, v in TRUTHS.items()}
        grid = GRID[::4]
    t0 = time.perf_counter()
    runs = run(args.problems, args.criteria, range(args.seeds), grid=grid, truths=truths)
    table = summarise(runs)
    print(table.to_string(index=False))
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"grid": list(NOMINAL * grid), "runs": runs, "summary": table.to_dict("records")}, fh,
                      indent=2, default=float)
    if args.smoke:
        assert len(table) == len(args.problems) * len(args.criteria) and table["n"].eq(1).all()
    return table


if __name__ == "__main__":
    main()
