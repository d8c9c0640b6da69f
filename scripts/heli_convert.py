"""Convert the processed helicopter folder (``split_normalized``) into one plain ``.npz``.

Reads every ``{train,valid,test}/*.pt`` (``(time, data (T, 19), controls (T, 4))``, torch zip or
legacy format) and ``statistics.pt`` with `ceem_casadi.io.torchfile`, which never executes
pickled code (a file that tries is refused with ``UnsafePickleError``). Output arrays
(``allow_pickle=False``): ``{split}_y`` (N, T, 6) = data[:, -6:], ``{split}_u`` (N, T, 10) =
controls + data[:, 7:13] (normalised), ``{split}_files``; ``y_mean``, ``y_std`` (6,), ``u_mean``,
``u_std`` (10,) to un-normalise.

Run: ``python -m scripts.heli_convert DATASETS/split_normalized --out heli.npz``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ceem_casadi.errors import ShapeError
from ceem_casadi.io import torchfile

SPLITS = ("train", "valid", "test")


def read_trajectory(path):
    """``(y (T, 6), u (T, 10))`` of one trajectory file (normalised)."""
    obj = torchfile.load(path)
    if not (isinstance(obj, (tuple, list)) and len(obj) == 3):
        raise ShapeError(f"{path}: expected a (time, data, controls) tuple, got {type(obj).__name__}")
    _, data, controls = (np.asarray(a, float) for a in obj)
    if data.ndim != 2 or data.shape[1] != 19 or controls.shape != (data.shape[0], 4):
        raise ShapeError(f"{path}: expected data (T, 19) and controls (T, 4), got {data.shape}, "
                         f"{controls.shape}")
    return data[:, -6:], np.hstack([controls, data[:, 7:13]])


def read_statistics(folder):
    """``(y_mean, y_std, u_mean, u_std)`` from ``statistics.pt`` (in ``folder`` or its parent)."""
    folder = Path(folder)
    for p in (folder / "statistics.pt", folder.parent / "statistics.pt"):
        if p.exists():
            dm, ds, cm, cs = (np.asarray(a, float).ravel() for a in torchfile.load(p))
            if dm.size != 19 or cm.size != 4:
                raise ShapeError(f"{p}: expected 19 data and 4 control statistics, got {dm.size}, {cm.size}")
            return dm[-6:], ds[-6:], np.concatenate([cm, dm[7:13]]), np.concatenate([cs, ds[7:13]])
    raise FileNotFoundError(f"statistics.pt not found in {folder} or {folder.parent}")


def read_folder(folder) -> dict[str, np.ndarray]:
    """All splits and statistics of a ``split_normalized`` folder as the arrays of the .npz."""
    folder = Path(folder)
    out = {}
    for split in SPLITS:
        files = sorted((folder / split).glob("*.pt"))
        if not files:
            raise FileNotFoundError(f"no .pt files in {folder / split}")
        pairs = [read_trajectory(f) for f in files]
        out[f"{split}_y"] = np.stack([p[0] for p in pairs])
        out[f"{split}_u"] = np.stack([p[1] for p in pairs])
        out[f"{split}_files"] = np.array([f.name for f in files])
    out["y_mean"], out["y_std"], out["u_mean"], out["u_std"] = read_statistics(folder)
    out["synthetic"] = np.array((folder / "SYNTHETIC_README.txt").exists())
    return out


def load_npz(path) -> dict[str, np.ndarray]:
    """The arrays of a converted file (no pickle)."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="the split_normalized folder")
    ap.add_argument("--out", default="results/heli_convert/heli.npz")
    a = ap.parse_args(argv)
    arrays = read_folder(a.folder)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **arrays)
    summary = {k: list(v.shape) for k, v in arrays.items() if k.endswith(("_y", "_u"))}
    summary.update(out=str(out), synthetic=bool(arrays["synthetic"]))
    print(json.dumps(summary))
    return out


if __name__ == "__main__":
    main()
