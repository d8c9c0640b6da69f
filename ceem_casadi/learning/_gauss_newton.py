"""The Gauss-Newton Hessian of the IPOPT learning step as a CasADi Callback: J^T J of the stacked
stage Jacobians formed by BLAS (CasADi's own dense products are ~7x slower)."""
from __future__ import annotations

import casadi as ca
import numpy as np

from ..runtime._callbacks import SparsityCallback
from ..runtime._linalg import BufferedCall, gram


class GaussNewtonHessian(SparsityCallback):
    """IPOPT ``hess_lag`` = lam_f (J^T J + diag(d)) (upper triangle), J^T J by BLAS; ``jac_fun(z, P) -> (J_1, ..,
    J_k, d)``, each J_i (nr_i, N_i np) the N_i stage Jacobians (nr_i, np) side by side."""

    def __init__(self, jac_fun: ca.Function, shapes, free: np.ndarray, n_p: int):
        self.jac_fun, self.shapes, self.free, self.n_p = jac_fun, shapes, free, n_p
        n = free.size
        rows, cols = np.triu_indices(n)
        order = np.lexsort((rows, cols))  # column-major order of the upper triangle
        self.rows, self.cols = rows[order], cols[order]
        self._call = None
        sp_in = [ca.Sparsity.dense(n, 1), jac_fun.sparsity_in(1), ca.Sparsity.dense(1, 1), ca.Sparsity(0, 1)]
        super().__init__("gauss_newton_hess_lag", sp_in, [ca.Sparsity.upper(n)], ["x", "p", "lam_f", "lam_g"],
                         ["triu_hess_gamma_x_x"])

    def eval(self, arg):
        # zero-copy evaluation through CasADi's buffer interface: converting the ~N*nr*np
        # Jacobian entries of a DM to numpy would cost more than the whole Hessian
        if self._call is None:
            self._call = BufferedCall(self.jac_fun)
        out = self._call(arg[0].full(), arg[1].full())
        H = np.zeros((self.n_p, self.n_p))
        for J, (nr, N) in zip(out[:-1], self.shapes):
            # column-major (nr, N*np): stage t, parameter j, row i at ((t*np + j)*nr + i)
            M = J.reshape(N, self.n_p, nr).transpose(1, 0, 2).reshape(self.n_p, N * nr)
            H += gram(M.T)
        H = H[np.ix_(self.free, self.free)] + np.diag(out[-1])
        return [ca.DM(self.sp_out[0], float(arg[2]) * H[self.rows, self.cols])]
