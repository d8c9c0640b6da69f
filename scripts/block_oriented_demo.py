"""Block-oriented models: BLA initialisation and output-error refinement of a simulated
Wiener-Hammerstein system, the conditioning of the cascaded-section parameterisation against the
companion (direct) form, and ``n4sid(..., stable=...)`` on short noisy records.

Part 1 (``wh``): truth ``y = G2 f(G1 u) + e``, G1 order 3 (poles 0.9 exp(+-0.4i), 0.5; relative
degree 1), G2 order 3 (poles 0.8 exp(+-1.0i), -0.4; feedthrough), f a cubic on v / std(v);
u ~ N(0, 1), ``--T`` samples for estimation and as many (another input draw) for validation,
white output noise of ``--noise`` times the output's standard deviation. ``bla_initialise`` then
``cc.refine_output_error`` from it; the validation run starts from rest (as the truth) and the
BLA (the N4SID linear model alone) is reported for comparison.

Part 2 (``conditioning``): at the truth, the condition number of the output-error Jacobian (columns
scaled to unit norm, so parameter units do not matter) of a Wiener model of order n in the
cascaded-section form against the same model with one companion-form denominator.

Part 3 (``n4sid``): a lightly damped 4th-order system, white input, 30 % output noise, order 8 on
``--n4sid-T`` samples, seeds 0..``--n4sid-seeds``-1: how often the plain A is unstable and, on those
records, the relative error of 30 Markov parameters of the plain and the ``stable=True`` (reflect)
estimates (median, max).

Part 4 (``tanks``): N4SID of orders ``--tanks-orders`` on the Cascaded Tanks estimation record,
plain and ``stable=True``: spectral radius and the free-run RMS on the test record (from rest).

    python -m scripts.block_oriented_demo [--T 2000] [--noise 0.01] [--seed 0] [--solver lm|ipopt] [--json out.json]
        [--smoke]
"""
from __future__ import annotations

import argparse
import json
import logging
import time

import casadi as ca
import numpy as np
from scipy.signal import tf2ss

import ceem_casadi as cc
from ceem_casadi.baselines._n4sid import n4sid
from ceem_casadi.model._block_oriented import block_markov, block_poles, wiener, wiener_hammerstein
from ceem_casadi.workflow.initialisation._bla import _den_from_poles, bla_initialise

G1_POLES = np.array([0.9 * np.exp(0.4j), 0.9 * np.exp(-0.4j), 0.5])
G2_POLES = np.array([0.8 * np.exp(1.0j), 0.8 * np.exp(-1.0j), -0.4])
TRUTH = {"g1_den": _den_from_poles(G1_POLES, 3), "g1_num": np.array([1.0, -0.6, 0.3]),
         "g2_den": _den_from_poles(G2_POLES, 3), "g2_num": np.array([0.5, -0.2, 0.3]),
         "f_coef": np.array([0.05, 1.0, 0.25, -0.12])}



def simulate(model, theta: dict, u, *, noise_std: float = 0.0, seed=0, x0=None) -> cc.Trajectories:
    """Noise-free run of a block model from ``x0`` (default zero) plus white output noise of std
    ``noise_std`` (seeded): ``Trajectories`` with y (T, 1) for ``u`` (T,) or (T, 1)."""
    u = np.asarray(u, float).reshape(-1, 1)
    x0 = np.zeros(model.nx) if x0 is None else np.asarray(x0, float)
    y = np.asarray(cc.simulate_output(model, theta, u, x0), float)
    rng = np.random.default_rng(seed)
    return cc.Trajectories([y + noise_std * rng.standard_normal(y.shape)], [u])

def _rms(a, b) -> float:
    return float(np.sqrt(np.mean((np.asarray(a) - np.asarray(b)) ** 2)))


def _hausdorff(a, b) -> float:
    d = np.abs(np.asarray(a)[:, None] - np.asarray(b)[None, :])
    return float(max(d.min(axis=1).max(), d.min(axis=0).max()))


def wh_part(T: int, noise: float, seed: int, solver: str = "lm") -> dict:
    rng = np.random.default_rng(seed)
    u_est, u_val = rng.standard_normal(T), rng.standard_normal(T)
    # f acts on v / std(v): v = G1 u from a Wiener model with G1 and f(v) = v
    lin = wiener(3, theta0={"g_den": TRUTH["g1_den"], "g_num": TRUTH["g1_num"], "f_coef": [0.0, 1.0]}, degree=1)
    v = np.asarray(cc.simulate_output(lin, lin.params.initial(), u_est[:, None], np.zeros(3)))
    scale = float(np.std(v))
    model = wiener_hammerstein(3, 3, theta0=TRUTH, scale=scale)
    sd = float(np.std(simulate(model, TRUTH, u_est).y[0]))
    est = simulate(model, TRUTH, u_est, noise_std=noise * sd, seed=seed + 1)
    val = simulate(model, TRUTH, u_val, noise_std=0.0)
    t0 = time.perf_counter()
    init = bla_initialise("wiener_hammerstein", est, 3, 3)
    t_init = time.perf_counter() - t0
    res = cc.refine_output_error(init.model, est, init.theta, x0=init.x0, options=cc.OutputErrorOptions(solver=solver))
    y_val = cc.simulate_output(init.model, res.theta, u_val[:, None], np.zeros(6))
    y_init = cc.simulate_output(init.model, init.theta, u_val[:, None], np.zeros(6))
    bla = init.bla
    y_bla = bla.simulate(u_val[:, None] - np.mean(u_est), np.zeros(bla.nx)) + np.mean(est.y[0])
    out = {
        "T": T, "noise_std": noise * sd, "output_std": sd, "splits_tried": len(init.table),
        "init_s": t_init, "init_rms_est": init.best.rms, "second_best_rms_est": init.table[1].rms,
        "init_g1_poles_error": _hausdorff(init.best.g1_poles, G1_POLES),
        "init_g1_vs_true_g2": _hausdorff(init.best.g1_poles, G2_POLES),
        "refine_solver": solver, "refine_status": str(res.status), "refine_s": res.wall_s,
        "refine_iterations": res.iterations,
        "refined_rms_est": _rms(cc.simulate_output(init.model, res.theta, u_est[:, None], res.x0[0]), est.y[0]),
        "val_rms_bla_linear": _rms(y_bla, val.y[0]), "val_rms_init": _rms(y_init, val.y[0]),
        "val_rms_refined": _rms(y_val, val.y[0]),
        "refined_g1_poles_error": _hausdorff(block_poles(res.theta, "g1"), G1_POLES),
        "refined_g2_poles_error": _hausdorff(block_poles(res.theta, "g2"), G2_POLES),
        "refined_g1_markov_error": float(np.abs(block_markov(res.theta, "g1") - block_markov(TRUTH, "g1")).max()),
        "refined_g2_markov_error": float(np.abs(block_markov(res.theta, "g2", True)
                                                - block_markov(TRUTH, "g2", True)).max()),
    }
    print(init.format_table(4))
    return out


def _companion_wiener(n: int, den, num, coef, scale: float) -> tuple[cc.StateSpaceModel, dict]:
    """Wiener model of order n with one companion-form denominator (the comparison)."""
    params = cc.Parameters(cc.Param("a", den), cc.Param("b", num, free=np.arange(n) > 0), cc.Param("f_coef", coef))

    def step(x, u, p):
        return ca.vertcat(-ca.dot(p.a, x) + u[0], x[:n - 1])

    def observe(x, u, p):
        v = ca.dot(p.b, x) / scale
        return p.f_coef[0] + p.f_coef[1] * v + p.f_coef[2] * v ** 2 + p.f_coef[3] * v ** 3

    theta = {"a": den, "b": num, "f_coef": coef}
    return cc.StateSpaceModel.from_discrete(step, observe, nx=n, nu=1, params=params), theta


def _scaled_condition(model, theta, u) -> float:
    pv = model.params.to_vector(theta)
    cols = []
    for i in model.params.free_index:
        e = np.zeros_like(pv)
        e[i] = 1e-6 * max(1.0, abs(pv[i]))
        plus = cc.simulate_output(model, pv + e, u[:, None], np.zeros(model.nx))
        minus = cc.simulate_output(model, pv - e, u[:, None], np.zeros(model.nx))
        cols.append((plus - minus).ravel() / (2 * e[i]))
    J = np.column_stack(cols)
    s = np.linalg.svd(J / np.linalg.norm(J, axis=0), compute_uv=False)
    return float(s[0] / s[-1])


def conditioning_part(orders, T: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(T)
    rows = []
    for n in orders:
        radii = np.linspace(0.9, 0.6, (n + 1) // 2)
        poles = np.concatenate([[r * np.exp(1j * w), r * np.exp(-1j * w)]
                                for r, w in zip(radii, np.linspace(0.3, 1.5, (n + 1) // 2))])[:n]
        if n % 2:
            poles[-1] = 0.5
        num = np.full(n, 0.2)
        num[0], num[1] = 1.0, -0.3
        coef = np.array([0.0, 1.0, 0.2, -0.1])
        th = {"g_den": _den_from_poles(poles, n), "g_num": num, "f_coef": coef}
        lin = wiener(n, theta0={**th, "f_coef": [0.0, 1.0]}, degree=1)
        scale = float(np.std(cc.simulate_output(lin, lin.params.initial(), u[:, None], np.zeros(n))))
        casc = wiener(n, theta0=th, scale=scale)
        # the same transfer function in companion form: a = poly(poles); b from matching the impulse response
        a = np.real(np.poly(poles))[1:]
        h = block_markov(th, "g", False, K=n)[1:]                    # h_1..h_n
        A = np.vstack([-a, np.eye(n)[:-1]])
        B = np.eye(n)[:, 0]
        ctrb = np.column_stack([np.linalg.matrix_power(A, k) @ B for k in range(n)])
        b = np.linalg.solve(ctrb.T, h)                               # C A^k B = h_(k+1)
        comp, th_c = _companion_wiener(n, a, b, coef, scale)
        y1 = cc.simulate_output(casc, th, u[:, None], np.zeros(n))
        y2 = cc.simulate_output(comp, th_c, u[:, None], np.zeros(n))
        rows.append({"order": n, "same_output": float(np.abs(y1 - y2).max()),
                     "cond_cascade": _scaled_condition(casc, th, u), "cond_companion": _scaled_condition(comp, th_c, u)})
    return rows


def n4sid_part(T: int, seeds: int) -> dict:
    poles = np.array([0.97 * np.exp(0.4j), 0.97 * np.exp(-0.4j), 0.9 * np.exp(1.2j), 0.9 * np.exp(-1.2j)])
    A, B, C, D = tf2ss([1.0, 0.5, 0.2, 0.0], np.real(np.poly(poles)))

    def markov(A, B, C, D, K=30):
        out, M = [D], B
        for _ in range(K):
            out.append(C @ M)
            M = A @ M
        return np.stack(out).ravel()

    true = markov(A, B, C, D)
    errs = {"plain": [], "reflect": []}
    unstable = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        u = rng.standard_normal((T, 1))
        x, y = np.zeros(4), np.empty((T, 1))
        for t in range(T):
            y[t] = C @ x + D @ u[t]
            x = A @ x + B @ u[t]
        y += 0.3 * y.std() * rng.standard_normal(y.shape)
        data = cc.Trajectories([y], [u])
        plain = n4sid(data, order=8)
        if np.max(np.abs(np.linalg.eigvals(plain.A))) < 1:
            continue
        unstable += 1
        for key, r in (("plain", plain), ("reflect", n4sid(data, order=8, stable=True))):
            assert key == "plain" or np.max(np.abs(np.linalg.eigvals(r.A))) < 1
            errs[key].append(float(np.abs(markov(r.A, r.B, r.C, r.D) - true).max() / np.abs(true).max()))
    return {"T": T, "seeds": seeds, "unstable_plain": unstable,
            **{f"markov_error_{k}_median": float(np.median(v)) if v else None for k, v in errs.items()},
            **{f"markov_error_{k}_max": float(np.max(v)) if v else None for k, v in errs.items()}}


def tanks_part(orders) -> list:
    """N4SID on the Cascaded Tanks estimation record (mean removed), free run on the test record from rest."""
    splits = cc.load_cascaded_tanks()
    est, test = splits["estimation"], splits["test"]
    data = cc.Trajectories([est.y - est.y.mean()], [est.u - est.u.mean()])
    rows = []
    for order in orders:
        for stable in (False, True):
            r = n4sid(data, order=order, stable=stable)
            with np.errstate(all="ignore"):
                y = r.simulate(test.u - est.u.mean(), np.zeros(order)) + est.y.mean()
            rows.append({"order": order, "stable": stable, "spectral_radius": float(np.max(np.abs(np.linalg.eigvals(r.A)))),
                         "test_rms_V": float(np.sqrt(np.mean((y - test.y) ** 2)))})
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=2000)
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--orders", type=int, nargs="+", default=[3, 4, 6, 8])
    ap.add_argument("--n4sid-T", type=int, default=100)
    ap.add_argument("--n4sid-seeds", type=int, default=30)
    ap.add_argument("--tanks-orders", type=int, nargs="*", default=[5, 7, 8],
                    help="N4SID orders on the Cascaded Tanks data (none: skip)")
    ap.add_argument("--solver", choices=("lm", "ipopt"), default="lm", help="output-error solver of the refinement")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="small sizes (a few seconds)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.T, args.orders, args.n4sid_seeds = 600, [3, 4], 6
    logging.getLogger("ceem_casadi").setLevel(logging.ERROR)
    out = {"wh": wh_part(args.T, args.noise, args.seed, args.solver),
           "conditioning": conditioning_part(args.orders, 1000, args.seed),
           "n4sid": n4sid_part(args.n4sid_T, args.n4sid_seeds),
           "tanks": tanks_part(args.tanks_orders) if args.tanks_orders else []}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
