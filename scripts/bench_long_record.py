"""Long records: CE-EM on a 20,000-sample Wiener-Hammerstein record (issue 14, item 5).

System: a 3rd-order discrete linear filter G1, a saturating static nonlinearity (cubic), a
3rd-order linear filter G2 (6 states; ``ceem_casadi.model._block_oriented.wiener_hammerstein(3, 3)``, 15 free
parameters), driven by a random-phase multisine, output noise 1 % of the output's RMS; the initial
guess is the truth with every entry perturbed by up to 5 %. Fitted (a) on 10 segments of 2,000 samples and (b) in one piece (1 x 20,000),
before (``acceleration="newton"``) and after (``acceleration="joint"``). Printed per run:
iterations, wall and CPU time (the CPU time of this process is the better
figure on a shared machine), final relative change of J, test free-run RMS on a fresh multisine
realisation (transient discarded).

    python -m scripts.bench_long_record [--json out.json] [--smoke] [--time-limit 300]
        [--problems segments,one_piece] [--accelerations newton,joint] [--diagnose]

``--diagnose`` adds, at the final iterate of each fit, the condition numbers of the learning
Hessian and of the reduced (states eliminated) exact and Gauss-Newton Hessians, and the
predicted linear rates of plain EM (fraction of missing information) and of Gauss-Newton.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import ceem_casadi as cc
from ceem_casadi.model._block_oriented import wiener_hammerstein

N_TRAIN = 20_000
N_SMOKE = 1_000
N_TEST = 5_000
TRANSIENT = 500  # test samples discarded before the RMS (the filters forget x0 by then)


def multisine(n: int, f_max: float, rms: float, seed) -> np.ndarray:
    """Random-phase multisine (n,) with equal amplitudes on the bins 1 .. f_max * n (f_max in
    cycles per sample), scaled to ``rms``."""
    rng = np.random.default_rng(seed)
    k = np.arange(1, int(f_max * n) + 1)
    phases = rng.uniform(0, 2 * np.pi, k.size)
    t = np.arange(n)
    u = np.zeros(n)
    for chunk in np.array_split(np.arange(k.size), max(1, k.size // 200)):
        u += np.cos(2 * np.pi * np.outer(t, k[chunk]) / n + phases[chunk]).sum(axis=1)
    return rms * u / np.sqrt(np.mean(u ** 2))


# the true system, in the factory's parameterisation (cascaded sections, see ceem_casadi/model/_block_oriented.py):
# G1 poles 0.7 +- 0.3j and 0.6, G2 poles 0.5 +- 0.5j and 0.8 (with feedthrough), f(v) = z - 0.08 z^3 with
# z = v / scale (its slope vanishes at |z| = 2.04: a soft saturation over the input range)
TRUTH = {"g1_den": [-1.4, 0.58, -0.6], "g1_num": [1.0, 0.3, -0.2], "g2_den": [-1.0, 0.5, -0.8],
         "g2_num": [0.4, -0.2, 0.1], "f_coef": [0.0, 1.0, 0.0, -0.08]}


def wh_model(scale: float = 1.0):
    """The 3 + 3 Wiener-Hammerstein model (cubic nonlinearity; 16 parameters, 15 free)."""
    return wiener_hammerstein(3, 3, degree=3, scale=scale, theta0=TRUTH)


def make_problem(n_train: int, n_segments: int, seed: int = 0):
    """(model with its noise, truth, training Trajectories, theta0, test (u, y)) of the WH bench."""
    u = multisine(n_train, 0.4, 1.0, seed)
    # scale = the RMS of the nonlinearity's input under the true G1 (a constant of the model)
    probe = wh_model()
    truth = {k: np.asarray(v, float) for k, v in TRUTH.items()}
    _, x = cc.simulate_output(probe, truth, u[:, None], np.zeros(probe.nx), return_states=True)
    v = x[:, :3] @ truth["g1_num"]
    model = wh_model(scale=float(np.sqrt(np.mean(v ** 2))))
    y = cc.simulate_output(model, truth, u[:, None], np.zeros(model.nx))[:, 0]
    rng = np.random.default_rng(seed + 1)
    sigma_v = 0.01 * np.sqrt(np.mean(y ** 2))
    y_noisy = y + sigma_v * rng.standard_normal(y.shape)
    cut = np.array_split(np.arange(n_train), n_segments)
    data = cc.Trajectories([y_noisy[i, None] for i in cut], [u[i, None] for i in cut])
    model = model.with_noise(measurement_std=sigma_v, process_std=1e-3)
    rng = np.random.default_rng(seed + 2)
    theta0 = {k: v * (1 + 0.05 * rng.uniform(-1, 1, np.shape(v))) for k, v in truth.items()}
    theta0["g1_num"][0] = 1.0  # fixed (unit leading Markov coefficient)
    u_test = multisine(N_TEST, 0.4, 1.0, seed + 100)  # a fresh realisation (other phases)
    y_test = cc.simulate_output(model, truth, u_test[:, None], np.zeros(model.nx))[:, 0]
    return model, truth, data, theta0, (u_test, y_test)


def test_rms(model, theta, test) -> float:
    """Free-run simulation RMS on the test record from x0 = 0, the first TRANSIENT samples discarded."""
    u, y = test
    yhat = cc.simulate_output(model, theta, u[:, None], np.zeros(model.nx))[:, 0]
    return float(np.sqrt(np.mean((yhat[TRANSIENT:] - y[TRANSIENT:]) ** 2)))


def fit(model, data, theta0, acceleration: str, time_limit: float, tol: float = 1e-9) -> tuple[dict, object]:
    t0, c0 = time.perf_counter(), time.process_time()
    res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(max_iters=10_000, tol=tol, acceleration=acceleration,
                                                            time_limit=time_limit))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    last = res.history[-1] if res.history else None
    rel = float("nan") if last is None else abs(last.increase) / max(1.0, abs(last.objective))
    kinds = [r.kind for r in res.history]
    return {"acceleration": acceleration, "status": str(res.status), "iterations": res.iterations, "wall_s": wall,
            "cpu_s": cpu,
            "build_s": res.build_s, "final_rel_change_J": rel, "J": res.J,
            "kinds": {k: kinds.count(k) for k in sorted(set(kinds))},
            "em_s": sum(r.smooth_s + r.learn_s for r in res.history if r.kind == "em"),
            "accel_s": sum(r.learn_s for r in res.history if r.kind != "em")}, res


def diagnose(model, data, result) -> dict:
    """Conditioning at the final iterate (see the module docstring)."""
    from ceem_casadi.workflow.assessment._uncertainty import reduced_hessian
    from ceem_casadi.workflow.assessment._uncertainty_options import UncertaintyOptions

    theta_vec = model.params.to_vector(result.theta)
    learner = cc.learning.Learner(model, data.lengths)
    H_learn = learner.hessian_matrix(theta_vec, data, result.x)
    I_ex = reduced_hessian(model, data, theta_vec, result.x, UncertaintyOptions(hessian="exact"))
    I_gn = reduced_hessian(model, data, theta_vec, result.x, UncertaintyOptions(hessian="gauss-newton"))
    # plain EM (block coordinate ascent) near the fixed point: theta error contracts by
    # I - H_learn^{-1} I_ex per iteration; Gauss-Newton on the reduced problem by I - I_gn^{-1} I_ex
    rate_em = float(np.max(np.abs(np.linalg.eigvals(np.eye(len(I_ex)) - np.linalg.solve(H_learn, I_ex)))))
    rate_gn = float(np.max(np.abs(np.linalg.eigvals(np.eye(len(I_ex)) - np.linalg.solve(I_gn, I_ex)))))
    # (the damping before issue 24, item 3, kept as a diagnosis:) the "newton" acceleration's
    # Levenberg-Marquardt damping mu * diag(Hpp) is scaled by the JOINT
    # Hessian's parameter block, but the curvature left in theta is the reduced I: in the worst
    # direction one LM step takes this fraction of the Newton step (at mu = 1e-6)
    D = np.diag(np.diag(H_learn))
    lm_fraction = float(np.min(np.real(np.linalg.eigvals(np.linalg.solve(I_gn + 1e-6 * D, I_gn)))))
    return {"cond_joint_gauss_newton": _cond_joint(model, data, theta_vec, result.x),
            "lm_step_fraction_mu_1e-6": lm_fraction,"cond_learning_hessian": float(np.linalg.cond(H_learn)), "cond_reduced_exact": float(np.linalg.cond(I_ex)),
            "cond_reduced_gauss_newton": float(np.linalg.cond(I_gn)), "em_rate": rate_em,
            "gauss_newton_rate": rate_gn}


def _cond_joint(model, data, theta_vec, xs) -> float:
    """2-norm condition number of the joint Gauss-Newton Hessian (all states and free parameters),
    from its extreme eigenvalues (scipy eigsh; shift-invert at 0 for the smallest)."""
    from scipy.sparse import csc_matrix, triu
    from scipy.sparse.linalg import LinearOperator, eigsh, splu

    from ceem_casadi.em._joint_nlp import JointSolver

    solver = JointSolver(model, data, cc.smoothing.Smoother(model).stages, hessian="gauss-newton")
    w = np.concatenate([x.ravel() for x in xs] + [theta_vec[model.params.free_index]])
    _, _, vals = solver.evaluator.at(w, theta_vec)
    sp = solver.sparsity
    n = sp.size1()
    upper = csc_matrix((vals, np.asarray(sp.row()), np.asarray(sp.colind())), shape=(n, n))
    H = upper + triu(upper, 1).T
    big = eigsh(H, k=1, which="LA", return_eigenvectors=False)[0]
    # shift-invert at 0 with an LU in the natural order: the parameters come last, so the factors keep
    # the arrowhead pattern (a fill-reducing ordering filled it: 22 GB at 120,000 variables, killed)
    lu = splu(H.tocsc(), permc_spec="NATURAL", diag_pivot_thresh=0.0)
    inverse = LinearOperator(H.shape, matvec=lu.solve, dtype=float)
    small = eigsh(H, k=1, sigma=0.0, which="LM", OPinv=inverse, return_eigenvectors=False)[0]
    return float(big / small)


DIAGNOSIS = ("cond_joint_gauss_newton", "cond_learning_hessian", "cond_reduced_exact", "cond_reduced_gauss_newton",
             "em_rate", "gauss_newton_rate", "lm_step_fraction_mu_1e-6")
PROBLEMS = {"segments": 10, "one_piece": 1}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results to this JSON file")
    ap.add_argument("--smoke", action="store_true", help=f"tiny version ({N_SMOKE} samples) for the tests")
    ap.add_argument("--problems", default="segments,one_piece")
    ap.add_argument("--accelerations", default="newton,joint")
    ap.add_argument("--time-limit", type=float, default=300.0, help="per fit (s)")
    ap.add_argument("--diagnose", action="store_true")
    args = ap.parse_args(argv)
    n_train = N_SMOKE if args.smoke else N_TRAIN
    rows = []
    for name in args.problems.split(","):
        n_seg = PROBLEMS[name] if not args.smoke else min(PROBLEMS[name], 2)
        model, truth, data, theta0, test = make_problem(n_train, n_seg)
        rms_true = float(np.sqrt(np.mean(test[1][TRANSIENT:] ** 2)))
        for acc in args.accelerations.split(","):
            row, res = fit(model, data, theta0, acc, args.time_limit)
            row.update(problem=name, segments=n_seg, samples=n_train, test_rms=test_rms(model, res.theta, test),
                       test_rms_initial=test_rms(model, theta0, test), test_output_rms=rms_true)
            if args.diagnose:
                row.update(diagnose(model, data, res))
            rows.append(row)
            print(f"{name:10s} {acc:8s} {row['status']:10s} iterations {row['iterations']:4d} ({row['kinds']}) "
                  f"{row['wall_s']:7.1f} s (CPU {row['cpu_s']:6.1f} s)  final rel. change of J "
                  f"{row['final_rel_change_J']:.1e}  test RMS {row['test_rms']:.3e} "
                  f"(theta0 {row['test_rms_initial']:.3e})", flush=True)
            if args.diagnose:
                print("    " + ", ".join(f"{k} {row[k]:.3g}" for k in DIAGNOSIS), flush=True)
            if args.json:  # after every row: a long run killed half-way keeps what it measured
                with open(args.json, "w") as fh:
                    json.dump({"rows": rows, "smoke": args.smoke, "time_limit": args.time_limit}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
