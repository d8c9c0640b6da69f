"""SYNTHETIC stand-in for the processed Stanford helicopter dataset, in the real on-disk format.

Writes ``<out>/split_normalized/{train,valid,test}/*.pt`` (each a ``torch.save`` tuple
``(time (T,), data (T, 19), controls (T, 4))``, already normalised) and
``<out>/split_normalized/statistics.pt`` = ``(data_mean (19,), data_std (19,), controls_mean (4,),
controls_std (4,))``, with `ceem_casadi.io.torchfile` (no torch). THIS IS NOT HELICOPTER DATA:
it is a simulated system with the same layout (50 Hz, 19 data columns, 4 controls; target = the
last 6 columns, inputs = controls + data[:, 7:13]) whose targets depend on the inputs through a
static nonlinearity AND on 4 hidden states with their own slow dynamics (driven by the inputs),
partly nonlinearly, so that a model with hidden states must beat a static one. Every file also
carries the label in its name (``synthetic_*.pt``) and ``SYNTHETIC_README.txt`` says so.

Run: ``python -m scripts.heli_standin --out results/heli_standin [--n-train 466 ...]``.
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np

from ceem_casadi.io import torchfile

log = logging.getLogger(__name__)
DT = 0.02
NH = 4          # hidden states of the synthetic system


def _smooth(rng, T, n, scale=1.0, n_freq=6):
    """Smooth random signals (T, n): sums of random sinusoids between 0.05 and 1.5 Hz."""
    t = np.arange(T) * DT
    out = np.zeros((T, n))
    for j in range(n):
        f = rng.uniform(0.05, 1.5, n_freq)
        a = rng.normal(size=n_freq) / np.sqrt(n_freq)
        ph = rng.uniform(0, 2 * np.pi, n_freq)
        out[:, j] = (a[None] * np.sin(2 * np.pi * f[None] * t[:, None] + ph[None])).sum(1)
    return scale * out


def system(seed: int = 1234):
    """Fixed random matrices of the synthetic system (independent of the trajectory seed)."""
    r = np.random.default_rng(seed)
    poles = np.array([0.985, 0.97, 0.95, 0.92])
    Q, _ = np.linalg.qr(r.normal(size=(NH, NH)))
    return dict(
        Ah=Q @ np.diag(poles) @ Q.T,
        Bh=0.25 * r.normal(size=(NH, 10)),
        M=r.normal(size=(8, 10)) / np.sqrt(10),
        W=r.normal(size=(6, 8)) / np.sqrt(8),
        Ch=r.normal(size=(6, NH)) / np.sqrt(NH) * 1.5,
        Nl=r.normal(size=(6, NH)) / np.sqrt(NH) * 1.2,
        raw_mean=r.normal(size=19) * 2, raw_std=np.exp(r.normal(size=19) * 0.7),
        c_mean=r.normal(size=4), c_std=np.exp(r.normal(size=4) * 0.5),
    )


def trajectory(rng, sysm, T: int, noise: float = 0.05):
    """One raw (un-normalised) trajectory: time (T,), data (T, 19), controls (T, 4)."""
    controls = _smooth(rng, T, 4)
    vel = _smooth(rng, T, 6) + 0.3 * controls @ rng.normal(size=(4, 6)) * 0.3
    u = np.hstack([controls, vel])
    h = np.zeros((T, NH))
    h[0] = rng.normal(size=NH) * 0.5
    for t in range(T - 1):
        h[t + 1] = sysm["Ah"] @ h[t] + sysm["Bh"] @ u[t]
    static = np.tanh(u @ sysm["M"].T) @ sysm["W"].T
    hidden = h @ sysm["Ch"].T + np.tanh(1.5 * h) ** 2 @ sysm["Nl"].T
    y = static + hidden + noise * rng.normal(size=(T, 6))
    other = _smooth(rng, T, 7)
    data = np.hstack([other, vel, y])
    raw_data = data * sysm["raw_std"] + sysm["raw_mean"]
    raw_controls = controls * sysm["c_std"] + sysm["c_mean"]
    return np.arange(T) * DT, raw_data, raw_controls


def write(out, n_train=466, n_valid=101, n_test=100, T=500, seed=0, legacy=False) -> Path:
    """Write the stand-in under ``out/split_normalized``; returns that folder."""
    root = Path(out) / "split_normalized"
    sysm = system()
    rng = np.random.default_rng(seed)
    splits = {}
    for name, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        splits[name] = [trajectory(rng, sysm, T) for _ in range(n)]
    d_all = np.concatenate([d for _, d, _ in splits["train"]])
    c_all = np.concatenate([c for _, _, c in splits["train"]])
    stats = (d_all.mean(0), d_all.std(0), c_all.mean(0), c_all.std(0))
    for name, trajs in splits.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for k, (t, d, c) in enumerate(trajs):
            torchfile.save((t, (d - stats[0]) / stats[1], (c - stats[2]) / stats[3]),
                           root / name / f"synthetic_{name}_{k:04d}.pt", legacy=legacy)
    torchfile.save(stats, root / "statistics.pt", legacy=legacy)
    (root / "SYNTHETIC_README.txt").write_text(
        "SYNTHETIC stand-in written by scripts/heli_standin.py -- NOT the Stanford helicopter data.\n"
        f"seed={seed} T={T} train/valid/test={n_train}/{n_valid}/{n_test} "
        f"format={'legacy' if legacy else 'zip'}\n")
    return root


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/heli_standin")
    ap.add_argument("--n-train", type=int, default=466)
    ap.add_argument("--n-valid", type=int, default=101)
    ap.add_argument("--n-test", type=int, default=100)
    ap.add_argument("--T", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--legacy", action="store_true", help="pre-1.6 torch.save format")
    ap.add_argument("--smoke", action="store_true", help="3/2/2 trajectories of 100 steps")
    a = ap.parse_args(argv)
    if a.smoke:
        a.n_train, a.n_valid, a.n_test, a.T = 3, 2, 2, 100
    root = write(a.out, a.n_train, a.n_valid, a.n_test, a.T, a.seed, a.legacy)
    files = sorted(root.rglob("*.pt"))
    assert len(files) == a.n_train + a.n_valid + a.n_test + 1
    print(json.dumps({"folder": str(root), "files": len(files), "synthetic": True}))
    return root


if __name__ == "__main__":
    main()
