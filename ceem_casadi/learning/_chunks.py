"""The learning step's stage sums over long records evaluated chunk by chunk (chunk-major data in the NLP
parameter; docs/long_records.md, "Learning over long records")."""
from __future__ import annotations

import casadi as ca
import numpy as np

from ..runtime import _policy as policy


def chunk_length(n_dyn: int) -> int:
    """Chunk length for a learner over ``n_dyn`` dynamics stages (0: the plain layout)."""
    return policy.LEARN_CHUNK if n_dyn >= policy.LEARN_CHUNK_FROM else 0


def pack_columns(arrays, zero_pad, L: int) -> np.ndarray:
    """(K c,) chunk-major block of the (r_i, n) per-stage ``arrays`` in chunks of L stages (K = ceil(n / L)): chunk k
    is ``vec(arrays[i][:, kL:(k+1)L])`` over i, padded with zeros (``zero_pad[i]``: outputs, masks, weights) or the
    last column (states, inputs)."""
    n = arrays[0].shape[1]
    K = -(-n // L)
    blocks = []
    for a, zero in zip(arrays, zero_pad):
        a = np.asarray(a, float)
        a = np.pad(a, ((0, 0), (0, K * L - n)), mode="constant" if zero or n == 0 else "edge")
        blocks.append(a.reshape(a.shape[0], K, L).transpose(1, 2, 0).reshape(K, -1))
    return np.concatenate(blocks, axis=1).ravel()


def chunk_map(fun: ca.Function, p_index: int, L: int, K: int, reduce: bool, D: ca.MX, p: ca.MX) -> list:
    """The outputs of the stage Function ``fun`` (input ``p_index`` the shared ``p``) over the K L stages of a
    `pack_columns` block ``D`` (c, K): summed (``reduce``) or stacked in stage order; nothing but D is O(K L)."""
    rows = [fun.size1_in(i) for i in range(fun.n_in()) if i != p_index]
    offsets = np.concatenate([[0], np.cumsum(rows) * L]).astype(int).tolist()
    Dc, pc = ca.MX.sym("D", offsets[-1]), ca.MX.sym("p", fun.size1_in(p_index))
    cols = [ca.reshape(part, r, L) for part, r in zip(ca.vertsplit(Dc, offsets), rows)]
    args = cols[:p_index] + [pc] + cols[p_index:]
    shared = [i == p_index for i in range(fun.n_in())]
    inner = ca.Function(f"{fun.name()}_chunk{L}", [Dc, pc],
                        fun.map(L, shared, [reduce] * fun.n_out()).call(args))
    out = inner.map(K, "serial").call([D, ca.repmat(p, 1, K)])
    return [ca.repsum(o, 1, K) for o in out] if reduce else out
