"""Write the genuine PyTorch fixtures read by tests/test_torchfile.py (needs real torch; not run in CI).

The files are produced by ``torch.save`` itself, so the restricted reader is tested against what
PyTorch writes rather than against our own writer:

* ``torch_zip.pt`` / ``torch_legacy.pt``: the helicopter layout ``(time (T,), data (T, 19) float32,
  controls (T, 4))`` in the zip format and in the pre-1.6 legacy format
  (``_use_new_zipfile_serialization=False``). ``data`` is a row slice of a larger tensor, so its
  storage offset is not zero.
* ``torch_views_zip.pt`` / ``torch_views_legacy.pt``: a dict exercising views that share one
  storage (offset, transpose, step), integer, bool and float16 tensors, a 0-d tensor, an empty
  tensor and plain Python values.
* ``torch_fixture_expected.npz``: the expected arrays, written with numpy.

Run (once, in an environment with torch; committed outputs are a few kB)::

    python tests/data/make_torch_fixtures.py
"""
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).parent


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    T = 40
    time = torch.arange(T, dtype=torch.float64) * 0.02
    big = torch.randn(T + 3, 19, generator=gen, dtype=torch.float32)
    data = big[3:]  # storage offset 3 * 19
    controls = torch.randn(T, 4, generator=gen, dtype=torch.float64)
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    views = {
        "base": base,
        "offset": base[1:],
        "transposed": base.t(),
        "stepped": base[:, ::2],
        "long": torch.arange(-3, 5, dtype=torch.int64),
        "int": torch.tensor([[1, -2], [3, 4]], dtype=torch.int32),
        "bool": torch.tensor([True, False, True]),
        "half": torch.tensor([0.5, -1.25, 3.0], dtype=torch.float16),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
        "meta": {"name": "fixture", "T": T, "dt": 0.02, "flags": [True, None]},
    }
    for legacy in (False, True):
        suffix = "legacy" if legacy else "zip"
        torch.save((time, data, controls), HERE / f"torch_{suffix}.pt",
                   _use_new_zipfile_serialization=not legacy)
        torch.save(views, HERE / f"torch_views_{suffix}.pt", _use_new_zipfile_serialization=not legacy)
    arrays = {f"views_{k}": v.numpy() for k, v in views.items() if isinstance(v, torch.Tensor)}
    np.savez(HERE / "torch_fixture_expected.npz", time=time.numpy(), data=data.numpy(),
             controls=controls.numpy(), torch_version=np.array(torch.__version__), **arrays)
    print("wrote fixtures with torch", torch.__version__)


if __name__ == "__main__":
    main()
