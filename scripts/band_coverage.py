"""Do the 95 % simulation bands cover the truth, and does the whiteness test keep its level? Monte Carlo.

Two simulated output-error systems (no process noise: the output-error fit is the right estimator), T samples of a
seeded random-phase multisine, Gaussian measurement noise, known initial state x0 = 0:

* **linear2**: second order, ``x1+ = a1 x1 + a2 x2 + b u``, ``x2+ = x1``, ``y = x1`` (a1, a2, b = 1.5, -0.7, 0.5);
  the wrong structure is first order ``x+ = a x + b u``.
* **cubic**: ``x+ = a x - c x^3 + b u``, ``y = x`` (a, c, b = 0.8, 0.1, 0.5; the cubic term moves the output by
  up to ~40 %); the wrong structure drops it (``c = 0``).

Per seed: simulate, fit the free parameters by output error (`cc.refine_output_error` from a start 10 % off the
truth, x0 held at its known value by equal bounds; a fit whose mean squared error is above twice the noise variance
is counted in ``fits_failed`` and left out: it is a local minimum, not an estimate), take the covariance ``I^-1`` of the fit
(`fisher_information` at the estimate: the output-error information; ``--covariance laplace`` uses
`cc.parameter_uncertainty` instead), and the 95 % free-run band of `cc.simulation_bands` (``method="linear"``,
no measurement noise). Reported:

* **coverage**: the fraction of the noise-free true output inside the band, over samples and seeds (target 90-99 %);
  and the same for the sampling band (``--sampling``, slower);
* **false alarms**: the Ljung-Box test (`cc.residual_analysis`, 25 lags, rejects at ``p < alpha``) at the TRUE
  parameters on fresh records (``--whiteness-seeds`` per system, cheap: no fit), one-step and free-run residuals;
  target 0.5-2 x alpha; and at the fitted parameters of the right structure. Also at the true parameters on
  records WITH process noise (std 0.05 on every state, the EKF told so): the one-step residuals (innovations)
  must stay white, the free-run residuals need not;
* **detection**: the rejection rate of the fitted wrong-structure model.

Run: ``python -m scripts.band_coverage [--seeds 40] [--json out.json] [--smoke]``.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import ceem_casadi as cc
from ceem_casadi.workflow import fisher_information

NOISE = 0.1
PROCESS = 0.05  # process-noise std (every state) of the whiteness check with process noise


@dataclass(frozen=True)
class System:
    name: str
    model: object
    truth: dict
    wrong: object
    wrong_start: dict


def _linear2(name="linear2"):
    P = cc.Parameters(cc.Param("a1", 1.0), cc.Param("a2", -0.5), cc.Param("b", 1.0))
    import casadi as ca
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: ca.vertcat(p.a1 * x[0] + p.a2 * x[1] + p.b * u, x[0]),
                                             lambda x, u, p: x[0], nx=2, nu=1, params=P, process_std=1e-3,
                                             measurement_std=NOISE, name=name)
    return model


def _first_order(name="first_order"):
    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
                                            params=cc.Parameters(cc.Param("a", 0.5), cc.Param("b", 1.0)),
                                            process_std=1e-3, measurement_std=NOISE, name=name)


def _cubic():
    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x - p.c * x ** 3 + p.b * u, lambda x, u, p: x,
                                            nx=1, nu=1, params=cc.Parameters(cc.Param("a", 0.5), cc.Param("c", 0.0),
                                                                            cc.Param("b", 1.0)),
                                            process_std=1e-3, measurement_std=NOISE, name="cubic")


def systems():
    return [System("linear2", _linear2(), {"a1": 1.5, "a2": -0.7, "b": 0.5}, _first_order(), {"a": 0.8, "b": 1.0}),
            System("cubic", _cubic(), {"a": 0.8, "c": 0.1, "b": 0.5}, _first_order(), {"a": 0.8, "b": 0.5})]


def multisine(T: int, rng, amplitude: float = 2.0, fmax: float = 0.2) -> np.ndarray:
    """(T, 1) random-phase multisine with equal amplitudes up to ``fmax`` cycles per sample, peak ``amplitude``."""
    k = np.arange(1, int(fmax * T) + 1)
    t = np.arange(T)[:, None]
    u = np.sin(2 * np.pi * k * t / T + rng.uniform(0, 2 * np.pi, k.size)).sum(axis=1)
    return (amplitude * u / np.max(np.abs(u)))[:, None]


def record(system: System, T: int, seed: int):
    """(data, noise-free true output (T, ny)) of one seed."""
    rng = np.random.default_rng(seed)
    u = multisine(T, rng)
    x0 = np.zeros(system.model.nx)
    y_true = cc.simulate_output(system.model, system.truth, u, x0)
    return cc.Trajectories([y_true + NOISE * rng.standard_normal(y_true.shape)], [u]), y_true


def fit(model, data, start: dict, rng):
    x0 = np.zeros(model.nx)
    perturbed = {k: float(v) * (1 + 0.1 * rng.standard_normal()) for k, v in start.items()}
    rf = cc.refine_output_error(model, data, perturbed, x0=x0, options=cc.OutputErrorOptions(
        max_iters=200, x_lower=x0, x_upper=x0, use_prior=False))
    return rf


def covariance(model, data, theta, kind: str) -> dict:
    if kind == "laplace":
        return cc.parameter_uncertainty(model, data, theta)
    info = fisher_information(model, theta, data.u[0], x0=np.zeros(model.nx))
    return {"index": model.params.free_index, "covariance": np.linalg.inv(info)}


def at_noise_floor(model, data, theta, ratio: float = 2.0) -> bool:
    """Whether the fit's mean squared free-run error is below ``ratio`` times the noise variance."""
    y_sim = cc.simulate_output(model, theta, data.u[0], np.zeros(model.nx))
    with np.errstate(all="ignore"):
        mse = float(np.mean((data.y[0] - y_sim) ** 2))
    return bool(np.isfinite(mse) and mse < ratio * NOISE ** 2)


def rejects(model, data, theta, alpha: float, lags: int) -> dict:
    res = cc.residual_analysis(model, data, theta, x0=np.zeros(model.nx), lags=lags, level=1 - alpha, engine="casadi")
    return {k: bool(c.p_value[0] < alpha) for k, c in res.kinds.items()}


def run_system(system: System, args) -> dict:
    t0 = time.perf_counter()
    inside, inside_all, inside_mc, total, failed = 0, 0, 0, 0, []
    fitted_alarms = {"one_step": 0, "free_run": 0}
    detections = {"one_step": 0, "free_run": 0}
    half_width = []
    for seed in range(args.seeds):
        rng = np.random.default_rng(10_000 + seed)
        data, y_true = record(system, args.T, seed)
        rf = fit(system.model, data, system.truth, rng)
        band = None
        if rf.success:
            unc = covariance(system.model, data, rf.theta, args.covariance)
            band = cc.simulation_bands(system.model, data, rf.theta, unc, x0=np.zeros(system.model.nx)).simulation
            inside_all += round(band.coverage([y_true])[0] * args.T)
        if band is None or not at_noise_floor(system.model, data, rf.theta):
            failed.append(seed)          # a fit that stopped far above the noise level is no estimate to band
            continue
        inside += round(band.coverage([y_true])[0] * args.T)
        half_width.append(float(band.half_width()[0]))
        total += args.T
        if args.sampling:
            mc = cc.simulation_bands(system.model, data, rf.theta, unc, x0=np.zeros(system.model.nx),
                                     method="sampling", samples=args.samples, seed=seed).simulation
            inside_mc += round(mc.coverage([y_true])[0] * args.T)
        for k, v in rejects(system.model, data, rf.theta, args.alpha, args.lags).items():
            fitted_alarms[k] += v
        wrong = fit(system.wrong, data, system.wrong_start, rng)
        for k, v in rejects(system.wrong, data, wrong.theta, args.alpha, args.lags).items():
            detections[k] += v
    fits = args.seeds - len(failed)
    alarms = {"one_step": 0, "free_run": 0}
    noisy = {"one_step": 0, "free_run": 0}
    offset = 100_000 * (1 + [x.name for x in systems()].index(system.name))   # other noise on each system
    w_model = system.model.with_noise(process_std=np.full(system.model.nx, PROCESS))
    for seed in range(args.whiteness_seeds):
        data, _ = record(system, args.T, offset + seed)
        for k, v in rejects(system.model, data, system.truth, args.alpha, args.lags).items():
            alarms[k] += v
        wdata, _ = cc.simulate(w_model, system.truth, np.zeros(system.model.nx), args.T, u=data.u[0],
                               process_std=PROCESS, measurement_std=NOISE, seed=offset + 50_000 + seed)
        for k, v in rejects(w_model, wdata, system.truth, args.alpha, args.lags).items():
            noisy[k] += v
    out = {
        "seeds": args.seeds, "samples_per_seed": args.T,
        "fits_failed": len(failed), "failed_seeds": failed,  # not converged, or far above the noise floor
        "coverage_linear": inside / max(total, 1),
        "coverage_linear_with_failed_fits": inside_all / (args.seeds * args.T),
        "coverage_sampling": inside_mc / max(total, 1) if args.sampling else None,
        "mean_half_width": float(np.mean(half_width)) if half_width else None,
        "false_alarm_true_model": {k: v / args.whiteness_seeds for k, v in alarms.items()},
        "whiteness_seeds": args.whiteness_seeds,
        "rejection_true_model_with_process_noise": {k: v / args.whiteness_seeds for k, v in noisy.items()},
        "false_alarm_fitted_model": {k: v / max(fits, 1) for k, v in fitted_alarms.items()},
        "detection_wrong_structure": {k: v / max(fits, 1) for k, v in detections.items()},
        "seconds": time.perf_counter() - t0,
    }
    lo, hi = 0.5 * args.alpha, 2.0 * args.alpha
    out["accept"] = {"coverage_90_99": 0.90 <= out["coverage_linear"] <= 0.99,
                     "false_alarm_0.5x_2x": all(lo <= v <= hi for v in out["false_alarm_true_model"].values())}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=40, help="fitted records per system (coverage, detection)")
    ap.add_argument("--whiteness-seeds", type=int, default=400, help="records per system at the true model")
    ap.add_argument("--T", type=int, default=300, help="samples per record")
    ap.add_argument("--alpha", type=float, default=0.05, help="level of the Ljung-Box test")
    ap.add_argument("--lags", type=int, default=25)
    ap.add_argument("--covariance", choices=("output-error", "laplace"), default="output-error")
    ap.add_argument("--sampling", action="store_true", help="also the sampling band (slower)")
    ap.add_argument("--samples", type=int, default=300, help="draws of the sampling band")
    ap.add_argument("--json", help="write the results as JSON to this file")
    ap.add_argument("--smoke", action="store_true", help="4 seeds, 20 whiteness seeds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.seeds, args.whiteness_seeds = 4, 20
    res = {"args": vars(args), "systems": {s.name: run_system(s, args) for s in systems()}}
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    print(json.dumps(res["systems"], indent=1))
    return res


if __name__ == "__main__":
    main()
