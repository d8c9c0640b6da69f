"""Run the authors' published CE-EM implementation (PyPI ``ceem`` 0.0.4, PyTorch) on a problem
written by ``scripts/bench_lorenz.py --peer``.

This file runs INSIDE the peer's own virtual environment (torch, ceem 0.0.4, numpy<2,
scipy<1.11), never in ceem_casadi's: it imports neither ceem_casadi nor models/.

    <peer-venv>/bin/python scripts/peer_ceem_runner.py IN.npz OUT.json

IN.npz holds the problem in ceem_casadi's state ordering (attractor k at x[3k:3k+3]):
``y`` (B, T, ny), ``C`` (ny, n), ``x_init`` (B, T, n) initial state trajectories, ``sigma0``,
``rho0``, ``beta0`` (K,), ``H0`` (n, n), ``H_free`` (n, n) bool, ``x_eps`` (S, n) sample points
and ``f_true`` (S, n) the true vector field there (for the paper's eps), ``dt``,
``sigma_v``, ``sigma_w``, ``time_limit``, ``max_epochs``, ``eps_target`` (NaN: none).

The peer is configured as in the authors' experiment scripts (experiments/lorenz in their
repository): Gauss-Newton smoothing by scipy ``least_squares`` (trf) with a soft trust region
(0.001 single, 0.01 coupled), learning by Nelder-Mead with trust region 0.01 (single Lorenz)
or torch L-BFGS (coupled), trajectories smoothed in ``min(2, B)`` joblib processes for the
coupled problems. Two adaptations make it the same model as ceem_casadi's: RK4 (their single
attractor defaults to the midpoint rule) and a gradient mask keeping H's fixed entries fixed
(their script learns every entry of H). Criterion weights are 1 for the observations and
(sigma_v / sigma_w)^2 for the dynamics: the same objective as ceem_casadi's up to the factor
sigma_v^2. The peer's coupled-system state ordering is (x_1..x_K, y_1..y_K, z_1..z_K); states
and matrices are permuted on the way in and out.

Writes JSON: ``trace`` (per epoch: ``epoch``, ``t_s`` since the start of training, ``eps``,
``theta`` in ceem_casadi's ordering), ``wall_s``, ``epochs``, ``stop_reason``, versions.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch
from ceem import logger  # noqa: F401  (ceem's package import order needs it first)
from ceem.ceem import CEEM
from ceem.opt_criteria import GaussianDynamicsCriterion, GaussianObservationCriterion, GroupSOSCriterion
from ceem.systems import LorenzAttractor, LorenzSystem
from torch.nn.utils import parameters_to_vector


def peer_permutation(K: int) -> np.ndarray:
    """perm such that x_peer = x_ours[..., perm] (peer index c*K + k <- ours 3k + c)."""
    return np.array([3 * k + c for c in range(3) for k in range(K)])


def main(argv) -> int:
    src, dst = argv
    d = dict(np.load(src))
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    y, C, x_init = d["y"], d["C"], d["x_init"]
    B, T, ny = y.shape
    n = C.shape[1]
    K = n // 3
    single = K == 1
    perm = np.arange(3) if single else peer_permutation(K)
    inv = np.argsort(perm)
    dt = float(d["dt"])
    Ct = torch.tensor(C[:, perm])
    if single:
        system = LorenzAttractor(torch.tensor(d["sigma0"]), torch.tensor(d["rho0"]), torch.tensor(d["beta0"]),
                                 Ct, dt, method="rk4")
    else:
        H0 = d["H0"][np.ix_(perm, perm)]
        system = LorenzSystem(torch.tensor(d["sigma0"]), torch.tensor(d["rho0"]), torch.tensor(d["beta0"]),
                              torch.tensor(H0), Ct, dt, method="rk4")
        mask = torch.tensor(d["H_free"][np.ix_(perm, perm)].astype(float)).view(1, 1, n, n)
        system._H.register_hook(lambda g: g * mask)

    t = torch.arange(T, dtype=torch.float64).unsqueeze(0).repeat(B, 1)
    yt = torch.tensor(y)
    w_dyn = (float(d["sigma_v"]) / float(d["sigma_w"])) ** 2
    smoothing = [GroupSOSCriterion([GaussianObservationCriterion(torch.ones(ny), t[b:b + 1], yt[b:b + 1]),
                                    GaussianDynamicsCriterion(w_dyn * torch.ones(n), t[b:b + 1])])
                 for b in range(B)]
    learning = [GaussianDynamicsCriterion(torch.ones(n), t)]
    params = list(system.parameters())
    if single:
        smooth_kwargs = {"verbose": 0, "tr_rho": 0.001}
        learn_opts, learn_kwargs, parallel = ["scipy_minimize"], {"method": "Nelder-Mead", "tr_rho": 0.01}, 0
    else:
        smooth_kwargs = {"verbose": 0, "tr_rho": 0.01}
        learn_opts, learn_kwargs, parallel = ["torch_minimize"], {"method": "LBFGS"}, min(2, B)

    x_eps = torch.tensor(np.ascontiguousarray(d["x_eps"][:, perm])).unsqueeze(1)
    f_true = d["f_true"]
    time_limit, max_epochs = float(d["time_limit"]), int(d["max_epochs"])
    eps_target = float(d["eps_target"])

    def theta_ours() -> dict:
        with torch.no_grad():
            if single:
                return {"sigma": float(system._sigma), "rho": float(system._rho), "beta": float(system._beta)}
            H = system._H.detach().numpy().reshape(n, n)[np.ix_(inv, inv)]
            return {"sigma": system._sigmas.detach().numpy().ravel().tolist(),
                    "rho": system._rhos.detach().numpy().ravel().tolist(),
                    "beta": system._betas.detach().numpy().ravel().tolist(), "H": H.tolist()}

    def eps() -> float:
        with torch.no_grad():
            f = system.step_derivs(torch.zeros(x_eps.shape[0], 1), x_eps).squeeze(1).numpy()[:, inv]
        return float(np.mean(np.linalg.norm(f - f_true, axis=1)))

    trace, state = [], {"start": None, "reason": "max_epochs", "errs": [], "instrument": 0.0}

    def on_epoch(epoch):  # the time spent here (eps, theta copies) is not counted as the peer's
        t_in = time.perf_counter()
        trace.append({"epoch": epoch + 1, "t_s": t_in - state["start"] - state["instrument"], "eps": eps(),
                      "theta": theta_ours()})
        state["instrument"] += time.perf_counter() - t_in

    def terminate(epoch) -> bool:
        last = trace[-1]
        if np.isfinite(eps_target) and last["eps"] < eps_target:
            state["reason"] = "eps_target"
            return True
        if last["t_s"] > time_limit:
            state["reason"] = "time_limit"
            return True
        # the authors' own stopping rule: parameters stop moving over the last 10 epochs
        state["errs"].append(float(parameters_to_vector(params).detach().norm()))
        recent = state["errs"][-10:]
        if len(recent) == 10 and max(recent) - min(recent) < 1e-4:
            state["reason"] = "converged"
            return True
        return False

    ceem = CEEM(smoothing, learning, [params], learn_opts, [on_epoch], terminate, parallel=parallel)
    xs0 = torch.tensor(np.ascontiguousarray(x_init[..., perm]))
    state["start"] = time.perf_counter()
    ceem.train(xs=xs0, sys=system, nepochs=max_epochs, smooth_solver_kwargs=smooth_kwargs,
               learner_opt_kwargs=learn_kwargs)
    wall = time.perf_counter() - state["start"] - state["instrument"]
    with open(dst, "w") as fh:
        json.dump({"trace": trace, "wall_s": wall, "epochs": len(trace), "stop_reason": state["reason"],
                   "torch": torch.__version__, "numpy": np.__version__}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
