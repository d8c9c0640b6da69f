"""Blocks of the joint Hessian of -J over (x_{1:T}, theta), exact or Gauss-Newton, for the joint NLP and the
parameter uncertainty."""
from __future__ import annotations

import casadi as ca
import numpy as np

from ..learning._learner import weighted_stage_columns
from ..objective._stages import StageFunctions
from ..runtime._linalg import BufferedCall, gram
from ._joint_gauss_newton import JointGaussNewton


class ExactBlocks:
    """Mapped exact stage Hessians over all stages of a dataset shape (built once)."""

    def __init__(self, stages: StageFunctions, n_obs: int, n_dyn: int):
        def mapped(names, n, n_in, shared):
            funs = stages.get(*names)
            per_stage = [f.map(n, [i in shared for i in range(n_in)], [False]) for f in funs[:2]]
            summed = funs[2].map(n, [False] * n_in, [True])
            syms = [ca.MX.sym(f"a{i}", funs[0].sparsity_in(i).size1(),
                              funs[0].sparsity_in(i).size2() * (1 if i in shared else n)) for i in range(n_in)]
            out = [f(*syms) for f in per_stage] + [ca.densify(summed(*syms))]
            return BufferedCall(ca.Function(names[0] + "_blocks", syms, out))

        # obs inputs x, u, y, m, p, iv; dyn inputs x, x_next, u, p, iw (p shared)
        self.obs = mapped(["obs_x_hess", "obs_xp_hess", "obs_p_hess"], n_obs, 6, {4})
        self.dyn = mapped(["dyn_x_hess", "dyn_xp_hess", "dyn_p_hess"], n_dyn, 5, {3})

    def __call__(self, model, theta_vec, data, xs, free):
        nx, npar = model.nx, model.params.size
        (Xo, Uo, Yo, Mo, iv), (X0, X1, U0, iw) = weighted_stage_columns(model, data, xs)
        No, Nd = Xo.shape[1], X0.shape[1]
        ho, hxo, hpo = (a.copy() for a in self.obs(Xo, Uo, Yo, Mo, theta_vec, iv))
        hd, hzd, hpd = (a.copy() for a in self.dyn(X0, X1, U0, theta_vec, iw))
        Ho = ho.reshape(No, nx, nx).transpose(0, 2, 1)   # column-major (nx, No*nx) -> (No, nx, nx)
        Hd = hd.reshape(Nd, 2 * nx, 2 * nx).transpose(0, 2, 1)
        Hxo = hxo.reshape(No, npar, nx).transpose(0, 2, 1)[:, :, free]
        Hzd = hzd.reshape(Nd, npar, 2 * nx).transpose(0, 2, 1)[:, :, free]
        Hpp = (hpd.reshape(npar, npar) + hpo.reshape(npar, npar))[np.ix_(free, free)]
        return Ho, Hd, Hxo, Hzd, Hpp


def gauss_newton_blocks(Jxo, Jpo, Jzd, Jpd, nx: int):
    """``(Ho, Hd, Hxo, Hzd, Hpp)`` of the stacked residual Jacobians (`JointGaussNewton.linearise`; ``Jpo`` None:
    the observations do not depend on theta): J^T J per stage block and summed for the parameters."""
    nf = Jpd.shape[2]
    Ho, Hd = np.einsum("tri,trj->tij", Jxo, Jxo), np.einsum("tri,trj->tij", Jzd, Jzd)
    Hzd = np.einsum("tri,trk->tik", Jzd, Jpd)
    Hpp = gram(Jpd.reshape(-1, nf))
    if Jpo is None:
        return Ho, Hd, np.zeros((Jxo.shape[0], nx, nf)), Hzd, Hpp
    return Ho, Hd, np.einsum("tri,trk->tik", Jxo, Jpo), Hzd, Hpp + gram(Jpo.reshape(-1, nf))


class GaussNewtonBlocks:
    """Gauss-Newton blocks from the residual Jacobians of `JointGaussNewton`."""

    def __init__(self, model, lengths, stages):
        self.joint = JointGaussNewton(model, lengths, stages, use_prior=False)

    def __call__(self, model, theta_vec, data, xs, free):
        ro, Jxo, Jpo, rd, Jzd, Jpd = self.joint.linearise(np.asarray(theta_vec, float), data, xs)
        return gauss_newton_blocks(Jxo, Jpo, Jzd, Jpd, model.nx)
