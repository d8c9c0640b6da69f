"""Nonlinear MPC of the Cascaded Tanks on the identified model: identify, export, control.

1. **Identify** the gray-box tanks model (`models.cascaded_tanks`, Torricelli structure) on the
   estimation split of the real benchmark data (`cc.load_cascaded_tanks`) with the pipeline of
   `scripts/cascaded_tanks.py`: N4SID initial guess, CE-EM (skipped by `--smoke`), output-error
   refinement; then the parameters' covariance (`cc.parameter_uncertainty`).
2. **Export** it with `ceem_casadi.export_casadi` and load the Functions `F`, `G` back with
   CasADi alone (`casadi.Function.load`): the controller and the estimator use only these files.
3. **Plant**: the identified model with parameters drawn from their uncertainty (Gaussian with the
   covariance of step 1, clipped to the bounds; parameters at a bound stay there), process noise
   of the model's `process_std` and sensor noise of its `measurement_std`, seeded.
4. **Estimator**: the EKF of `ceem_casadi.filtering` on the exported model with an integrating
   output disturbance ``d`` (state ``(h1, h2, d)``, ``y = G(h) + d``): it estimates the hidden upper
   level from the measured lower level, and ``d`` makes the controller offset-free against the
   plant/model mismatch.
5. **Controller**: nonlinear MPC in CasADi `Opti` (IPOPT, exact Hessian, warm-started from the
   shifted previous solution): ``min sum_k (G(x_k) + d - r_k)^2 + lambda (u_k - u_{k-1})^2`` over
   N steps, ``x_{k+1} = F(x_k, u_k)``, ``0 <= u <= 10`` V.

Reported: tracking RMS of the noise-free plant output against the reference (all samples, and
after each reference step's settling window), input-bound violations (must be 0), solve time per
step (median, max), the EKF's upper-level error; a figure.

Run: ``python -m scripts.mpc_cascaded_tanks [--smoke] [--json out.json] [--out DIR]``.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import casadi as ca
import numpy as np

import ceem_casadi as cc
from ceem_casadi import export_casadi
from ceem_casadi.baselines._n4sid import n4sid
from ceem_casadi.filtering import EKF
from ceem_casadi.io._datasets import DatasetNotFoundError
from models.cascaded_tanks import cascaded_tanks, initial_theta, steady_upper_level

logger = logging.getLogger(__name__)

U_MIN, U_MAX = 0.0, 10.0  # V, pump voltage bounds
SETTLE = 60  # samples after a reference step left out of the settled RMS (240 s)


def identify(data_dir=None, *, ceem_iters: int = 40, process_std: float = 0.01, measurement_std: float = 0.05):
    """(model, theta, x0_est, uncertainty, info): the tanks model identified on the estimation split.

    ``ceem_iters = 0`` skips CE-EM (the refinement starts from the N4SID-based guess)."""
    t0 = time.perf_counter()
    est = cc.load_cascaded_tanks(data_dir)["estimation"]
    lin = n4sid(est.data, order=2, horizon=10)
    model = cascaded_tanks(initial_theta(est, lin), process_std=process_std, measurement_std=measurement_std)
    theta = model.params.initial()
    x0 = np.array([steady_upper_level(theta, est.y[0, 0]), est.y[0, 0]])
    info = {}
    if ceem_iters > 0:
        res = cc.ceem(model, est.data, theta, options=cc.CEEMOptions(max_iters=ceem_iters))
        theta, x0 = res.theta, res.x[0][0]
        info["ceem"] = {"status": str(res.status), "iterations": len(res.history)}
    rf = cc.refine_output_error(model, est.data, theta, x0=x0, options=cc.OutputErrorOptions(
        max_iters=200, x_lower=0.0, x_upper=20.0))
    info["refine"] = {"status": str(rf.status), "iterations": rf.iterations}
    y_sim = cc.simulate_output(model, rf.theta, est.u, rf.x0[0])
    info["estimation_rms"] = float(np.sqrt(np.mean((y_sim - est.y) ** 2)))
    unc = cc.parameter_uncertainty(model, est.data, rf.theta)
    info["seconds"] = time.perf_counter() - t0
    return model, rf.theta, rf.x0[0], unc, info


def draw_plant_theta(model, theta, unc, rng) -> dict:
    """Parameters drawn from N(theta, covariance of `unc`) (free entries with a finite interval), clipped to bounds."""
    vec = model.theta_vector(theta)
    cov = np.where(np.isfinite(unc.covariance), unc.covariance, 0.0)
    ok = np.isfinite(unc.std_error)
    cov = cov * np.outer(ok, ok)
    w, V = np.linalg.eigh(0.5 * (cov + cov.T))
    z = V @ (np.sqrt(np.maximum(w, 0.0)) * rng.standard_normal(w.size))
    vec[unc.index] += z
    vec = np.clip(vec, model.params.lower, model.params.upper)
    return model.params.from_vector(vec)


def reference(T: int, smoke: bool) -> np.ndarray:
    """Lower-tank level reference (T,) in sensor volts: steps between 4 and 8 V every T/4 samples (smoke: one step)."""
    levels = [5.0, 7.0] if smoke else [5.0, 7.5, 4.0, 6.5]
    k = int(np.ceil(T / len(levels)))
    return np.repeat(levels, k)[:T]


class Estimator:
    """EKF (ceem_casadi.filtering) of the exported model with an integrating output disturbance."""

    def __init__(self, F, G, process_std, measurement_std, d_std: float):
        aug = cc.StateSpaceModel.from_discrete(lambda x, u, p: ca.vertcat(F(x[:2], u), x[2]),
                                               lambda x, u, p: G(x[:2], u) + x[2], nx=3, nu=1,
                                               name="tanks_with_disturbance")
        self.model, self.ekf = aug, EKF(aug)
        self.Q = np.r_[np.asarray(process_std, float) ** 2, d_std ** 2]
        self.R = float(np.asarray(measurement_std).ravel()[0]) ** 2
        x, u = ca.SX.sym("x", 3), ca.SX.sym("u", 1)
        xn = aug.f(x, u, ca.DM.zeros(0))
        self.jac = ca.Function("fj", [x, u], [xn, ca.jacobian(xn, x)])

    def correct(self, x_pred, P_pred, y, u):
        res = self.ekf.run(np.zeros(0), np.atleast_2d(y), np.atleast_2d(u), x0=x_pred, Sigma0=P_pred, Q=self.Q,
                           R=self.R)
        return res.x_filt[0], res.P_filt[0]

    def predict(self, x, P, u):
        xn, A = self.jac(x, u)
        A = np.asarray(A)
        return np.asarray(xn).ravel(), A @ P @ A.T + np.diag(self.Q)


class MPC:
    """Tracking NMPC in CasADi Opti on the exported Functions F, G (IPOPT, warm-started)."""

    def __init__(self, F, G, N: int, du_weight: float, max_iter: int = 100):
        opti = ca.Opti()
        self.X, self.U = opti.variable(2, N + 1), opti.variable(1, N)
        self.x0, self.d, self.r, self.u_prev = opti.parameter(2), opti.parameter(), opti.parameter(N), opti.parameter()
        cost = 0
        for k in range(N):
            opti.subject_to(self.X[:, k + 1] == F(self.X[:, k], self.U[:, k]))
            cost += (G(self.X[:, k + 1], self.U[:, k]) + self.d - self.r[k]) ** 2
            du = self.U[:, k] - (self.u_prev if k == 0 else self.U[:, k - 1])
            cost += du_weight * du ** 2
        opti.subject_to(self.X[:, 0] == self.x0)
        opti.subject_to(opti.bounded(U_MIN, self.U, U_MAX))
        opti.minimize(cost)
        opti.solver("ipopt", {"print_time": False, "detect_simple_bounds": True}, {"honor_original_bounds": "yes", "print_level": 0, "sb": "yes", "max_iter": max_iter,
                                                       "tol": 1e-8, "warm_start_init_point": "yes"})
        self.opti, self.N, self.F = opti, N, F
        self.last = None

    def solve(self, x_hat, d_hat, r, u_prev):
        o = self.opti
        o.set_value(self.x0, x_hat)
        o.set_value(self.d, d_hat)
        o.set_value(self.r, r)
        o.set_value(self.u_prev, u_prev)
        if self.last is None:
            U0 = np.full(self.N, u_prev)
            X0 = np.zeros((2, self.N + 1))
            X0[:, 0] = x_hat
            for k in range(self.N):
                X0[:, k + 1] = np.asarray(self.F(X0[:, k], U0[k])).ravel()
            o.set_initial(self.U, U0)
            o.set_initial(self.X, X0)
        else:  # shifted previous solution (states, inputs and multipliers)
            Xs, Us, lam = self.last
            o.set_initial(self.X, np.column_stack([x_hat, Xs[:, 2:], Xs[:, -1]]))
            o.set_initial(self.U, np.r_[Us[1:], Us[-1]])
            o.set_initial(o.lam_g, lam)
        t0 = time.perf_counter()
        try:
            sol = o.solve()
            status = sol.stats()["return_status"]
            Xs, Us, lam = sol.value(self.X), np.atleast_1d(sol.value(self.U)), sol.value(o.lam_g)
        except RuntimeError:  # IPOPT did not converge: use its last iterate, report the failure
            status = o.stats()["return_status"]
            Xs, Us, lam = o.debug.value(self.X), np.atleast_1d(o.debug.value(self.U)), o.debug.value(o.lam_g)
        seconds = time.perf_counter() - t0
        self.last = (Xs, Us, lam)
        return float(Us[0]), status, seconds


def closed_loop(F, G, model, theta_plant, x_start, T: int, N: int, rng, *, du_weight: float, smoke: bool,
                d_std: float = 0.01, controller=None):
    """Run T samples of the loop; returns a dict of arrays (y, y_true, x, x_hat, u, r) and per-step solver stats.
    ``controller``: an object with ``solve(x_hat (2,), d_hat, r (N,), u_prev) -> (u, status, seconds)``
    (default this script's Opti `MPC`; `scripts.mpc_do_mpc` passes its do-mpc controller)."""
    plant_vec = model.theta_vector(theta_plant)
    w_std, v_std = model.noise.process_std, float(model.noise.measurement_std[0])
    est = Estimator(F, G, w_std, v_std, d_std)
    mpc = MPC(F, G, N, du_weight) if controller is None else controller
    r = reference(T + N, smoke)
    x = np.array(x_start, float)
    x_pred, P_pred = np.r_[x_start[1] * 0.8, x_start[1], 0.0], np.diag([4.0, 0.1, 0.1])  # h1 unknown a priori
    u_prev = 0.0
    rec = {k: [] for k in ("y", "y_true", "x", "x_hat", "u", "status", "seconds")}
    for t in range(T):
        y_true = float(np.asarray(model.g(x, u_prev, plant_vec)).ravel()[0])
        y = y_true + v_std * rng.standard_normal()
        x_hat, P = est.correct(x_pred, P_pred, y, u_prev)
        u, status, sec = mpc.solve(x_hat[:2], x_hat[2], r[t + 1:t + 1 + N], u_prev)
        for k, v in (("y", y), ("y_true", y_true), ("x", x.copy()), ("x_hat", x_hat.copy()), ("u", u),
                     ("status", status), ("seconds", sec)):
            rec[k].append(v)
        x = np.asarray(model.f(x, u, plant_vec)).ravel() + w_std * rng.standard_normal(2)
        x = np.maximum(x, 0.0)  # levels are not negative
        x_pred, P_pred = est.predict(x_hat, P, u)
        u_prev = u
    out = {k: np.asarray(v) if k != "status" else v for k, v in rec.items()}
    out["r"] = r[:T]
    return out


def metrics(run: dict, horizon: int) -> dict:
    """Tracking, bounds, solver and estimator figures of a closed-loop run. "Settled" leaves out the
    ``horizon`` samples before each reference step (the controller sees it coming and moves early) and
    the ``SETTLE`` samples after it."""
    e = run["y_true"] - run["r"]
    steps = np.r_[0, np.flatnonzero(np.diff(run["r"])) + 1]
    settled = np.ones(e.size, bool)
    for s in steps:
        settled[max(0, s - horizon):s + SETTLE] = False
    u = run["u"]
    sec = run["seconds"]
    return {
        "tracking_rms": float(np.sqrt(np.mean(e ** 2))),
        "tracking_rms_settled": float(np.sqrt(np.mean(e[settled] ** 2))) if settled.any() else float("nan"),
        "settled_samples": int(settled.sum()),
        "input_bound_violations": int(np.sum((u < U_MIN - 1e-9) | (u > U_MAX + 1e-9))),
        "max_bound_violation": float(max(0.0, np.max(U_MIN - u), np.max(u - U_MAX))),
        "final_error_rms_last20": float(np.sqrt(np.mean(e[-20:] ** 2))),
        "solve_seconds_median": float(np.median(sec)), "solve_seconds_max": float(np.max(sec)),
        "solver_not_converged": int(sum(s not in ("Solve_Succeeded", "Solved_To_Acceptable_Level")
                                        for s in run["status"])),
        "upper_level_estimate_rms": float(np.sqrt(np.mean((run["x_hat"][:, 0] - run["x"][:, 0]) ** 2))),
        "upper_level_estimate_rms_after_60": float(np.sqrt(np.mean((run["x_hat"][60:, 0] - run["x"][60:, 0]) ** 2)))
        if len(u) > 60 else float("nan"),
    }


def plot(path, run, dt):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.arange(len(run["u"])) * dt
    fig, ax = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    ax[0].plot(t, run["y"], ".", ms=2, color="0.6", label="measured y")
    ax[0].plot(t, run["y_true"], "k", lw=1.2, label="plant output (noise-free)")
    ax[0].plot(t, run["r"], "r--", lw=1, label="reference")
    ax[0].set_ylabel("lower tank [V]")
    ax[1].plot(t, run["x"][:, 0], "k", lw=1.2, label="plant upper level (hidden)")
    ax[1].plot(t, run["x_hat"][:, 0], "b--", lw=1, label="EKF estimate")
    ax[1].set_ylabel("upper tank [V]")
    ax[2].step(t, run["u"], "g", where="post", lw=1)
    ax[2].axhline(U_MIN, color="0.5", ls=":")
    ax[2].axhline(U_MAX, color="0.5", ls=":")
    ax[2].set_ylabel("pump [V]")
    ax[2].set_xlabel("time [s]")
    for a in ax[:2]:
        a.legend(fontsize=8)
    ax[0].set_title("NMPC (CasADi Opti + IPOPT) on the identified Cascaded Tanks model, perturbed plant")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default="results/mpc_cascaded_tanks")
    ap.add_argument("--json", help="write the results as JSON to this file")
    ap.add_argument("--smoke", action="store_true", help="no CE-EM (refinement only), 80 samples, horizon 15")
    ap.add_argument("--steps", type=int, default=600, help="closed-loop samples (4 s each)")
    ap.add_argument("--horizon", type=int, default=30, help="MPC horizon (samples)")
    ap.add_argument("--du-weight", type=float, default=0.05, help="weight of (u_k - u_{k-1})^2, V^2 per V^2")
    ap.add_argument("--ceem-iters", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.horizon, args.ceem_iters = 80, 15, 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)

    model, theta, x0_est, unc, ident = identify(args.data_dir, ceem_iters=args.ceem_iters)
    logger.info("identified: %s", ident)
    exported = export_casadi(model, theta, out / "export")
    F = ca.Function.load(str(exported.files["F"]))
    G = ca.Function.load(str(exported.files["G"]))
    theta_plant = draw_plant_theta(model, theta, unc, rng)
    h2 = 3.0
    x_start = np.array([float(steady_upper_level(theta_plant, h2)), h2])
    t0 = time.perf_counter()
    run = closed_loop(F, G, model, theta_plant, x_start, args.steps, args.horizon, rng, du_weight=args.du_weight,
                      smoke=args.smoke)
    res = {"args": vars(args), "identification": ident,
           "theta": {k: float(v) for k, v in theta.items()},
           "theta_plant": {k: float(v) for k, v in theta_plant.items()},
           "export": exported.to_dict(), "loop_seconds": time.perf_counter() - t0, **metrics(run, args.horizon),
           "u": run["u"].tolist(), "r": run["r"].tolist(), "y_true": run["y_true"].tolist()}
    plot(out / "mpc_cascaded_tanks.png", run, model.dt)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    print(json.dumps({k: v for k, v in res.items() if k not in ("u", "r", "y_true", "export", "args")}, indent=1))
    return res


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        main()
    except DatasetNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
