"""Small dense/sparse linear-algebra helpers shared by the solvers."""
from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix

# below this fraction of nonzero entries a sparse product beats BLAS (and avoids its threads,
# which degrade badly when the cores are shared)
SPARSE_DENSITY = 0.1


def gram(J: np.ndarray) -> np.ndarray:
    """``J.T @ J`` (dense (n, n)) of a tall (N, n) matrix, through a sparse product when most
    entries are zero (stacked stage Jacobians: each residual row sees few parameters)."""
    if J.size and np.count_nonzero(J) < SPARSE_DENSITY * J.size:
        Js = csr_matrix(J)
        return np.asarray((Js.T @ Js).todense())
    return J.T @ J


class BufferedCall:
    """Evaluate a dense CasADi Function into preallocated numpy arrays (CasADi's zero-copy buffer
    interface): converting tens of MB of Jacobian entries from DM would cost more than the step."""

    def __init__(self, fun):
        self.fun = fun
        self.buf, self.trigger = fun.buffer()
        self.out = [np.empty(fun.nnz_out(i)) for i in range(fun.n_out())]
        for i, o in enumerate(self.out):
            self.buf.set_res(i, memoryview(o))

    def __call__(self, *args) -> list[np.ndarray]:
        """Column-major flat outputs of ``fun(*args)`` (the arrays are reused by the next call); the inputs are
        not kept after the call (often views, they would keep whole records alive: docs/long_records.md)."""
        args = [np.ascontiguousarray(np.asarray(a, float).ravel(order="F")) for a in args]
        for i, a in enumerate(args):
            if a.size != self.fun.nnz_in(i):
                raise ValueError(f"{self.fun.name()}: input {i} has {a.size} entries, expected {self.fun.nnz_in(i)}")
            self.buf.set_arg(i, memoryview(a))
        self.trigger()
        return self.out
