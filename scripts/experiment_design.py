"""Does optimal experiment design pay? Designed input vs PRBS vs random-phase multisine, Monte Carlo.

For two models with an input, an A-optimal input (sum of relative variances; ``--criterion D``:
log det; `ceem_casadi.design_input`, designed once at a GUESS 10 % off the truth,
never at the truth) is compared with (b) a PRBS and
(c) a random-phase multisine, all within the same amplitude bounds and of the same length, from
the same known initial state:

* **Cascaded Tanks** (`models.cascaded_tanks`, Torricelli structure, 4 s samples, pump 0-10 V):
  truth = a physically plausible parameter set in the range of the real benchmark's fit; free
  parameters kp, a1, a2, u0, c0 (the overflow and linear-outflow terms fixed), sensor noise 0.05 V.
* **Forced Duffing oscillator** ``x1' = x2, x2' = -k x1 - c x2 - a x1^3 + b u``, ``y = x1 + v``
  (RK4, 0.1 s samples), input in [-1, 1], all four parameters free, noise 0.05.

Per seed (``--seeds``, default 50) and input: the noise-free record plus Gaussian measurement
noise of the model's ``measurement_std`` is fitted by output error (`cc.refine_output_error`,
x0 known: held by equal bounds; no process noise in the simulated records, so output error is the
right estimator) from a start 10 % off the truth; the 95 % interval of each free parameter is
``estimate +- 1.96 sqrt(diag(I^-1))`` with ``I`` the Fisher information at the fit
(`ceem_casadi.workflow.fisher_information`). The PRBS and the multisine are drawn anew
per seed (from the seed); the designed input is one sequence. Reported per model and input: the
geometric mean of the interval widths (over parameters and seeds), the coverage of the truth (over
parameters and seeds), failed fits, and the ratio of the better baseline's width to the designed
one (target >= 2).

Run: ``python -m scripts.experiment_design [--seeds 50] [--json out.json] [--smoke]``.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import casadi as ca
import numpy as np

import ceem_casadi as cc
from ceem_casadi.objective._identifiability import entry_names
from ceem_casadi.workflow import DesignOptions, design_input, fisher_information
from models.cascaded_tanks import cascaded_tanks, tanks_observe, tanks_rhs

logger = logging.getLogger(__name__)
Z95 = 1.959963984540054


@dataclass
class Case:
    name: str
    model: cc.StateSpaceModel
    truth: dict
    x0: np.ndarray
    horizon: int
    u_bounds: tuple
    hold: int          # samples per designed input value
    prbs_clock: int    # samples per PRBS bit
    band: float        # multisine band, fraction of the Nyquist frequency


def tanks_case(horizon: int) -> Case:
    truth = {"kp": 0.05, "a1": 0.05, "a2": 0.045, "b1": 0.0, "b2": 0.0, "kov": 0.5, "h1max": 10.0,
             "h2max": 10.0, "c0": 0.3, "c1": 1.0, "u0": 0.5}
    model = cascaded_tanks(truth, measurement_std=0.05, free_b=False)
    fixed = {"kov", "h1max", "h2max"}
    params = cc.Parameters(*[cc.Param(p.name, p.array("value"), lower=p.array("lower"), upper=p.array("upper"),
                                      free=bool(p.array("free")) and p.name not in fixed) for p in model.params])
    model = cc.StateSpaceModel.from_ode(tanks_rhs, tanks_observe, nx=2, nu=1, dt=4.0,
                                        params=params, substeps=4, process_std=0.01, measurement_std=0.05,
                                        name="cascaded_tanks")
    return Case("cascaded_tanks", model, model.params.validate(truth), np.array([1.0, 1.0]), horizon, (0.0, 10.0),
                hold=5, prbs_clock=10, band=0.1)


def duffing_case(horizon: int) -> Case:
    params = cc.Parameters(cc.Param("k", 1.0), cc.Param("c", 0.2), cc.Param("a", 0.5), cc.Param("b", 1.0))

    def rhs(x, u, p):
        return ca.vertcat(x[1], -p.k * x[0] - p.c * x[1] - p.a * x[0] ** 3 + p.b * u[0])

    model = cc.StateSpaceModel.from_ode(rhs, lambda x, u, p: x[0], nx=2, nu=1, dt=0.1, params=params,
                                        substeps=2, process_std=0.01, measurement_std=0.05, name="duffing")
    return Case("duffing", model, {"k": 1.0, "c": 0.2, "a": 0.5, "b": 1.0}, np.zeros(2), horizon, (-1.0, 1.0),
                hold=2, prbs_clock=5, band=0.2)


def prbs(T: int, clock: int, bounds, rng) -> np.ndarray:
    """(T, 1) random binary sequence at the bounds, one bit per ``clock`` samples (seeded)."""
    bits = rng.integers(0, 2, -(-T // clock))
    return np.where(np.repeat(bits, clock)[:T] == 1, bounds[1], bounds[0])[:, None].astype(float)


def multisine(T: int, band: float, bounds, rng) -> np.ndarray:
    """(T, 1) random-phase multisine, equal amplitudes on the DFT lines up to ``band`` x Nyquist, scaled to fill
    ``bounds`` exactly."""
    k = np.arange(1, max(2, int(band * T / 2)) + 1)
    t = np.arange(T)
    s = np.sum(np.cos(2 * np.pi * np.outer(t, k) / T + rng.uniform(0, 2 * np.pi, k.size)), axis=1)
    s = (s - s.min()) / (s.max() - s.min())
    return (bounds[0] + (bounds[1] - bounds[0]) * s)[:, None]


def guess(case: Case, rng, rel: float = 0.1) -> dict:
    """The truth with every free entry multiplied by ``1 + rel * N(0, 1)``, clipped to the bounds."""
    p = case.model.params
    vec = p.to_vector(case.truth)
    free = p.free_index
    vec[free] *= 1 + rel * rng.standard_normal(free.size)
    return p.from_vector(np.clip(vec, p.lower, p.upper))


def std_errors(info: np.ndarray) -> np.ndarray:
    """(n,) Cramer-Rao standard errors ``sqrt(diag(I^-1))``; ``inf`` where ``I`` is singular or not
    positive definite (a pseudo-inverse would silently drop the undetermined directions and report them
    as narrow)."""
    try:
        var = np.diag(np.linalg.inv(info))
    except np.linalg.LinAlgError:
        return np.full(info.shape[0], np.inf)
    return np.where(var > 0, np.sqrt(np.abs(var)), np.inf)


def fit_one(case: Case, u: np.ndarray, rng) -> dict:
    """Simulate a noisy record of ``u``, fit it by output error, return widths and coverage."""
    m = case.model
    y = cc.simulate_output(m, case.truth, u, case.x0)
    y = y + m.noise.measurement_std * rng.standard_normal(y.shape)
    data = cc.Trajectories([y], [u], dt=m.dt)
    start = guess(case, rng)
    rf = cc.refine_output_error(m, data, start, x0=case.x0, options=cc.OutputErrorOptions(
        max_iters=200, x_lower=case.x0, x_upper=case.x0, use_prior=False))
    free = m.params.free_index
    est = m.theta_vector(rf.theta)[free]
    truth = m.theta_vector(case.truth)[free]
    info = fisher_information(m, rf.theta, u, x0=case.x0)
    se = std_errors(info)
    return {"status": str(rf.status), "width": (2 * Z95 * se).tolist(),
            "covered": (np.abs(est - truth) <= Z95 * se).tolist(), "error": (est - truth).tolist()}


def summarise(fits: list, names: list) -> dict:
    ok = [f for f in fits if f["status"] == "converged"]
    W = np.array([f["width"] for f in ok]) if ok else np.full((0, len(names)), np.nan)
    C = np.array([f["covered"] for f in ok], bool) if ok else np.zeros((0, len(names)), bool)
    return {"fits": len(fits), "failed": len(fits) - len(ok),
            "geomean_width": float(np.exp(np.mean(np.log(W)))) if ok else float("nan"),
            "coverage": float(C.mean()) if ok else float("nan"),
            "width_per_parameter": dict(zip(names, np.exp(np.mean(np.log(W), axis=0)).tolist())) if ok else {},
            "coverage_per_parameter": dict(zip(names, C.mean(axis=0).tolist())) if ok else {}}


def run_case(case: Case, seeds: int, starts: int, design_iters: int = 300, criterion: str = "A") -> dict:
    m = case.model
    names = entry_names(m.params, m.params.free_index)
    t0 = time.perf_counter()
    design_at = guess(case, np.random.default_rng(12345))
    # starts: one multisine, one PRBS (what a user would try first) and uniform random sequences, all seeded
    rng = np.random.default_rng(777)
    lo, hi = case.u_bounds
    given = [multisine(case.horizon, case.band, case.u_bounds, rng),
             prbs(case.horizon, case.prbs_clock, case.u_bounds, rng)]
    given += [lo + (hi - lo) * np.repeat(rng.random(-(-case.horizon // case.hold)), case.hold)[:case.horizon, None]
              for _ in range(max(0, starts - 2))]
    des = design_input(m, design_at, case.horizon, u_bounds=case.u_bounds, x0=case.x0, criterion=criterion,
                       starts=np.stack(given[:max(starts, 1)]),
                       options=DesignOptions(hold=case.hold, max_iters=design_iters))
    t_design = time.perf_counter() - t0
    logger.info("%s: designed in %.1f s: %s", case.name, t_design, des)
    results = {"designed": [], "prbs": [], "multisine": []}
    predicted = {k: [] for k in results}
    logdet = {k: [] for k in results}
    for s in range(seeds):
        rng = np.random.default_rng(1000 + s)
        inputs = {"designed": des.u, "prbs": prbs(case.horizon, case.prbs_clock, case.u_bounds, rng),
                  "multisine": multisine(case.horizon, case.band, case.u_bounds, rng)}
        for kind, u in inputs.items():
            results[kind].append(fit_one(case, u, np.random.default_rng(10_000 * (s + 1) + len(kind))))
            if s < 10 or kind != "designed":
                info = fisher_information(m, case.truth, u, x0=case.x0)
                predicted[kind].append(float(np.exp(np.mean(np.log(2 * Z95 * std_errors(info))))))
                logdet[kind].append(float(np.linalg.slogdet(info)[1]))
    summary = {k: summarise(v, names) for k, v in results.items()}
    for k in summary:
        summary[k]["predicted_geomean_width_at_truth"] = float(np.exp(np.mean(np.log(predicted[k]))))
        summary[k]["predicted_width_at_truth_per_seed"] = {"min": min(predicted[k]),
                                                           "median": float(np.median(predicted[k])),
                                                           "max": max(predicted[k])}
        summary[k]["log_det_information_at_truth"] = {"min": min(logdet[k]), "median": float(np.median(logdet[k])),
                                                      "max": max(logdet[k])}
    best_base = min(summary["prbs"]["geomean_width"], summary["multisine"]["geomean_width"])
    return {"model": case.name, "free": names, "truth": {k: float(np.asarray(v)) for k, v in case.truth.items()},
            "design_at": {k: float(np.asarray(v)) for k, v in design_at.items()},
            "horizon": case.horizon, "dt": m.dt, "u_bounds": list(case.u_bounds), "hold": case.hold,
            "prbs_clock": case.prbs_clock, "multisine_band": case.band, "seeds": seeds,
            "design": {"criterion": criterion, "value": des.value, "status": str(des.status), "seconds": t_design, "starts": des.starts,
                       "u": des.u.ravel().tolist()},
            "summary": summary, "ratio_best_baseline_to_designed": best_base / summary["designed"]["geomean_width"],
            "seconds": time.perf_counter() - t0}


def plot(path, cases_out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(len(cases_out), 1, figsize=(9, 3 * len(cases_out)))
    for a, (case, res) in zip(np.atleast_1d(ax), cases_out):
        t = np.arange(case.horizon) * case.model.dt
        rng = np.random.default_rng(1000)
        a.step(t, prbs(case.horizon, case.prbs_clock, case.u_bounds, rng), where="post", color="0.7", lw=1,
               label="PRBS (seed 0)")
        a.plot(t, multisine(case.horizon, case.band, case.u_bounds, rng), color="tab:orange", lw=1,
               label="multisine (seed 0)")
        a.step(t, res["design"]["u"], where="post", color="k", lw=1.5, label=f"{res['design']['criterion']}-optimal")
        s = res["summary"]
        a.set_title(f"{case.name}: 95 % interval width (geo. mean) designed {s['designed']['geomean_width']:.3g}, "
                    f"PRBS {s['prbs']['geomean_width']:.3g}, multisine {s['multisine']['geomean_width']:.3g}",
                    fontsize=9)
        a.set_ylabel("u")
        a.legend(fontsize=7, loc="upper right")
    np.atleast_1d(ax)[-1].set_xlabel("time [s]")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--models", nargs="+", choices=("cascaded_tanks", "duffing"), default=["cascaded_tanks", "duffing"])
    ap.add_argument("--starts", type=int, default=4, help="starts of the design NLP: a multisine, a PRBS, then uniform random sequences")
    ap.add_argument("--criterion", choices=("A", "D"), default="A",
                    help="design criterion (default A: the sum of relative variances, the closest to the reported "
                         "geometric mean of interval widths; D: log det)")
    ap.add_argument("--design-iters", type=int, default=300, help="IPOPT iterations per design start")
    ap.add_argument("--json", help="write the results as JSON to this file")
    ap.add_argument("--out", default="results/experiment_design", help="folder of the figure")
    ap.add_argument("--smoke", action="store_true", help="3 seeds, 100 samples, 2 starts of 50 iterations")
    args = ap.parse_args(argv)
    if args.smoke:
        args.seeds, args.starts, args.design_iters = min(args.seeds, 3), 2, 50
    horizons = {"cascaded_tanks": 100 if args.smoke else 250, "duffing": 100 if args.smoke else 300}
    makers = {"cascaded_tanks": tanks_case, "duffing": duffing_case}
    cases_out, out = [], {"args": vars(args), "results": []}
    for name in args.models:
        case = makers[name](horizons[name])
        res = run_case(case, args.seeds, args.starts, args.design_iters, args.criterion)
        cases_out.append((case, res))
        out["results"].append(res)
        s = res["summary"]
        print(f"{name}: geometric-mean 95 % width designed {s['designed']['geomean_width']:.4g} "
              f"(coverage {s['designed']['coverage']:.3f}), PRBS {s['prbs']['geomean_width']:.4g} "
              f"({s['prbs']['coverage']:.3f}), multisine {s['multisine']['geomean_width']:.4g} "
              f"({s['multisine']['coverage']:.3f}); better baseline / designed = "
              f"{res['ratio_best_baseline_to_designed']:.2f}; {res['seconds']:.0f} s", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    plot(Path(args.out) / "experiment_design.png", cases_out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    main()
