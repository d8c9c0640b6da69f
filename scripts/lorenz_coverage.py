"""Coverage of the 95 % parameter intervals of CE-EM on the single Lorenz attractor.

Per seed: B trajectories of T steps from the initial-state distribution, process and measurement
noise sigma_w = sigma_v = 0.01 (``--process-std`` changes sigma_w) in the simulation and in the model (with the generator's x_1
prior), a CE-EM fit from within 5 % of the truth (``acceleration="newton"``), then
``cc.parameter_uncertainty(model, data, result)`` with the exact Hessian (the observed information) and, for
comparison, the Gauss-Newton one. Reported per parameter: the fraction of seeds whose interval
contains the truth (with its binomial 95 % Wilson interval), and the mean square of the
standardised errors z = (estimate - truth) / standard error (1 when the standard errors are right;
4 for intervals 2x too narrow, 0.25 for 2x too wide).

Output: ``--out DIR/coverage.json`` (every seed), ``--figure`` (default
``docs/figures/lorenz_coverage.png``): coverage per parameter and the distribution of z.

    python -m scripts.lorenz_coverage [--seeds 200] [--batch 4] [--horizon 128] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import ceem_casadi as cc
from models import lorenz

NAMES = ("sigma", "rho", "beta")
NOISE = 0.01


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k / n."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    d = 1 + z ** 2 / n
    c = (p + z ** 2 / (2 * n)) / d
    h = z * np.sqrt(p * (1 - p) / n + z ** 2 / (4 * n ** 2)) / d
    return (float(c - h), float(c + h))


def run(seeds, batch: int, horizon: int, process_std: float = NOISE) -> list[dict]:
    model = lorenz.single_lorenz(process_std=process_std, measurement_std=NOISE, x1_prior=True)
    options = cc.CEEMOptions(acceleration="newton", max_iters=100)
    smoother = cc.smoothing.Smoother(model, options.smoother)
    learner = cc.learning.Learner(model, [horizon] * batch, options.learner, smoother.stages)
    truth = model.theta_vector(lorenz.TRUE)
    runs = []
    for seed in seeds:
        rng = np.random.default_rng([seed, 18])
        data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(batch, seed=rng), horizon,
                              process_std=process_std, measurement_std=NOISE, seed=rng)
        theta0 = lorenz.perturbed(lorenz.TRUE, 0.05, seed=rng)
        t0 = time.perf_counter()
        fit = cc.ceem(model, data, theta0, options=options, smoother=smoother, learner=learner)
        t1 = time.perf_counter()
        rec = {"seed": seed, "status": fit.status, "iterations": fit.iterations, "fit_s": t1 - t0}
        if fit.success:
            for kind in ("exact", "gauss-newton"):
                u = cc.parameter_uncertainty(model, data, fit, options=cc.UncertaintyOptions(hessian=kind))
                rec[kind] = {"estimate": u.estimate.tolist(), "std_error": u.std_error.tolist(),
                             "z": ((u.estimate - truth) / u.std_error).tolist()}
            rec["uncertainty_s"] = time.perf_counter() - t1
        runs.append(rec)
    return runs


def summarise(runs: list[dict], kind: str = "exact") -> dict:
    z = np.array([r[kind]["z"] for r in runs if kind in r])
    n = z.shape[0]
    out = {"kind": kind, "n": n, "parameters": {}}
    for i, name in enumerate(NAMES):
        k = int(np.sum(np.abs(z[:, i]) <= 1.959964))
        out["parameters"][name] = {"coverage": k / n, "wilson95": wilson(k, n), "mean_z2": float(np.mean(z[:, i] ** 2)),
                                   "mean_z": float(np.mean(z[:, i])),
                                   "coverage_if_2x_narrow": float(np.mean(np.abs(z[:, i]) <= 1.959964 / 2)),
                                   "coverage_if_2x_wide": float(np.mean(np.abs(z[:, i]) <= 1.959964 * 2))}
    return out


def plot(runs: list[dict], summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    z = np.array([r["exact"]["z"] for r in runs if "exact" in r])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    ax = axes[0]
    x = np.arange(len(NAMES))
    for off, kind, marker in ((-0.1, "exact", "o"), (0.1, "gauss-newton", "s")):
        s = summary[kind]["parameters"]
        cov = [s[n]["coverage"] for n in NAMES]
        lo = [s[n]["coverage"] - s[n]["wilson95"][0] for n in NAMES]
        hi = [s[n]["wilson95"][1] - s[n]["coverage"] for n in NAMES]
        ax.errorbar(x + off, cov, yerr=[lo, hi], fmt=marker, capsize=3, label=f"{kind} Hessian (Wilson 95 %)")
    ax.axhspan(0.90, 0.99, color="tab:green", alpha=0.15, label="target 90-99 %")
    ax.axhline(0.95, color="k", ls="--", lw=1)
    ax.set_xticks(x, NAMES)
    ax.set_ylim(0.6, 1.0)
    ax.set_ylabel("fraction of seeds covering the truth")
    ax.set_title(f"95 % intervals, {summary['exact']['n']} seeds")
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[1]
    grid = np.linspace(-4, 4, 200)
    ax.plot(grid, np.exp(-grid ** 2 / 2) / np.sqrt(2 * np.pi), "k--", lw=1, label="N(0, 1)")
    for i, n in enumerate(NAMES):
        ax.hist(z[:, i], bins=np.linspace(-4, 4, 25), density=True, histtype="step", lw=1.5, label=n)
    ax.set_xlabel("z = (estimate - truth) / standard error")
    ax.set_ylabel("density")
    ax.set_title("standardised errors (exact Hessian)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(summary: dict) -> str:
    lines = ["| Hessian | parameter | coverage of 95 % intervals (Wilson 95 %) | mean z^2 | mean z | "
             "coverage if 2x narrower | if 2x wider |", "|---|---|---|---|---|---|---|"]
    for kind in ("exact", "gauss-newton"):
        for n in NAMES:
            s = summary[kind]["parameters"][n]
            lo, hi = s["wilson95"]
            lines.append(f"| {kind} | {n} | {100 * s['coverage']:.1f} % ({100 * lo:.1f}-{100 * hi:.1f}) | "
                         f"{s['mean_z2']:.2f} | {s['mean_z']:+.2f} | {100 * s['coverage_if_2x_narrow']:.1f} % | "
                         f"{100 * s['coverage_if_2x_wide']:.1f} % |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description="Coverage of CE-EM's 95 % parameter intervals (single Lorenz)")
    ap.add_argument("--seeds", type=int, default=200, help="number of seeds (0, 1, ...)")
    ap.add_argument("--batch", type=int, default=4, help="trajectories per seed")
    ap.add_argument("--horizon", type=int, default=lorenz.HORIZON)
    ap.add_argument("--process-std", type=float, default=NOISE, help="sigma_w (simulation and model), default 0.01")
    ap.add_argument("--out", default="results/lorenz_coverage")
    ap.add_argument("--figure", default="docs/figures/lorenz_coverage.png")
    ap.add_argument("--smoke", action="store_true", help="3 seeds of 1 x 48 steps")
    args = ap.parse_args(argv)
    seeds, batch, horizon = (range(3), 1, 48) if args.smoke else (range(args.seeds), args.batch, args.horizon)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runs = run(seeds, batch, horizon, args.process_std)
    summary = {k: summarise(runs, k) for k in ("exact", "gauss-newton")}
    failed = [r["seed"] for r in runs if "exact" not in r]
    result = {"settings": {"seeds": len(runs), "batch": batch, "horizon": horizon, "process_std": args.process_std,
                           "measurement_std": NOISE},
              "failed_seeds": failed, "summary": summary, "wall_s": time.perf_counter() - t0, "runs": runs}
    (out / "coverage.json").write_text(json.dumps(result, indent=1))
    figure = Path(args.figure) if not args.smoke else out / "lorenz_coverage.png"
    plot(runs, summary, figure)
    print(markdown(summary))
    print(f"{len(runs)} seeds ({len(failed)} fits failed: {failed}), {result['wall_s']:.1f} s; "
          f"figure {figure}, data {out / 'coverage.json'}")
    if args.smoke:
        assert figure.exists() and summary["exact"]["n"] == 3
    return result


if __name__ == "__main__":
    main()
