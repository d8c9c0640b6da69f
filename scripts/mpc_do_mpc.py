"""Nonlinear MPC of the Cascaded Tanks with do-mpc on the identified model (``pip install "ceem_casadi[control]"``).

The loop of `scripts/mpc_cascaded_tanks.py` (identification on the real estimation data, perturbed plant drawn from
the parameter uncertainty, EKF with an integrating output disturbance ``d``), with the controller built by do-mpc
instead of CasADi Opti: `ceem_casadi.deploy.to_do_mpc` turns the identified model into a discrete-time
``do_mpc.model.Model`` (parameters baked in), the reference ``r`` and the disturbance estimate ``d`` are
time-varying parameters, and the objective is the Opti controller's:

    min sum_{k<N} (g(f(x_k, u_k)) + d - r_k)^2 + lambda sum_{k<N} (u_k - u_{k-1})^2,   0 <= u <= 10 V

(do-mpc's ``lterm`` at step k sees ``x_k`` and ``u_k``, so the output at ``x_{k+1} = f(x_k, u_k)`` is written into
it; ``set_rterm`` is the move penalty with ``u_{-1}`` the previous input). IPOPT, exact Hessian, tol 1e-8;
do-mpc warm-starts from its previous solution (not shifted).

Run: ``python -m scripts.mpc_do_mpc [--smoke] [--json out.json] [--out DIR]``.
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

from ceem_casadi.deploy import to_do_mpc
from ceem_casadi.deploy._do_mpc import import_do_mpc
from ceem_casadi.io._datasets import DatasetNotFoundError
from models.cascaded_tanks import steady_upper_level
from scripts.mpc_cascaded_tanks import U_MAX, U_MIN, draw_plant_theta, identify, metrics, plot
from scripts.mpc_cascaded_tanks import closed_loop as opti_closed_loop

logger = logging.getLogger(__name__)


class DoMPC:
    """Tracking NMPC built by do-mpc on the identified model (same problem as `scripts.mpc_cascaded_tanks.MPC`)."""

    def __init__(self, model, theta, N: int, du_weight: float, max_iter: int = 100):
        do_mpc = import_do_mpc()
        m = to_do_mpc(model, theta, setup=False)
        m.set_variable("_tvp", "r")
        m.set_variable("_tvp", "d")
        m.setup()
        x, u, r, d = m.x["x"], m.u["u"], m.tvp["r"], m.tvp["d"]      # the symbols after setup
        p = ca.DM(model.theta_vector(theta))
        y_next = model.g(model.f(x, u, p), u, p)
        mpc = do_mpc.controller.MPC(m)
        mpc.set_param(n_horizon=N, t_step=float(model.dt), store_full_solution=False,
                      nlpsol_opts={"ipopt.tol": 1e-8, "ipopt.max_iter": max_iter, "print_time": False,
                                   "ipopt.print_level": 0, "ipopt.sb": "yes",
                                   "ipopt.honor_original_bounds": "yes"})
        mpc.set_objective(lterm=(y_next + d - r) ** 2, mterm=ca.DM(0.0))
        mpc.set_rterm(u=du_weight)
        mpc.bounds["lower", "_u", "u"] = U_MIN
        mpc.bounds["upper", "_u", "u"] = U_MAX
        self._tvp = mpc.get_tvp_template()
        mpc.set_tvp_fun(lambda t_now: self._tvp)
        mpc.setup()
        self.mpc, self.N, self.first = mpc, N, True

    def solve(self, x_hat, d_hat, r, u_prev):
        """The first move for state ``x_hat`` (2,), disturbance ``d_hat``, reference ``r`` (N,), previous input."""
        for k in range(self.N + 1):
            self._tvp["_tvp", k, "r"] = r[min(k, self.N - 1)]
            self._tvp["_tvp", k, "d"] = d_hat
        mpc = self.mpc
        mpc.u0 = np.array([[u_prev]])
        if self.first:
            mpc.x0 = np.asarray(x_hat, float).reshape(-1, 1)
            mpc.set_initial_guess()
            self.first = False
        t0 = time.perf_counter()
        u = mpc.make_step(np.asarray(x_hat, float).reshape(-1, 1))
        return float(u[0, 0]), mpc.solver_stats["return_status"], time.perf_counter() - t0


def closed_loop(model, theta, theta_plant, x_start, T: int, N: int, rng, *, du_weight: float, smoke: bool,
                d_std: float = 0.01):
    """The loop of `scripts.mpc_cascaded_tanks.closed_loop` with the do-mpc controller."""
    vec = model.theta_vector(theta)
    x, uu = ca.SX.sym("x", 2), ca.SX.sym("u", 1)
    F = ca.Function("F", [x, uu], [model.f(x, uu, vec)])
    G = ca.Function("G", [x, uu], [model.g(x, uu, vec)])
    return opti_closed_loop(F, G, model, theta_plant, x_start, T, N, rng, du_weight=du_weight, smoke=smoke,
                            d_std=d_std, controller=DoMPC(model, theta, N, du_weight))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--out", default="results/mpc_do_mpc")
    ap.add_argument("--json", help="write the results as JSON to this file")
    ap.add_argument("--smoke", action="store_true", help="no CE-EM (refinement only), 80 samples, horizon 15")
    ap.add_argument("--steps", type=int, default=600, help="closed-loop samples (4 s each)")
    ap.add_argument("--horizon", type=int, default=30, help="MPC horizon (samples)")
    ap.add_argument("--du-weight", type=float, default=0.05)
    ap.add_argument("--ceem-iters", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.horizon, args.ceem_iters = 80, 15, 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    model, theta, _, unc, ident = identify(args.data_dir, ceem_iters=args.ceem_iters)
    theta_plant = draw_plant_theta(model, theta, unc, rng)
    h2 = 3.0
    x_start = np.array([float(steady_upper_level(theta_plant, h2)), h2])
    t0 = time.perf_counter()
    run = closed_loop(model, theta, theta_plant, x_start, args.steps, args.horizon, rng, du_weight=args.du_weight,
                      smoke=args.smoke)
    res = {"args": vars(args), "identification": ident, "theta": {k: float(v) for k, v in theta.items()},
           "loop_seconds": time.perf_counter() - t0, **metrics(run, args.horizon),
           "u": run["u"].tolist(), "r": run["r"].tolist(), "y_true": run["y_true"].tolist()}
    plot(out / "mpc_do_mpc.png", run, model.dt)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    print(json.dumps({k: v for k, v in res.items() if k not in ("u", "r", "y_true", "args")}, indent=1))
    return res


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        main()
    except (DatasetNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
