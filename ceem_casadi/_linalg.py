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
