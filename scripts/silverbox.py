"""Silverbox benchmark (Wigren and Schoukens 2013): N4SID, gray-box CE-EM, free-run simulation RMS.

Protocol (``../shared/data/README.md``): identify on the multisine training part; report the
free-run simulation RMS (mV) after a 50-sample initialisation window, with the initial state
estimated from that window only, on the multisine test part and on the "arrow" test (full, and
its first 32,000 samples, no extrapolation).

1. N4SID (order 2, on the first 20,000 training samples): the linear baseline.
2. Initial guess from the N4SID poles and gain (``models.silverbox.initial_theta``); the model is the
   Duffing oscillator with the quadratic stiffness and output terms (``--no-quadratic``: without).
3. CE-EM on the training record cut into ``--segment``-sample trajectories (the smoothing NLPs are
   independent per segment; the learning NLP sees all of them), model sigma_w small against
   sigma_v (``--process-std``, ``--measurement-std``) so that the smoothed states follow the model.
4. Optional simulation-error refinement (default on, ``--no-refine`` skips it):
   `ceem_casadi.refine_output_error`, single shooting over the first ``--refine-samples``
   training samples, from the CE-EM estimate. Both the CE-EM-only and the refined numbers are reported.
Initial states of the test records: `ceem_casadi.estimate_initial_state` on the first 50
samples; free runs: `ceem_casadi.simulate_output` (also for the N4SID baseline, through
`to_model`).

Output (``--out DIR``): ``results.json``, ``table.md`` (beside the published results),
``test_multisine.png`` (measured vs simulated test output and the error).

    python -m scripts.silverbox [--segment 2000] [--out results/silverbox] [--smoke]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import ceem_casadi as cc
from ceem_casadi.baselines import n4sid
from models.silverbox import DT, initial_theta, silverbox

PUBLISHED = {"LTI state space": (6.96, 14.4, 6.58), "LSTM": (1.50, 2.68, 0.960), "best known": (0.36, 0.26, 0.32)}
TESTS = ("test_multisine", "test_arrow_full", "test_arrow_no_extrapolation")


def test_rms(model, p, split) -> tuple[float, np.ndarray]:
    """Simulation RMS in mV after the init window and the simulated output (T, 1); x0 from the
    first ``init_window`` samples only (`ceem_casadi.estimate_initial_state`)."""
    y, u, w = split.y, split.u, split.init_window
    x0 = cc.estimate_initial_state(model, y[:w], p, u=u[:w], window=w, x_init=np.r_[y[0, 0], 0.0])
    yhat = cc.simulate_output(model, p, u, x0)
    return 1e3 * cc.io.simulation_rms(y, yhat, skip=w), yhat


def refine(model, p0, y, u, shooting=None, max_iter: int = 100) -> np.ndarray:
    """Output-error refinement (`ceem_casadi.refine_output_error`) of the parameters and x0
    on one training record from ``p0`` (single shooting, or multiple shooting every ``shooting``
    samples); returns the flat parameter vector."""
    theta = model.params.from_vector(np.clip(p0, model.params.lower, model.params.upper))
    res = cc.refine_output_error(model, cc.Trajectories([y], [u], dt=DT), theta, shooting=shooting,
                                 x0=np.r_[y[0, 0], 0.0], options=cc.OutputErrorOptions(max_iters=max_iter))
    print(f"refinement: {res.status}, {res.message}, cost {res.initial_cost:.4g} -> {res.cost:.4g}", flush=True)
    return model.theta_vector(res.theta)


def n4sid_rms(fit, split) -> float:
    """Test RMS (mV) of the N4SID model as a library model: x0 from the first ``init_window`` samples."""
    model, theta = fit.to_model()
    y, u = split.data.y[0], split.data.u[0]
    w = split.init_window
    x0 = cc.estimate_initial_state(model, y, theta, u=u, window=w)
    return 1e3 * cc.io.simulation_rms(y[:, 0], cc.simulate_output(model, theta, u, x0)[:, 0], skip=w)


def figure(y, yhat, dt, path: Path, rms: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = np.arange(len(y)) * dt
    fig, ax = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    ax[0].plot(t, 1e3 * y, lw=0.6, label="measured")
    ax[0].plot(t, 1e3 * yhat, lw=0.6, label="gray-box simulation")
    ax[0].set_ylabel("output (mV)")
    ax[0].legend(loc="upper right", fontsize=8)
    ax[0].set_title(f"Silverbox multisine test: free-run simulation, RMS {rms:.3f} mV")
    ax[1].plot(t, 1e3 * (y - yhat), lw=0.6, color="tab:red")
    ax[1].set_ylabel("error (mV)")
    ax[1].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description="Silverbox: N4SID, gray-box CE-EM, simulation RMS")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--segment", type=int, default=2000, help="samples per CE-EM training trajectory")
    ap.add_argument("--train-samples", type=int, default=None, help="use only the first N training samples")
    ap.add_argument("--process-std", type=float, nargs=2, default=(1e-5, 1e-4), help="sigma_w of (y, v) in V")
    ap.add_argument("--measurement-std", type=float, default=1e-3, help="sigma_v in V")
    ap.add_argument("--max-iters", type=int, default=30)
    ap.add_argument("--rho-theta", type=float, default=None,
                    help="learning-step trust region (default 0; 1 with --mlp-hidden: the zero-output MLP makes "
                         "the Gauss-Newton Hessian singular in its first-layer weights)")
    ap.add_argument("--mlp-hidden", type=int, default=0,
                    help="add the MLP correction force (3 -> N -> 1, tanh, output layer starts at zero)")
    ap.add_argument("--no-quadratic", action="store_true",
                    help="plain Duffing oscillator (without the quadratic stiffness k2 and output term c_y2)")
    ap.add_argument("--no-refine", action="store_true")
    ap.add_argument("--refine-samples", type=int, default=20000)
    ap.add_argument("--out", default="results/silverbox")
    ap.add_argument("--smoke", action="store_true", help="4,000 training samples, 3 CE-EM iterations (< 1 min)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.train_samples, args.segment, args.max_iters, args.refine_samples = 4000, 1000, 3, 2000
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        splits = cc.load_silverbox(args.data_dir)
    except cc.io.DatasetNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    tests = {k: splits[k] for k in TESTS}
    if args.smoke:  # short test records too
        tests = {k: cc.io.BenchmarkSplit(k, cc.Trajectories(v.data.y[0][:3000], v.data.u[0][:3000], v.data.dt),
                                      v.init_window) for k, v in tests.items()}
    tr = splits["train"].data
    y, u = tr.y[0], tr.u[0]
    if args.train_samples:
        y, u = y[:args.train_samples], u[:args.train_samples]
    times, t0 = {}, time.perf_counter()

    fit = n4sid([(y[:20000], u[:20000])], order=2)
    lin = {k: n4sid_rms(fit, s) for k, s in tests.items()}
    theta0 = initial_theta(fit.A, fit.B, fit.C, fit.D, float(y.mean()), float(u.mean()))
    times["n4sid_s"] = time.perf_counter() - t0

    model = silverbox(theta0, process_std=args.process_std, measurement_std=args.measurement_std,
                      mlp_hidden=args.mlp_hidden, seed=0, quadratic=not args.no_quadratic)
    theta0 = model.params.initial()
    L = args.segment
    n_seg = len(y) // L
    data = cc.Trajectories([y[i * L:(i + 1) * L] for i in range(n_seg)], [u[i * L:(i + 1) * L] for i in range(n_seg)],
                           dt=tr.dt)
    t = time.perf_counter()
    rho_theta = args.rho_theta if args.rho_theta is not None else (1.0 if args.mlp_hidden else 0.0)
    options = cc.CEEMOptions(max_iters=args.max_iters, acceleration="newton",
                             learner=cc.LearnerOptions(rho_theta=rho_theta))
    res = cc.ceem(model, data, theta0, options=options)
    times["ceem_s"] = time.perf_counter() - t
    p_ceem = model.theta_vector(res.theta)
    ceem_rms = {k: test_rms(model, p_ceem, s)[0] for k, s in tests.items()}
    print(f"N4SID {lin}\nCE-EM ({res.status}: {res.message}; {res.iterations} it, {times['ceem_s']:.1f} s) {ceem_rms}",
          flush=True)

    p_final, refined_rms = p_ceem, None
    if not args.no_refine:
        t = time.perf_counter()
        p_final = refine(model, p_ceem, y[:args.refine_samples], u[:args.refine_samples])
        times["refine_s"] = time.perf_counter() - t
        refined_rms = {k: test_rms(model, p_final, s)[0] for k, s in tests.items()}
        print(f"refined {refined_rms}", flush=True)
    best_rms, yhat = test_rms(model, p_final, tests["test_multisine"])
    times["total_s"] = time.perf_counter() - t0
    figure(tests["test_multisine"].data.y[0][:, 0], yhat[:, 0], tr.dt, out / "test_multisine.png", best_rms)

    rows = ["| model | multisine test (mV) | arrow full (mV) | arrow, no extrapolation (mV) |", "|---|---|---|---|"]
    fmt = lambda r: " | ".join(f"{r[k]:.3f}" for k in TESTS)  # noqa: E731
    rows.append(f"| N4SID, order 2 (ours) | {fmt(lin)} |")
    name = "Duffing" if args.no_quadratic else "Duffing + quadratic terms"
    rows.append(f"| gray-box {name}, CE-EM (ours) | {fmt(ceem_rms)} |")
    if refined_rms:
        rows.append(f"| gray-box {name}, CE-EM + simulation-error refinement (ours) | {fmt(refined_rms)} |")
    for name, v in PUBLISHED.items():
        rows.append(f"| {name} (published) | " + " | ".join(f"{x:g}" for x in v) + " |")
    table = "\n".join(rows) + "\n"
    (out / "table.md").write_text(table)
    result = {"n4sid_rms_mV": lin, "ceem_rms_mV": ceem_rms, "refined_rms_mV": refined_rms, "ceem_message": res.message,
              "theta_ceem": {k: np.asarray(v).tolist() for k, v in res.theta.items()},
              "theta_final": {k: np.asarray(v).tolist() for k, v in model.params.from_vector(p_final).items()},
              "ceem_status": res.status,
              "ceem_iterations": res.iterations, "segments": n_seg, "segment": L, "times_s": times,
              "published_mV": PUBLISHED, "args": vars(args)}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(table)
    print(json.dumps(times))
    if args.smoke:
        assert all(np.isfinite(v) for d in (lin, ceem_rms) for v in d.values())
        assert all((out / f).exists() for f in ("results.json", "table.md", "test_multisine.png"))
    return result


if __name__ == "__main__":
    main()
