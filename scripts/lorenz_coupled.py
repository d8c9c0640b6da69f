"""Paper figure "CE-EM on six coupled Lorenz attractors" (section 4.1.3): eps(theta) vs epoch.

Six coupled Lorenz attractors (n = 18, y = C x + v with C (16, 18), sigma_v = 0.01), data simulated
without process noise, T = 128, B = 2, 4 and 8 trajectories, 4 seeds each (the seed draws H, C,
the initial states and the initial guess), every free parameter (sigma_k, rho_k, beta_k and the
off-diagonal blocks of H: 288 numbers) initialised within 10 % of the truth, rho_theta = 0, no
prior. CE-EM is run with ``scripts/bench_lorenz.py``'s runner (model sigma_w = 1e-3; joint-Newton
acceleration by default, ``--acceleration none`` for Algorithm 1 as in the paper; smoothing
trust region ``--rho-x``, 1e5 by default, see ``RHO_X``). The paper's
dynamics error eps(theta) = E ||f_theta(x) - f_true(x)||_2 (x ~ p(x_1), 1000 draws) is recorded
after every epoch.

Particle EM (fully adapted PF, Np = 100, FFBSi Ns = 10, SAEM: the hyperparameters of the
single-Lorenz comparison, including its model process noise sigma_w = 0.1, without which a
particle filter on deterministic dynamics collapses to one particle) runs on the same data and
initial guesses for ``--pem-epochs`` epochs on the first ``--pem-seeds`` seeds of each B in
``--pem-trajectories`` (default: 20 epochs, seed 0, B = 2).

Output (``--out DIR``): ``coupled.png`` (log-scale eps vs epoch, every run), ``coupled.json``,
``coupled.md`` (final eps per run, median per B, monotonicity).

    python -m scripts.lorenz_coupled [--trajectories 2 4 8] [--seeds 0 1 2 3] [--pem-epochs 20]
                                     [--pem-trajectories 2] [--rho-x 1e5] [--out DIR] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from models import lorenz
from scripts.baselines import ParticleEMOptions, particle_em
from scripts.bench_lorenz import make_problem, run

K = 6
PEM_PROCESS_STD = 0.1
# Smoothing trust region. The paper fixes rho_theta = 0 here and leaves rho_x open. Without it
# (rho_x = 0) the first smoothing step, which pulls the EKF states onto the wrong theta0's
# nearly deterministic dynamics (model sigma_w = 1e-3, weight 1 / sigma_w^2 = 1e6), moved the
# states of seed 1 from 0.9 to 2.9 away from the truth and the first learning step then raised
# eps from 29.6 to 38.8 (all three B). rho_x = 1e5 keeps that step near the EKF states: eps falls
# 29.6 -> 25.6 instead, and every run ends at the same fixed point as with rho_x = 0 (the trust
# region vanishes there).
RHO_X = 1e5


def monotone_report(eps: list[float], rel_tol: float = 1e-3, settle: float = 0.1) -> dict:
    """Monotonicity of eps over the epochs of one run.

    eps is not the objective: CE-EM maximises J, and the maximiser of J is not the minimiser of
    eps, so near the fixed point eps can dip below its final value and come back (e.g. 0.091 ->
    0.100). The report separates the two phases:

    * ``max_rel_increase``: largest (eps[k+1] - eps[k]) / eps[k] over the whole run;
    * ``monotone``: that largest increase is at most ``rel_tol`` (round-off at the fixed point);
    * ``monotone_descent``: eps never increases (beyond ``rel_tol``) before it first comes within
      ``settle`` (relative) of its final value, i.e. on the way down from the initial guess;
    * ``max_settling_rise``: largest rise after that point, relative to the final value.
    """
    e = np.asarray(eps, float)
    rises = (e[1:] - e[:-1]) / e[:-1] if e.size > 1 else np.zeros(0)
    near = np.flatnonzero(np.abs(e - e[-1]) <= settle * abs(e[-1]))
    k_settle = int(near[0]) if near.size else e.size - 1
    descent, tail = rises[:k_settle], e[k_settle:]
    settling = float(np.max(np.r_[0.0, (tail[1:] - tail[:-1]) / abs(e[-1])])) if tail.size > 1 else 0.0
    inc = float(np.max(np.r_[0.0, rises]))
    return {"max_rel_increase": inc, "monotone": bool(inc <= rel_tol),
            "strictly_monotone": bool(np.all(np.diff(e) <= 0)),
            "monotone_descent": bool(np.all(descent <= rel_tol)), "settle_epoch": k_settle,
            "max_settling_rise": settling}


def run_pem(B: int, seed: int, epochs: int) -> dict:
    model, data, truth, theta0 = make_problem(f"coupled{B}", seed, process_std=PEM_PROCESS_STD)
    opts = ParticleEMOptions(n_particles=100, n_smooth=10, max_iters=epochs)
    prior = model.with_noise(x1_mean=np.tile(lorenz.X1_MEAN, K), x1_std=np.tile(lorenz.X1_STD, K))
    eps, stamps, t0 = [lorenz.dynamics_error(model, theta0, truth)], [], time.perf_counter()

    def callback(rec):
        stamps.append(time.perf_counter() - t0)
        eps.append(lorenz.dynamics_error(model, rec.theta, truth))

    res = particle_em(prior, data, theta0, options=opts, seed=seed, callback=callback)
    ep = np.diff(stamps)
    return {"B": B, "seed": seed, "status": res.status, "epochs": len(res.history), "eps": eps,
            "epoch_s": float(np.median(ep)) if ep.size else float(stamps[0]), "final_eps": eps[-1]}


def plot(ceem_runs: list[dict], pem_runs: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {2: "tab:blue", 4: "tab:orange", 8: "tab:green"}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    seen = set()
    for r in ceem_runs:
        lab = f"CE-EM, B = {r['B']}" if ("c", r["B"]) not in seen else None
        seen.add(("c", r["B"]))
        ax.semilogy(range(len(r["eps"])), r["eps"], color=colors.get(r["B"], "k"), lw=1.2, label=lab)
    for r in pem_runs:
        lab = f"particle EM, B = {r['B']}" if ("p", r["B"]) not in seen else None
        seen.add(("p", r["B"]))
        ax.semilogy(range(len(r["eps"])), r["eps"], color=colors.get(r["B"], "k"), lw=1, ls="--", label=lab)
    ax.set_xlabel("EM epoch")
    ax.set_ylabel("dynamics error eps(theta) (state units / s)")
    ax.set_title("Six coupled Lorenz attractors (n = 18): eps vs epoch (truth: eps = 0)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(ceem_runs: list[dict], pem_runs: list[dict]) -> str:
    lines = ["| B | seeds | CE-EM final eps per seed | median | epochs | monotone descent to within 10 % of "
             "the final eps | largest rise after it (of final eps) | monotone to 0.1 % every epoch (max rel. increase) | "
             "particle EM final eps (epochs) |", "|---|---|---|---|---|---|---|---|---|"]
    for B in sorted({r["B"] for r in ceem_runs}):
        rs = [r for r in ceem_runs if r["B"] == B]
        ps = [r for r in pem_runs if r["B"] == B]
        fin = [r["eps"][-1] for r in rs]
        mono = sum(r["monotone"]["monotone"] for r in rs)
        inc = max(r["monotone"]["max_rel_increase"] for r in rs)
        desc = sum(r["monotone"]["monotone_descent"] for r in rs)
        rise = max(r["monotone"]["max_settling_rise"] for r in rs)
        pem = ", ".join(f"{r['final_eps']:.2f} ({r['epochs']})" for r in ps) or "-"
        lines.append(f"| {B} | {len(rs)} | {', '.join(f'{e:.3f}' for e in fin)} | {np.median(fin):.3f} | "
                     f"{', '.join(str(len(r['eps']) - 1) for r in rs)} | {desc} of {len(rs)} | {rise:.1%} | "
                     f"{mono} of {len(rs)} ({inc:.1e}) | {pem} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description="CE-EM on six coupled Lorenz attractors: eps vs epoch")
    ap.add_argument("--trajectories", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--max-iters", type=int, default=50)
    ap.add_argument("--time-limit", type=float, default=300.0, help="per CE-EM run (s)")
    ap.add_argument("--acceleration", choices=("newton", "none", "squarem"), default="newton")
    ap.add_argument("--rho-x", type=float, default=RHO_X,
                    help="smoothing trust-region weight rho_x (the paper leaves it open for this experiment)")
    ap.add_argument("--pem-epochs", type=int, default=20, help="particle-EM epochs (0: no particle EM)")
    ap.add_argument("--pem-seeds", type=int, default=1, help="particle EM on the first N seeds of each B")
    ap.add_argument("--pem-trajectories", type=int, nargs="+", default=[2],
                    help="the B values that also get particle EM (~16 s per epoch at B = 2, more for larger B)")
    ap.add_argument("--out", default="results/lorenz_coupled")
    ap.add_argument("--smoke", action="store_true", help="B = 2, one seed, 2 CE-EM epochs, no particle EM (< 1 min)")
    args = ap.parse_args(argv)
    if args.smoke:
        # particle EM on 18 states costs minutes per epoch (its M-step over 20-100 sampled
        # trajectories): not in the smoke run
        args.trajectories, args.seeds, args.max_iters, args.pem_epochs = [2], args.seeds[:1], 2, 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ceem_runs, pem_runs = [], []
    for B in args.trajectories:
        for i, seed in enumerate(args.seeds):
            r = run(f"coupled{B}", seed=seed, max_iters=args.max_iters, time_limit=args.time_limit,
                    acceleration=args.acceleration, n_jobs=None, rho_x=args.rho_x)
            eps = [r["eps0"]] + [t["eps"] for t in r["trace"] if t["accepted"]]
            row = {"B": B, "seed": seed, "status": r["status"], "wall_s": r["wall_s"], "build_s": r["build_s"],
                   "eps": eps, "kinds": [t["kind"] for t in r["trace"] if t["accepted"]], "rho_x": args.rho_x,
                   "param_rel_err": r["param_rel_err"], "monotone": monotone_report(eps)}
            ceem_runs.append(row)
            print(f"CE-EM B={B} seed={seed}: {len(eps) - 1} epochs, eps {eps[0]:.2f} -> {eps[-1]:.4f}, "
                  f"{r['wall_s']:.1f} s, monotone descent {row['monotone']['monotone_descent']}, max rel. increase "
                  f"{row['monotone']['max_rel_increase']:.1e}", flush=True)
            if i < args.pem_seeds and args.pem_epochs > 0 and B in args.pem_trajectories:
                p = run_pem(B, seed, args.pem_epochs)
                pem_runs.append(p)
                print(f"particle EM B={B} seed={seed}: {p['epochs']} epochs, eps {p['eps'][0]:.2f} -> "
                      f"{p['final_eps']:.3f}, {p['epoch_s']:.1f} s/epoch", flush=True)
    medians = {B: float(np.median([r["eps"][-1] for r in ceem_runs if r["B"] == B])) for B in args.trajectories}
    result = {"ceem": ceem_runs, "particle_em": pem_runs, "median_final_eps": medians,
              "acceleration": args.acceleration, "wall_s": time.perf_counter() - t0}
    plot(ceem_runs, pem_runs, out / "coupled.png")
    (out / "coupled.json").write_text(json.dumps(result, indent=1))
    (out / "coupled.md").write_text(markdown(ceem_runs, pem_runs))
    print(markdown(ceem_runs, pem_runs))
    print(f"median final eps by B: {medians}; total {result['wall_s']:.1f} s")
    if args.smoke:
        assert all(np.all(np.isfinite(r["eps"])) for r in ceem_runs + pem_runs)
        assert all((out / f).exists() for f in ("coupled.png", "coupled.json", "coupled.md"))
    return result


if __name__ == "__main__":
    main()
