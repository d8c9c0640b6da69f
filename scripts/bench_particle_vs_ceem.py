"""CE-EM vs particle EM on the paper's single-Lorenz comparison (section 4.1.2), plus EKF timing.

Setting (per seed): single Lorenz (sigma, rho, beta) = (10, 28, 8/3), RK4, dt = 0.04 s; four
trajectories of T = 128 simulated with process noise sigma_w = 0.1 and measurement noise
sigma_v = 0.5 from x1, x2 ~ N(-6, 2.5^2), x3 ~ N(24, 2.5^2); initial parameters within 10 % of
the truth. Both methods get the same data and the same initial parameters:

* CE-EM: ``ceem_casadi.ceem`` (Algorithm 1, no acceleration) with the model's
  process_std = 0.1, measurement_std = 0.5;
* particle EM: ``scripts.baselines.particle_em`` (fully adapted PF, Np = 100,
  FFBSi with Ns = 10, SAEM M-step), the initial-state prior of the data generator.

Reported: median wall time per epoch of each method (epochs after the first: time between
successive callbacks, so everything an epoch costs is counted, one-off builds are not), their
ratio (the paper reports particle EM 47x slower per epoch), final parameters, max relative
parameter error and the paper's dynamics error eps. Also the EKF cost per step on a 500-step
trajectory of a 10-state model (Lorenz-96, F = 8, RK4, dt = 0.05 s, every other state observed),
with the Python-loop and the CasADi-mapaccum engines of ``EKF.run``.

    python -m scripts.bench_particle_vs_ceem [--seeds 0 1 ... 9] [--ceem-epochs 20]
        [--pem-epochs 50] [--pem-memory 5] [--json PATH] [--out DIR] [--smoke]

Timings on a shared machine are noisy; the ratio is measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import casadi as ca
import numpy as np

import ceem_casadi as cc
from ceem_casadi.filtering import EKF
from models import lorenz
from scripts.baselines import ParticleEMOptions, particle_em

SIGMA_W, SIGMA_V, BATCH, T = 0.1, 0.5, 4, 128
NAMES = ("sigma", "rho", "beta")
X1_PRIOR = dict(x1_mean=(-6.0, -6.0, 24.0), x1_std=(2.5, 2.5, 2.5))  # particle EM's prior of x[1]


def make_problem(seed: int):
    """(model, data, theta0) of one seed: same data and initial guess for both methods."""
    model = lorenz.single_lorenz(process_std=SIGMA_W, measurement_std=SIGMA_V)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(BATCH, 1, seed), T,
                          process_std=SIGMA_W, measurement_std=SIGMA_V, seed=seed)
    return model, data, lorenz.perturbed(lorenz.TRUE, 0.1, seed)


def _errors(model, theta) -> dict:
    rel = {k: abs(float(theta[k]) - lorenz.TRUE[k]) / lorenz.TRUE[k] for k in NAMES}
    return {"theta": {k: float(theta[k]) for k in NAMES}, "rel_err": rel, "max_rel_err": max(rel.values()),
            "eps": lorenz.dynamics_error(model, theta, lorenz.TRUE)}


class _Clock:
    """Wall time between successive callbacks (epoch times) and the parameter path."""

    def __init__(self):
        self.stamps, self.thetas = [time.perf_counter()], []

    def __call__(self, rec):
        self.stamps.append(time.perf_counter())
        self.thetas.append({k: float(rec.theta[k]) for k in NAMES})
        return None

    @property
    def epoch_s(self) -> list[float]:
        return np.diff(self.stamps[1:]).tolist()  # epochs 2..n (the first includes set-up)


def run_ceem(model, data, theta0, epochs: int, acceleration: str = "none") -> dict:
    clock = _Clock()
    t0 = time.perf_counter()
    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=epochs, tol=0.0, acceleration=acceleration),
                  callback=clock)
    wall = time.perf_counter() - t0
    return {"status": res.status, "epochs": len(clock.thetas), "wall_s": wall, "build_s": res.build_s,
            "epoch_s": clock.epoch_s, "median_epoch_s": float(np.median(clock.epoch_s)) if clock.epoch_s else
            float("nan"), "path": clock.thetas, **_errors(model, res.theta)}


def run_pem(model, data, theta0, epochs: int, seed: int, memory: int = 5) -> dict:
    clock = _Clock()
    opts = ParticleEMOptions(n_particles=100, n_smooth=10, max_iters=epochs, memory=memory)
    t0 = time.perf_counter()
    res = particle_em(model.with_noise(**X1_PRIOR), data, theta0, options=opts, seed=seed, callback=clock)
    wall = time.perf_counter() - t0
    return {"status": res.status, "epochs": len(res.history), "wall_s": wall, "build_s": res.build_s,
            "epoch_s": clock.epoch_s, "median_epoch_s": float(np.median(clock.epoch_s)) if clock.epoch_s else
            float("nan"), "e_step_s": float(np.median([r.e_step_s for r in res.history])),
            "m_step_s": float(np.median([r.m_step_s for r in res.history])),
            "loglik": [r.loglik for r in res.history], "path": clock.thetas, **_errors(model, res.theta)}


def lorenz96(nx: int = 10, forcing: float = 8.0, dt: float = 0.05):
    """Lorenz-96 with ``nx`` states, every other state observed (ny = nx // 2)."""
    params = cc.Parameters(cc.Param("F", forcing))

    def rhs(x, u, p):
        return ca.vertcat(*[(x[(i + 1) % nx] - x[i - 2]) * x[i - 1] - x[i] + p.F for i in range(nx)])

    return cc.StateSpaceModel.from_ode(rhs, lambda x, u, p: x[::2], nx=nx, dt=dt, params=params,
                                       process_std=0.1, measurement_std=0.5, name="lorenz96")


def time_ekf(steps: int = 500, repeats: int = 5, seed: int = 0) -> dict:
    """EKF microseconds per step on a 10-state Lorenz-96 trajectory: filter only and filter + RTS,
    for the Python-loop engine and the CasADi ``mapaccum`` engine (median of ``repeats`` runs;
    the CasADi engine's one-off build for this length is ``casadi_build_s``)."""
    model = lorenz96()
    rng = np.random.default_rng(seed)
    x0 = 8.0 + rng.standard_normal(model.nx)
    data, _ = cc.simulate(model, {"F": 8.0}, x0[None], steps, process_std=0.1, measurement_std=0.5, seed=seed)
    ekf = EKF(model)
    pv = np.array([8.0])
    out = {"model": "lorenz96", "nx": model.nx, "ny": model.ny, "steps": steps}
    lls = []
    for engine in ("python", "casadi"):
        suffix = "" if engine == "python" else "_casadi"
        if engine == "casadi":
            t0 = time.perf_counter()
            ekf.run(pv, data.y[0], None, x0=x0, Sigma0=1.0, Q=0.01, R=0.25, engine=engine)
            out["casadi_build_s"] = time.perf_counter() - t0
        for smooth in (False, True):
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                res = ekf.run(pv, data.y[0], None, x0=x0, Sigma0=1.0, Q=0.01, R=0.25, smooth=smooth, engine=engine)
                times.append(time.perf_counter() - t0)
            lls.append(res.loglik)
            key = "us_per_step_smooth" if smooth else "us_per_step"
            out[key + suffix] = 1e6 * float(np.median(times)) / steps
    assert np.all(np.isfinite(lls)) and np.ptp(lls) < 1e-8 * abs(lls[0]), lls
    return out


def summarise(rows: list[dict]) -> dict:
    out = {}
    for method in ("ceem", "pem"):
        ep = np.concatenate([r[method]["epoch_s"] for r in rows]) if rows else np.zeros(0)
        est = np.array([[r[method]["theta"][k] for k in NAMES] for r in rows])
        out[method] = {
            "median_epoch_s": float(np.median(ep)) if ep.size else float("nan"),
            "mean_theta": dict(zip(NAMES, est.mean(0).tolist())),
            "se_theta": dict(zip(NAMES, (est.std(0, ddof=1) / np.sqrt(len(rows))).tolist()
                                 if len(rows) > 1 else [float("nan")] * 3)),
            "median_max_rel_err": float(np.median([r[method]["max_rel_err"] for r in rows])),
            "median_eps": float(np.median([r[method]["eps"] for r in rows])),
        }
    out["epoch_time_ratio_pem_over_ceem"] = out["pem"]["median_epoch_s"] / out["ceem"]["median_epoch_s"]
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, k in zip(axes, NAMES):
        for i, r in enumerate(rows):
            for method, color, label in (("ceem", "tab:blue", "CE-EM"), ("pem", "tab:orange", "particle EM")):
                vals = [r["theta0"][k]] + [th[k] for th in r[method]["path"]]
                ax.plot(range(len(vals)), vals, color=color, alpha=0.6, lw=1, label=label if i == 0 else None)
        ax.axhline(lorenz.TRUE[k], color="k", ls="--", lw=1, label="truth")
        ax.set_xlabel("EM epoch")
        ax.set_ylabel(f"{k} (-)")
        ax.set_title(k)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="CE-EM vs particle EM on single Lorenz (paper section 4.1.2)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--ceem-epochs", type=int, default=20)
    ap.add_argument("--pem-epochs", type=int, default=50)
    ap.add_argument("--pem-memory", type=int, default=5, help="SAEM window (iterations of samples in the M-step)")
    ap.add_argument("--ekf-steps", type=int, default=500)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument("--out", default="results/bench_particle_vs_ceem", help="output directory (JSON, PNG)")
    ap.add_argument("--smoke", action="store_true", help="1 seed, 2 epochs each (< 1 min)")
    args = ap.parse_args(argv)
    seeds = args.seeds[:1] if args.smoke else args.seeds
    n_ceem, n_pem = (2, 2) if args.smoke else (args.ceem_epochs, args.pem_epochs)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    rows = []
    for seed in seeds:
        model, data, theta0 = make_problem(seed)
        row = {"seed": seed, "theta0": {k: float(theta0[k]) for k in NAMES},
               "ceem": run_ceem(model, data, theta0, n_ceem), "pem": run_pem(model, data, theta0, n_pem, seed, args.pem_memory)}
        rows.append(row)
        print(f"seed {seed}: CE-EM {row['ceem']['median_epoch_s'] * 1e3:7.1f} ms/epoch, err "
              f"{row['ceem']['max_rel_err']:.4f} | particle EM {row['pem']['median_epoch_s'] * 1e3:7.1f} ms/epoch, "
              f"err {row['pem']['max_rel_err']:.4f}", flush=True)
    summary = summarise(rows)
    ekf = time_ekf(steps=args.ekf_steps)
    result = {"config": {"sigma_w": SIGMA_W, "sigma_v": SIGMA_V, "batch": BATCH, "T": T, "seeds": seeds,
                         "ceem_epochs": n_ceem, "pem_epochs": n_pem, "n_particles": 100, "n_smooth": 10,
                         "pem_memory": args.pem_memory},
              "summary": summary, "ekf": ekf, "runs": rows}

    print(f"\n{'method':<12} {'epochs':>6} {'ms/epoch':>9} {'sigma':>15} {'rho':>15} {'beta':>14} "
          f"{'max rel err':>11} {'eps':>7}")
    for method, label, n in (("ceem", "CE-EM", n_ceem), ("pem", "particle EM", n_pem)):
        s = summary[method]
        cells = " ".join(f"{s['mean_theta'][k]:8.3f}({s['se_theta'][k]:.3f})" for k in NAMES)
        print(f"{label:<12} {n:>6} {s['median_epoch_s'] * 1e3:9.1f} {cells} {s['median_max_rel_err']:11.4f} "
              f"{s['median_eps']:7.3f}")
    print(f"truth{'':>28} {lorenz.TRUE['sigma']:8.3f} {lorenz.TRUE['rho']:14.3f} {lorenz.TRUE['beta']:14.3f}")
    print(f"particle EM epoch = E-step (PF + FFBSi, 4 trajectories) "
          f"{np.median([r['pem']['e_step_s'] for r in rows]) * 1e3:.1f} ms + M-step (Learner on "
          f"{args.pem_memory} x 10 x 4 sampled trajectories) {np.median([r['pem']['m_step_s'] for r in rows]) * 1e3:.1f} ms")
    print(f"per-epoch time ratio particle EM / CE-EM: {summary['epoch_time_ratio_pem_over_ceem']:.1f}x "
          f"(paper: 47x)")
    print(f"EKF on {ekf['nx']}-state {ekf['model']}, {ekf['steps']} steps: Python loop {ekf['us_per_step']:.1f} "
          f"us/step (with RTS {ekf['us_per_step_smooth']:.1f}); CasADi mapaccum {ekf['us_per_step_casadi']:.1f} "
          f"us/step (with RTS {ekf['us_per_step_smooth_casadi']:.1f}; build {ekf['casadi_build_s']:.2f} s)")

    text = json.dumps(result, indent=1)
    (out_dir / "results.json").write_text(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text)
    plot(rows, out_dir / "estimates_vs_epoch.png")
    if args.smoke:
        assert (out_dir / "results.json").exists() and (out_dir / "estimates_vs_epoch.png").exists()
        vals = [summary[m]["median_epoch_s"] for m in ("ceem", "pem")] + [ekf["us_per_step"]]
        vals += [rows[0][m]["max_rel_err"] for m in ("ceem", "pem")]
        assert np.all(np.isfinite(vals)), vals
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
