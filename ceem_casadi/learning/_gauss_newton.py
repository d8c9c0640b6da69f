"""The Gauss-Newton Hessian of the IPOPT learning step as a CasADi Callback: J^T J of the stacked
stage Jacobians formed by BLAS (CasADi's own dense products are ~7x slower)."""
from __future__ import annotations

import casadi as ca
import numpy as np

from ..runtime._linalg import gram


class GaussNewtonHessian(ca.Callback):
    """IPOPT ``hess_lag`` = lam_f * (J^T J + diag(d)) (upper triangle), J^T J by BLAS.

    ``jac_fun(z, P) -> (J_1, ..., J_k, d)`` where each J_i is (nr_i, N_i * np): the N_i stage
    Jacobians (nr_i, np) side by side (a mapped stage Jacobian's output).
    """

    def __init__(self, jac_fun: ca.Function, shapes, free: np.ndarray, n_p: int):
        ca.Callback.__init__(self)
        self.jac_fun, self.shapes, self.free = jac_fun, shapes, free
        n = free.size
        self.n, self.n_p = n, n_p
        rows, cols = np.triu_indices(n)
        order = np.lexsort((rows, cols))  # column-major order of the upper triangle
        self.rows, self.cols = rows[order], cols[order]
        self.sp_out = ca.Sparsity.upper(n)
        self.construct("gauss_newton_hess_lag", {})

    def get_n_in(self):
        return 4

    def get_n_out(self):
        return 1

    def get_name_in(self, i):
        return ["x", "p", "lam_f", "lam_g"][i]

    def get_name_out(self, i):
        return "triu_hess_gamma_x_x"

    def get_sparsity_in(self, i):
        return [ca.Sparsity.dense(self.n, 1), self.jac_fun.sparsity_in(1), ca.Sparsity.dense(1, 1),
                ca.Sparsity(0, 1)][i]

    def get_sparsity_out(self, i):
        return self.sp_out

    def eval(self, arg):
        # zero-copy evaluation through CasADi's buffer interface: converting the ~N*nr*np
        # Jacobian entries of a DM to numpy would cost more than the whole Hessian
        if not hasattr(self, "_buf"):
            self._buf, self._trigger = self.jac_fun.buffer()
            self._out = [np.empty(self.jac_fun.nnz_out(i)) for i in range(self.jac_fun.n_out())]
            for i, o in enumerate(self._out):
                self._buf.set_res(i, memoryview(o))
        self._in = [np.asarray(a.full(), dtype=float).ravel(order="F") for a in arg[:2]]
        for i, a in enumerate(self._in):
            self._buf.set_arg(i, memoryview(a))
        self._trigger()
        H = np.zeros((self.n_p, self.n_p))
        for J, (nr, N) in zip(self._out[:-1], self.shapes):
            # column-major (nr, N*np): stage t, parameter j, row i at ((t*np + j)*nr + i)
            M = J.reshape(N, self.n_p, nr).transpose(1, 0, 2).reshape(self.n_p, N * nr)
            H += gram(M.T)
        H = H[np.ix_(self.free, self.free)] + np.diag(self._out[-1])
        return [ca.DM(self.sp_out, float(arg[2]) * H[self.rows, self.cols])]
