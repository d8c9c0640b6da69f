"""A realistic synthetic Wiener-Hammerstein benchmark with known truth (issue 24, item 5).

Truth (fs = 51.2 kHz): ``y = G2 f(G1 u) + e`` with

- G1 a 3rd-order Chebyshev type I low-pass (0.5 dB ripple, cut-off 4.4 kHz; ``scipy.signal.cheby1``,
  bilinear, so it has a direct term of 0.010: its first impulse-response sample),
- f an asymmetric diode-like saturation, ``f(v) = 2.44 tanh(v / 2.44)`` for v >= 0 and
  ``4.8 tanh(v / 4.8)`` below (soft on both sides, harder for positive v),
- G2 a 3rd-order inverse Chebyshev (type II) low-pass with 40 dB stop band from 5 kHz
  (``scipy.signal.cheby2``),
- u band-limited Gaussian (white noise through an 8th-order Butterworth low-pass at 10 kHz),
  scaled so that std(G1 u) = 1: f departs from the identity by more than 5 % about 20 % of the
  time (the measured fraction is reported),
- e white Gaussian, 60 dB below the output (std = 1e-3 RMS of the noise-free output).

``--train`` samples (default 100,000) for estimation and a separate ``--test`` record (another
input draw, default 20,000), both from rest. The fit starts from the library's BLA initialiser
(`ceem_casadi.workflow.initialisation._bla.bla_initialise`, never from the truth) with the conditioned block
model (``gain="dc"``, ``basis="chebyshev"``, orders 3 + 3, all blocks with a direct term), then
output error by the Levenberg-Marquardt engine (`cc.refine_output_error`, default solver) within
``--time-limit`` seconds. Per stage: wall time, iterations, status, estimation and test RMS (test
from rest, as the truth) and test RMS / noise std. The pipeline figure is the stage with the lowest
ESTIMATION RMS (never chosen on test data). CE-EM is not run here (see the report): its rows say so.

    python -m scripts.bench_wh_realistic [--train 100000] [--test 20000] [--degree 9] [--time-limit 240]
                                         [--seed 0] [--nonlinearity poly|mlp] [--hidden 8] [--warm-start]
                                         [--json out.json] [--smoke]

``--nonlinearity mlp`` fits an MLP nonlinearity (``--hidden`` tanh units, from the initialiser's
least-squares output layer on a random hidden layer); ``--warm-start``:
the MLP starts from the polynomial model's output-error optimum (`mlp_from_polynomial`), and
``--time-limit`` applies to each of the two fits. The last line
gives the seconds per output-error iteration against its floor (one residual + Jacobian
evaluation and one factorisation, timed in the same process).
"""
from __future__ import annotations

import argparse
import json
import re
import time

import numpy as np
import scipy.signal as ss

import ceem_casadi as cc
from ceem_casadi.workflow import bla_initialise

FS = 51200.0
SAT_POS, SAT_NEG = 2.44, 4.8        # saturation levels in units of std(G1 u)


def truth_filters():
    """``((b1, a1), (b2, a2))`` of G1 and G2 in powers of q^-1."""
    return ss.cheby1(3, 0.5, 4400, fs=FS), ss.cheby2(3, 40, 5000, fs=FS)


def f_true(v):
    """The asymmetric saturation (same shape as v)."""
    v = np.asarray(v, float)
    return np.where(v >= 0, SAT_POS * np.tanh(v / SAT_POS), SAT_NEG * np.tanh(v / SAT_NEG))


def make_record(n: int, seed: int, gain: float | None = None):
    """``(u (n,), y_clean (n,), v (n,), gain)``: band-limited Gaussian input from rest through the truth;
    ``gain`` scales the white input (default: so that std(G1 u) = 1 on this record)."""
    rng = np.random.default_rng(seed)
    sos = ss.butter(8, 10000, fs=FS, output="sos")
    u = ss.sosfilt(sos, rng.standard_normal(n))
    (b1, a1), (b2, a2) = truth_filters()
    if gain is None:
        gain = 1.0 / float(np.std(ss.lfilter(b1, a1, u)))
    u = gain * u
    v = ss.lfilter(b1, a1, u)
    return u, ss.lfilter(b2, a2, f_true(v)), v, gain


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the compiler): on a loaded machine the
    wall time says how long, the CPU time what the fit cost."""
    import resource

    return time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime


def _rms(a, b):
    return float(np.sqrt(np.mean((np.asarray(a).ravel() - np.asarray(b).ravel()) ** 2)))


def _per_iteration_cost(model, data, oe, wall_s: float, cpu_s: float) -> dict:
    """Seconds per iteration of the fit against its floor: one residual + Jacobian evaluation of the
    output-error problem (forward sensitivities, at the returned point) and one factorisation of
    its normal matrix (a Cholesky of J^T J), timed here in the same process (best of 3, wall and CPU)."""
    from ceem_casadi.workflow.output_error._least_squares import output_error_problem

    prob = output_error_problem(model, data.lengths, None, compiled=sum(data.lengths) >= 20000)
    prob.set_data(model, model.params.to_vector(oe.theta), data, True)
    w = np.concatenate([model.params.to_vector(oe.theta)[prob.free], np.asarray(oe.x0).ravel()])
    evals, facts, cpu = [], [], []
    try:                                # one BLAS thread, as the engine (optional extra threadpoolctl)
        from threadpoolctl import threadpool_limits
        limit = threadpool_limits(1, user_api="blas")
    except ImportError:  # pragma: no cover
        limit = None
    for _ in range(3):
        prob.set_data(model, model.params.to_vector(oe.theta), data, True)    # no cached evaluation
        t0, c0 = time.perf_counter(), time.process_time()
        r, J, _, _ = prob.evaluate(w, True)
        t1 = time.perf_counter()
        J = J.toarray() if hasattr(J, "toarray") else J
        H = J.T @ J + 1e-9 * np.eye(J.shape[1])
        np.linalg.cholesky(H)
        evals.append(t1 - t0)
        facts.append(time.perf_counter() - t1)
        cpu.append(time.process_time() - c0)
    if limit is not None:
        limit.restore_original_limits()
    floor, floor_cpu = min(evals) + min(facts), min(cpu)
    per_it, per_it_cpu = wall_s / max(oe.iterations, 1), cpu_s / max(oe.iterations, 1)
    trials = re.search(r"(\d+) trial evaluations", oe.message)   # residual evaluations of the engine
    return dict(seconds=per_it, cpu_seconds=per_it_cpu, floor_seconds=floor, jacobian_seconds=min(evals),
                factorisation_seconds=min(facts), ratio_to_floor=per_it / floor, floor_cpu_seconds=floor_cpu,
                cpu_ratio_to_floor=per_it_cpu / floor_cpu,
                evaluations_per_iteration=int(trials.group(1)) / max(oe.iterations, 1) if trials else float("nan"))


def mlp_from_polynomial(poly_init, poly_fit, mlp_init) -> dict:
    """Warm start of the MLP-nonlinearity model from the polynomial model's output-error optimum (its
    parent): the linear blocks as fitted (same ``gain="dc"`` parameterisation), the MLP's weights
    fitted by least squares (`cc.workflow.solve_least_squares`) to the fitted polynomial on 300
    points over its input range (centre +- 1.05 scale)."""
    import casadi as ca

    from ceem_casadi.model import MLP
    from ceem_casadi.model._block_oriented import nonlinearity

    c_p, s_p, o_p = poly_init.conditioning["center"], poly_init.best.scale, poly_init.conditioning["out_scale"]
    c_m, s_m, o_m = mlp_init.conditioning["center"], mlp_init.best.scale, mlp_init.conditioning["out_scale"]
    v = np.linspace(c_p - 1.05 * s_p, c_p + 1.05 * s_p, 300)
    target = nonlinearity(poly_fit.theta, v, scale=s_p, basis="chebyshev", center=c_p, out_scale=o_p)
    names = ["f_W0", "f_b0", "f_W1", "f_b1"]
    shapes = [np.shape(mlp_init.theta[n]) for n in names]
    sizes = [int(np.prod(sh)) for sh in shapes]
    p = ca.SX.sym("p", sum(sizes))
    parts = ca.vertsplit(p, np.concatenate([[0], np.cumsum(sizes)]).tolist())
    th = {n: ca.reshape(a, *sh) if len(sh) == 2 else a for n, a, sh in zip(names, parts, shapes)}
    net = MLP((1, sizes[1], 1), name="f")
    r = ca.vec(o_m * net(th, (ca.DM(v).T - c_m) / s_m) - ca.DM(target).T) / o_m
    x0 = np.concatenate([np.asarray(mlp_init.theta[n], float).ravel(order="F") for n in names])
    fit = cc.workflow.solve_least_squares(ca.Function("r", [p], [r]), x0,
                                          options=cc.OutputErrorOptions(max_iters=2000))
    theta = dict(mlp_init.theta, **{n: poly_fit.theta[n] for n in ("g1_den", "g1_num", "g2_den", "g2_num")})
    for n, a, sh in zip(names, np.split(fit.x, np.cumsum(sizes)[:-1]), shapes):
        theta[n] = np.reshape(a, sh, order="F")
    return theta


def run(train: int = 100_000, test: int = 20_000, degree: int = 9, time_limit: float = 240.0, seed: int = 0,
        orders=(3, 3), nonlinearity: str = "poly", hidden: int = 8,
        warm_start: bool = False, max_iters: int = 2000) -> dict:
    """Run the benchmark; returns the JSON-ready dict (module docstring)."""
    t_all = time.perf_counter()
    u, y0, v, g = make_record(train, seed)
    ut, yt0, _, _ = make_record(test, seed + 1000, gain=g)
    noise_std = 1e-3 * float(np.sqrt(np.mean(y0 ** 2)))
    rng = np.random.default_rng(seed + 1)
    y = y0 + noise_std * rng.standard_normal(train)
    yt = yt0 + noise_std * rng.standard_normal(test)
    saturating = float(np.mean(np.abs(f_true(v) - v) > 0.05 * np.abs(v)))
    est = cc.Trajectories([y[:, None]], [u[:, None]], dt=1 / FS)
    rows = []

    def row(stage, wall, iterations, status, est_rms, test_rms, **extra):
        rows.append(dict(stage=stage, wall_s=wall, iterations=iterations, status=status, est_rms=est_rms,
                         test_rms=test_rms, test_rms_over_noise=test_rms / noise_std, **extra))

    t0 = time.perf_counter()
    init = bla_initialise("wiener_hammerstein", est, orders[0], orders[1], feedthrough=(True, True), degree=degree,
                          gain="dc", basis="chebyshev", measurement_std=noise_std, nonlinearity=nonlinearity,
                          hidden=hidden, seed=seed)
    wall_init = time.perf_counter() - t0
    A, B, C, D = (np.atleast_2d(np.asarray(getattr(init.bla, k), float)) for k in "ABCD")
    y_mean, u_mean = float(np.mean(y)), float(np.mean(u))
    _, yb, _ = ss.dlsim((A, B, C, D, 1.0), ut - u_mean)
    row("BLA (N4SID)", wall_init, 0, "n/a", init.bla_rms, _rms(yb[:, 0] + y_mean, yt))

    def sim(theta, x0):
        return np.asarray(cc.simulate_output(init.model, theta, ut[:, None], np.zeros(init.model.nx)))[:, 0], \
            np.asarray(cc.simulate_output(init.model, theta, u[:, None], x0))[:, 0]

    yi_t, yi_e = sim(init.theta, np.zeros(init.model.nx))
    row("initialiser (BLA split + LS nonlinearity)", wall_init, 0, "n/a", _rms(yi_e, y), _rms(yi_t, yt),
        splits=len(init.table))
    row("CE-EM", 0.0, 0, "not run", float("nan"), float("nan"),
        note="not run in this benchmark (issue 24 item 3 is not part of this branch)")
    theta0, x00 = init.theta, init.x0
    if warm_start:          # the MLP from the polynomial model's optimum (its parent)
        t0 = time.perf_counter()
        pinit = bla_initialise("wiener_hammerstein", est, orders[0], orders[1], feedthrough=(True, True),
                               degree=degree, gain="dc", basis="chebyshev", measurement_std=noise_std)
        pfit = cc.refine_output_error(pinit.model, est, pinit.theta, x0=pinit.x0,
                                      options=cc.OutputErrorOptions(time_limit=time_limit))
        theta0, x00 = mlp_from_polynomial(pinit, pfit, init), pfit.x0
        yp_t, yp_e = (np.asarray(cc.simulate_output(pinit.model, pfit.theta, uu[:, None], x))[:, 0]
                      for uu, x in ((ut, np.zeros(pinit.model.nx)), (u, pfit.x0[0])))
        row(f"parent: polynomial degree {degree}, output error", time.perf_counter() - t0, pfit.iterations,
            str(pfit.status), _rms(yp_e, y), _rms(yp_t, yt))
    t0, cpu0 = time.perf_counter(), _cpu_s()
    remaining = time_limit if warm_start else max(time_limit - (time.perf_counter() - t_all), 1.0)
    oe = cc.refine_output_error(init.model, est, theta0, x0=x00,
                                options=cc.OutputErrorOptions(time_limit=remaining, max_iters=max_iters))
    wall_oe = time.perf_counter() - t0
    yo_t, yo_e = sim(oe.theta, oe.x0[0])
    cpu_oe = _cpu_s() - cpu0
    row("output error (Levenberg-Marquardt)", wall_oe, oe.iterations, str(oe.status), _rms(yo_e, y), _rms(yo_t, yt),
        cpu_s=cpu_oe, message=oe.message, initial_cost=oe.initial_cost, cost=oe.cost,
        per_iteration=_per_iteration_cost(init.model, est, oe, wall_oe, cpu_oe))
    best = min((r for r in rows if np.isfinite(r["est_rms"])), key=lambda r: r["est_rms"])
    pipeline = dict(best, stage=f"pipeline (best on estimation data: {best['stage']})",
                    wall_s=time.perf_counter() - t_all)
    rows.append(pipeline)
    return dict(config=dict(train=train, test=test, degree=degree, orders=list(orders), time_limit=time_limit,
                            seed=seed, fs=FS, nonlinearity=nonlinearity, hidden=hidden,
                            warm_start=warm_start),
                noise_std=noise_std, output_rms=float(np.sqrt(np.mean(y0 ** 2))), saturating_fraction=saturating,
                bla_rms_estimation=init.bla_rms, rows=rows,
                target=dict(test_rms_over_noise=1.5, wall_s=300.0,
                            met=bool(pipeline["test_rms_over_noise"] <= 1.5 and pipeline["wall_s"] < 300
                                     and best["status"] in ("converged", "n/a"))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=100_000)
    ap.add_argument("--test", type=int, default=20_000)
    ap.add_argument("--degree", type=int, default=9)
    ap.add_argument("--time-limit", type=float, default=240.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-iters", type=int, default=2000,
                    help="iteration limit of the final output-error fit (the time limit is the budget)")
    ap.add_argument("--nonlinearity", choices=("poly", "mlp"), default="poly",
                    help="f of the fitted model: Chebyshev polynomial of --degree, or a tanh MLP of --hidden units")
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--warm-start", action="store_true",
                    help="--nonlinearity mlp: start from the polynomial model's output-error optimum (parent)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--smoke", action="store_true", help="1,500 / 1,000 samples, degree 5, <= 20 s (for the tests)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.train, args.test, args.degree, args.time_limit = 1500, 1000, 5, min(args.time_limit, 20.0)
    res = run(args.train, args.test, args.degree, args.time_limit, args.seed, nonlinearity=args.nonlinearity,
              hidden=args.hidden, warm_start=args.warm_start,
              max_iters=args.max_iters)
    print(f"noise std {res['noise_std']:.4g} (output RMS {res['output_rms']:.4g}); "
          f"f saturating {100 * res['saturating_fraction']:.1f} % of the time (loaded machine timings)")
    print(f"{'stage':<58} {'wall s':>7} {'iter':>5} {'status':<12} {'est RMS':>10} {'test RMS':>10} {'/noise':>7}")
    for r in res["rows"]:
        print(f"{r['stage']:<58} {r['wall_s']:7.1f} {r['iterations']:5d} {r['status']:<12} {r['est_rms']:10.4g} "
              f"{r['test_rms']:10.4g} {r['test_rms_over_noise']:7.2f}")
    oe = next(r for r in res["rows"] if r["stage"].startswith("output error"))
    pi = oe["per_iteration"]
    print(f"output error: {oe['status']}, {oe['iterations']} iterations, {oe['wall_s']:.1f} s ({oe['cpu_s']:.1f} CPU s); "
          f"{oe['message']}")
    print(f"per iteration "
          f"{pi['seconds']:.3g} s against a floor of {pi['floor_seconds']:.3g} s (one residual + Jacobian "
          f"{pi['jacobian_seconds']:.3g} s, one factorisation {pi['factorisation_seconds']:.3g} s): "
          f"ratio {pi['ratio_to_floor']:.2f} (in CPU seconds {pi['cpu_seconds']:.3g} s per iteration against "
          f"{pi['floor_cpu_seconds']:.3g} s: {pi['cpu_ratio_to_floor']:.2f}); "
          f"{pi['evaluations_per_iteration']:.2f} trial evaluations per iteration "
          "(a residual evaluation each; an accepted one adds its Jacobian)")
    print("target (test RMS <= 1.5 noise std, converged, < 300 s):", "met" if res["target"]["met"] else "NOT met")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
