"""Helicopter experiment of paper §4.2 end to end: naive, H25, SID, NL via CE-EM, EKF evaluation.

Data: a converted ``.npz`` (``scripts/heli_convert.py``) or a ``split_normalized`` folder
(``--data``); without ``--data`` a SYNTHETIC stand-in (``scripts/heli_standin.py``) is generated
and every output is labelled synthetic.

Models (normalised units; the paper's appendix):
- naive: MLP 10 -> 8 x 32 tanh -> 6 on u_t; H25: the same on u_{t-24:t} (250 inputs); Adam with
  harmonic decay, mini-batch 512 (CasADi gradients, `ceem_casadi.model._nn`).
- SID: N4SID (nx = 10) on the naive model's residuals, on ``--sid-subsets`` random subsets of
  ``--sid-size`` training trajectories (paper: 10 x 100); reported as the distribution.
- NL: x+ = A x + B u, y~ = C x + D u + MLP(x, u) (2 x 32 tanh) fitted by CE-EM with
  sigma_w = sigma_v = 1, rho_x = rho_theta = 0.5, warm-started from the SID fit with the best
  validation RMSE. Learning step (``--nl-learner``): ``adam`` (default, as the paper: mini-batch
  Adam, lr 5e-4 dynamics / 1e-3 observation, `ceem_casadi.learning._adam`) or ``ipopt`` (the
  generic learner with a limited-memory Hessian; too slow at the full size).
- LSTM: 2 layers of 32 on the naive residuals with input u (the authors' code): trained on
  windows of 25 steps with zero initial state (Adam on CasADi gradients, loss over all steps of
  a window); the prediction at t is the last output of the window ending at t.
Evaluation as in the paper: the residual of SID/NL is predicted one step ahead by an EKF with
x_0 = 0, Sigma_0 = Q = R = I (prediction before the correction with the measured residual);
the first 25 steps are dropped; RMSE per test trajectory over all 6 outputs, un-normalised.

Run: ``python -m scripts.heli_pipeline --data heli.npz --out results/heli_pipeline``.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from ceem_casadi.baselines._n4sid import n4sid
from ceem_casadi.em._ceem import ceem
from ceem_casadi.em._options import CEEMOptions
from ceem_casadi.em._progress import Progress, chain
from ceem_casadi.filtering import EKF
from ceem_casadi.io._data import Trajectories
from ceem_casadi.learning import AdamLearner, AdamOptions
from ceem_casadi.learning._options import LearnerOptions
from ceem_casadi.model._nn import MLP, adam, flat_params, mse_loss_factory, namespace
from ceem_casadi.model._params import Parameters
from ceem_casadi.smoothing import Smoother
from ceem_casadi.smoothing._options import SmootherOptions
from models.helicopter import batch_functions, heli_model, linear_theta
from scripts import heli_convert, heli_standin
from scripts.baselines import LSTM, sequence_loss_factory, windows

log = logging.getLogger(__name__)
H = 25            # history length of H25 and number of dropped predictions
PUBLISHED = {"NL": 0.615, "SID": 0.77, "H25": 0.923, "LSTM": 1.30, "naive": 2.67}


def load(args, out: Path) -> dict:
    if args.data is None:
        sizes = (8, 4, 6, 200) if args.smoke else (args.n_train, 101, 100, 500)
        root = heli_standin.write(out / "standin", *sizes, seed=args.seed)
        return heli_convert.read_folder(root)
    p = Path(args.data)
    return heli_convert.read_folder(p) if p.is_dir() else heli_convert.load_npz(p)


def history(u: np.ndarray, h: int) -> np.ndarray:
    """(N, T-h+1, h*nu) windows u_{t-h+1:t} for t = h-1 .. T-1."""
    N, T, nu = u.shape
    return np.stack([u[:, t - h + 1:t + 1].reshape(N, h * nu) for t in range(h - 1, T)], axis=1)


def train_mlp(X, Y, Xv, Yv, depth, opts, seed):
    """MLP on columns X (n_in, M) -> Y (ny, M); returns a numpy predictor."""
    net = MLP((X.shape[0], *([32] * depth), Y.shape[0]), name="net")
    params, w0, _, _ = flat_params(net, rng=np.random.default_rng(seed))
    res = adam(mse_loss_factory(net, params), w0, (X, Y), options=opts, valid=(Xv, Yv))
    ns = namespace(params, res.w)
    return lambda Z: net(ns, Z), res


def train_lstm(u, r, uv, rv, opts, stride, seed):
    """LSTM (2 x 32) on windows of H steps: inputs u (N, T, nu) -> residuals r (N, T, ny).

    Returns a predictor ``u (N, T, nu) -> (N, T, ny)`` (NaN for t < H - 1) and the Adam result.
    """
    net = LSTM(u.shape[2], 32, 2, r.shape[2], name="lstm")
    params = Parameters(*net.params(np.random.default_rng(seed)))
    w0 = params.to_vector({q.name: q.array("value") for q in params})
    U, Y = windows(u, r, H, stride)
    res = adam(sequence_loss_factory(net, params, H), w0, (U, Y), options=opts,
               valid=windows(uv, rv, H, H))
    ns = namespace(params, res.w)

    def predict(uu):
        N, T, nu = uu.shape
        Uw, _ = windows(uu, None, H, 1)
        out = []
        for s in range(0, Uw.shape[1], 20000):                        # bounded memory
            blk = Uw[:, s:s + 20000]
            out.append(net(ns, [blk[k * nu:(k + 1) * nu] for k in range(H)])[-1])
        p = np.hstack(out).T.reshape(N, T - H + 1, -1)
        return np.concatenate([np.full((N, H - 1, p.shape[2]), np.nan), p], axis=1)
    return predict, res


def rmse(pred, y, y_mean, y_std, drop=H):
    """Per-trajectory RMSE (N,) over t >= drop and all outputs, un-normalised."""
    e = (pred[:, drop:] - y[:, drop:]) * y_std
    return np.sqrt(np.mean(e ** 2, axis=(1, 2)))


def ekf_predict(ekf, theta_vec, resid, u, nx):
    """One-step-ahead predicted residuals (N, T, ny): x0 = 0, Sigma0 = Q = R = I."""
    ny = resid.shape[2]
    return np.stack([ekf.run(theta_vec, r, ui, x0=np.zeros(nx), Sigma0=np.eye(nx), Q=np.eye(nx),
                             R=np.eye(ny), engine="casadi").y_pred for r, ui in zip(resid, u)])


def figures(out, rms, test_y, preds, y_mean, y_std, synthetic):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tag = " (SYNTHETIC stand-in)" if synthetic else ""
    names = list(rms)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.boxplot([rms[k] for k in names], showmeans=True)
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.set_ylabel("test RMSE per trajectory (un-normalised units)")
    ax.set_title("Helicopter one-step prediction error" + tag)
    fig.tight_layout()
    fig.savefig(out / "rmse_distribution.png", dpi=120)
    plt.close(fig)
    ref = rms["NL"] if "NL" in rms else rms["SID"]
    k = int(np.argsort(ref)[len(ref) // 2])       # median NL trajectory
    T = test_y.shape[1]
    t = np.arange(T) * 0.02
    fig, axes = plt.subplots(6, 1, figsize=(8, 11), sharex=True)
    labels = ["ax", "ay", "az", "alpha_x", "alpha_y", "alpha_z"]
    for j, ax in enumerate(axes):
        ax.plot(t, test_y[k, :, j] * y_std[j] + y_mean[j], "k", lw=1.5, label="measured")
        for name, p in preds.items():
            ax.plot(t[H:], p[k, H:, j] * y_std[j] + y_mean[j], lw=0.9, label=name)
        ax.set_ylabel(labels[j])
    axes[-1].set_xlabel("time (s)")
    axes[0].legend(ncol=4, fontsize=7)
    axes[0].set_title(f"test trajectory {k}: predicted vs measured accelerations" + tag)
    fig.tight_layout()
    fig.savefig(out / "prediction_test_trajectory.png", dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help=".npz from heli_convert or a split_normalized folder; "
                    "default: generate the SYNTHETIC stand-in")
    ap.add_argument("--out", default="results/heli_pipeline")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-train", type=int, default=466, help="stand-in training trajectories")
    ap.add_argument("--epochs", type=int, default=30, help="Adam epochs of naive/H25")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--decay", type=float, default=0.1, help="harmonic decay per epoch")
    ap.add_argument("--sid-subsets", type=int, default=10)
    ap.add_argument("--sid-size", type=int, default=100)
    ap.add_argument("--nl-train", type=int, default=466, help="training trajectories used by CE-EM")
    ap.add_argument("--nl-iters", type=int, default=10, help="CE-EM iterations")
    ap.add_argument("--nl-learner", choices=("adam", "ipopt"), default="adam")
    ap.add_argument("--nl-learn-iters", type=int, default=100, help="IPOPT iterations per learning step")
    ap.add_argument("--nl-adam-epochs", type=int, default=1, help="Adam passes per learning step")
    ap.add_argument("--nl-jobs", type=int, default=1, help="processes of the smoothing step")
    ap.add_argument("--lstm-epochs", type=int, default=10)
    ap.add_argument("--lstm-lr", type=float, default=1e-3)
    ap.add_argument("--lstm-batch", type=int, default=512)
    ap.add_argument("--lstm-stride", type=int, default=5, help="start of a training window every k steps")
    ap.add_argument("--skip-lstm", action="store_true")
    ap.add_argument("--skip-h25", action="store_true")
    ap.add_argument("--skip-nl", action="store_true", help="no CE-EM (the NL fit is slow, see docs)")
    ap.add_argument("--smoke", action="store_true", help="tiny stand-in run (< 1 min)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    a = ap.parse_args(argv)

    def report(stage: str, seconds: float, extra: str = "") -> None:
        """One progress line per finished stage on stderr (the full run takes tens of minutes)."""
        if not a.quiet:
            print(f"[heli] {stage}: {seconds:.1f} s{extra}", file=sys.stderr, flush=True)

    if a.smoke:
        a.epochs, a.lr, a.sid_subsets, a.sid_size, a.nl_train, a.nl_iters = 120, 3e-3, 2, 6, 8, 3
        a.nl_learn_iters, a.nl_adam_epochs = 60, 50
        a.lstm_epochs, a.lstm_lr, a.lstm_batch, a.lstm_stride = 30, 3e-3, 128, 5
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    times = {}
    t0 = time.perf_counter()
    d = load(a, out)
    synthetic = bool(d.get("synthetic", False))
    report("data loaded", time.perf_counter() - t0, f" ({'SYNTHETIC stand-in, ' if synthetic else ''}train/valid/test "
           f"{len(d['train_y'])}/{len(d['valid_y'])}/{len(d['test_y'])} trajectories)")
    y_mean, y_std = d["y_mean"], d["y_std"]
    tr_u, tr_y, va_u, va_y, te_u, te_y = (d[k] for k in ("train_u", "train_y", "valid_u", "valid_y",
                                                          "test_u", "test_y"))
    cols = lambda a3: a3.reshape(-1, a3.shape[-1]).T                       # noqa: E731
    opts = AdamOptions(lr=a.lr, decay=a.decay, epochs=a.epochs, batch_size=512, seed=a.seed)

    # naive ---------------------------------------------------------------------------------------
    t = time.perf_counter()
    naive, _ = train_mlp(cols(tr_u), cols(tr_y), cols(va_u), cols(va_y), 8, opts, a.seed)
    npred = {s: naive(cols(uu)).T.reshape(uu.shape[0], uu.shape[1], -1)
             for s, uu in (("train", tr_u), ("valid", va_u), ("test", te_u))}
    times["naive_s"] = time.perf_counter() - t
    preds = {"naive": npred["test"]}
    report("naive MLP trained", times["naive_s"])

    # H25 -----------------------------------------------------------------------------------------
    if not a.skip_h25:
        t = time.perf_counter()
        tail = lambda y: y[:, H - 1:]                                       # noqa: E731
        h25, _ = train_mlp(cols(history(tr_u, H)), cols(tail(tr_y)), cols(history(va_u, H)),
                           cols(tail(va_y)), 8, opts, a.seed + 1)
        p = h25(cols(history(te_u, H))).T.reshape(te_u.shape[0], -1, 6)
        preds["H25"] = np.concatenate([np.full((te_u.shape[0], H - 1, 6), np.nan), p], axis=1)
        times["h25_s"] = time.perf_counter() - t
        report("H25 MLP trained", times["h25_s"])

    # SID on the naive residuals --------------------------------------------------------------------
    t = time.perf_counter()
    res = {s: y - npred[s] for s, y in (("train", tr_y), ("valid", va_y), ("test", te_y))}
    model, theta0, head = heli_model(seed=a.seed)
    step, observe = batch_functions(head)
    ekf = EKF(model)
    rng = np.random.default_rng(a.seed)
    sid_fits = []
    for _ in range(a.sid_subsets):
        idx = rng.choice(len(tr_u), size=min(a.sid_size, len(tr_u)), replace=False)
        fit = n4sid([(res["train"][i], tr_u[i]) for i in idx], order=10)
        th = linear_theta(theta0, fit.A, fit.B, fit.C, fit.D)
        vec = model.theta_vector(th)
        v = rmse(ekf_predict(ekf, vec, res["valid"], va_u, 10) + npred["valid"], va_y, y_mean, y_std).mean()
        pt = ekf_predict(ekf, vec, res["test"], te_u, 10) + npred["test"]
        sid_fits.append((v, th, pt))
    best = int(np.argmin([f[0] for f in sid_fits]))
    sid_rms_all = [rmse(f[2], te_y, y_mean, y_std) for f in sid_fits]
    preds["SID"] = sid_fits[best][2]
    times["sid_s"] = time.perf_counter() - t
    report(f"SID ({a.sid_subsets} N4SID fits)", times["sid_s"], f", best validation RMSE {sid_fits[best][0]:.4g}")

    # LSTM on the naive residuals -------------------------------------------------------------------
    if not a.skip_lstm:
        t = time.perf_counter()
        lopts = AdamOptions(lr=a.lstm_lr, decay=a.decay, epochs=a.lstm_epochs, batch_size=a.lstm_batch,
                            seed=a.seed)
        lstm, lres = train_lstm(tr_u, res["train"], va_u, res["valid"], lopts, a.lstm_stride, a.seed + 2)
        preds["LSTM"] = lstm(te_u) + npred["test"]
        times["lstm_s"] = time.perf_counter() - t
        report("LSTM trained", times["lstm_s"])
        lstm_losses = {"train": lres.train_loss, "valid": lres.valid_loss}

    # NL via CE-EM --------------------------------------------------------------------------------
    t = time.perf_counter()
    fit = None
    n_nl = min(a.nl_train, len(tr_u))
    data = Trajectories([res["train"][i] for i in range(n_nl)], [tr_u[i] for i in range(n_nl)])
    options = CEEMOptions(max_iters=a.nl_iters, tol=1e-6, n_jobs=a.nl_jobs,
                          smoother=SmootherOptions(rho_x=0.5),
                          learner=LearnerOptions(rho_theta=0.5, hessian="limited-memory",
                                                 max_iters=a.nl_learn_iters, tol=1e-6))
    if not a.skip_nl:
        records = []
        learner = None if a.nl_learner == "ipopt" else AdamLearner(
            model, AdamOptions(rho_theta=0.5, epochs=a.nl_adam_epochs, seed=a.seed),
            step=step, observe=observe)
        progress = Progress(a.nl_iters, quiet=a.quiet)
        # the head's observation terms in the smoothing step by numpy, from the same column-wise observe
        smoother = Smoother(model, options.smoother, observe=observe)
        fit = ceem(model, data, sid_fits[best][1], options=options, callback=chain(records.append, progress),
                   learner=learner, smoother=smoother)
        progress.close(fit.status, fit.message)
        nl_vec = model.theta_vector(fit.theta)
        preds["NL"] = ekf_predict(ekf, nl_vec, res["test"], te_u, 10) + npred["test"]
        times["nl_s"] = time.perf_counter() - t
        times["nl_per_iteration_s"] = times["nl_s"] / max(1, len(fit.history))
        report(f"NL via CE-EM ({len(fit.history)} iterations, {fit.status})", times["nl_s"])
    times["total_s"] = time.perf_counter() - t0

    rms = {k: rmse(p, te_y, y_mean, y_std) for k, p in preds.items()}
    figures(out, rms, te_y, preds, y_mean, y_std, synthetic)
    result = {
        "synthetic_standin": synthetic,
        "sizes": {s: list(d[f"{s}_y"].shape) for s in ("train", "valid", "test")},
        "mean_test_rmse": {k: float(v.mean()) for k, v in rms.items()},
        "median_test_rmse": {k: float(np.median(v)) for k, v in rms.items()},
        "sid_subsets_mean_test_rmse": [float(r.mean()) for r in sid_rms_all],
        "sid_best_by_validation": best,
        "lstm_loss_per_epoch": None if a.skip_lstm else lstm_losses,
        "ceem": None if fit is None else {"status": fit.status, "iterations": len(fit.history),
                                          "J": [float(r.J) for r in fit.history], "trajectories": n_nl,
                                          "learner": a.nl_learner, "message": fit.message},
        "published_real_data": PUBLISHED,
        "times_s": times,
        "args": vars(a),
    }
    (out / "results.json").write_text(json.dumps(result, indent=2))
    np.savez(out / "test_rmse.npz", **rms)
    if a.smoke:
        assert all(np.all(np.isfinite(v)) for v in rms.values())
        assert (out / "rmse_distribution.png").exists() and (out / "prediction_test_trajectory.png").exists()
    print(json.dumps({"mean_test_rmse": result["mean_test_rmse"], "times_s": times}))
    return result


if __name__ == "__main__":
    main()
