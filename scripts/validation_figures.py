"""The figures of docs/validation.md: residual analysis of a right and a wrong model structure, and a simulation band.

The cubic system of `scripts/band_coverage.py` (``x+ = a x - c x^3 + b u``, ``y = x + v``), one record of 300
samples, fitted by output error with the right structure and with the linear one (``c = 0``); the residual figures
of both; and the 95 % free-run band (parameters only, and for new measurements) of the right structure fitted on
a short record of 40 samples (so that the parameter band is visible), drawn on the first 80 samples of a fresh
validation record.

Run: ``python -m scripts.validation_figures [--out docs/figures]``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import ceem_casadi as cc
from scripts.band_coverage import covariance, fit, record, systems


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/figures")
    args = ap.parse_args(argv)
    out = Path(args.out)
    system = systems()[1]
    data, _ = record(system, 300, seed=7)
    rng = np.random.default_rng(7)
    right = fit(system.model, data, system.truth, rng)
    wrong = fit(system.wrong, data, system.wrong_start, rng)
    x0 = np.zeros(1)
    res_right = cc.residual_analysis(system.model, data, right.theta, x0=x0)
    res_wrong = cc.residual_analysis(system.wrong, data, wrong.theta, x0=x0)
    res_right.plot(out / "validation_residuals_right.png", kind="free_run")
    res_wrong.plot(out / "validation_residuals_wrong.png", kind="free_run")
    short, _ = record(system, 40, seed=9)
    small = fit(system.model, short, system.truth, rng)
    unc = covariance(system.model, short, small.theta, "output-error")
    val, y_true = record(system, 80, seed=8)
    band = cc.simulation_bands(system.model, val, small.theta, unc, x0=x0)
    band.plot(out / "validation_band.png")
    noisy = cc.simulation_bands(system.model, val, small.theta, unc, x0=x0, measurement_noise=True)
    noisy.plot(out / "validation_band_measurements.png")
    summary = {"right": res_right.table(), "wrong": res_wrong.table(), "band": band.table(), "noisy": noisy.table(),
               "truth_inside": float(band.simulation.coverage([y_true])[0]),
               "theta_right": right.theta, "theta_wrong": wrong.theta, "theta_short": small.theta}
    for k, v in summary.items():
        print(f"{k}:\n{v}")
    return summary


if __name__ == "__main__":
    main()
