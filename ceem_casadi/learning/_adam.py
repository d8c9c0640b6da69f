"""Learning step (M-step) by Adam on mini-batches, for models with large neural-network parts.

Minimises the same objective as [`ceem_casadi.learning.Learner`][ceem_casadi.learning.Learner] over the free entries z
of the flat parameter vector p (fixed entries held at their values):

    F(z) = sum_obs 0.5||m * (y - g(x, u, p)) / sigma_v||^2 + sum_dyn 0.5||(x' - f(x, u, p)) / sigma_w||^2
           + rho_theta ||z - z_prev||^2 + 0.5 ||(z - mu_p) / s_p||^2

as the CE-EM paper does for the helicopter (Adam, lr 5e-4 for the dynamics parameters and 1e-3
for the observation parameters). Each Adam step uses the unbiased mini-batch estimate
``(N_obs / B) sum_{batch} obs + (N_dyn / B) sum_{batch} dyn + regularisers``: B observation
columns and B dynamics columns, evaluated as matrix-valued MX expressions on sample columns, so
one gradient is one reverse sweep over a graph whose size does not depend on the amount of data.
By default these are ``model.g.map(B)`` and ``model.f.map(B)``; a model whose step/observation
functions accept matrices (columns = samples) can pass them as ``step=``/``observe=``, which is
much faster (helicopter NL model, B = 512: gradient 2.5 ms instead of 71 ms); they are checked
against ``model.f``/``model.g`` at construction. The batch Functions are then evaluated by numpy
(`ceem_casadi.runtime.NumpyFunction`: the same instruction list, matrix products by BLAS) when
every operation they use is supported: helicopter size, one BLAS thread, B = 512 gradient
0.51 ms instead of 3.8 ms by CasADi's dense kernels, full-objective chunk of 8,192 columns
2.8 ms instead of 40 ms (same values to 1e-14). The last partial batch of
an epoch is padded with zero-weight columns (one compiled batch size). Bounds are enforced by
projection.

The full objective F is evaluated (in chunks, forward only) before and after the Adam passes;
if the passes did not lower F the starting point is returned, so a CE-EM learning step never
lowers J even though the steps are stochastic.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import casadi as ca
import numpy as np

from ..errors import NonFiniteError, OptionsError
from ..model._columns import check_columnwise
from ..model._nn import adam_step
from ..runtime._best import BestIterate
from ..runtime._numpy_eval import NumpyFunction
from ..runtime._schema import check_fields
from ._learner import LearnResult, weighted_stage_columns

__all__ = ["AdamLearner", "AdamLearnerOptions"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdamLearnerOptions:
    """Options of [`AdamLearner`][ceem_casadi.learning.AdamLearner].

    Parameters
    ----------
    rho_theta : float
        Trust-region weight (as [`LearnerOptions`][ceem_casadi.LearnerOptions]).
    epochs : int
        Passes over the observation columns per learning step.
    batch_size : int
        Columns per mini-batch (observation and dynamics each; paper: 512).
    lr_dynamics, lr_observation : float
        Adam steps of the parameters the dynamics f depends on, and of all others (paper: 5e-4
        and 1e-3).
    decay : float
        Harmonic decay ``lr / (1 + decay * epoch)`` within one learning step.
    beta1, beta2, eps : float
        Adam constants.
    seed : int
        Mini-batch shuffling (advanced at every solve).
    use_prior : bool
        Include the parameters' Gaussian priors.
    chunk : int
        Columns per forward chunk when the full objective is evaluated.

    Raises
    ------
    OptionsError
        A value out of range (also a ``ValueError``).
    """

    rho_theta: float = 0.0
    epochs: int = 1
    batch_size: int = 512
    lr_dynamics: float = 5e-4
    lr_observation: float = 1e-3
    decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    seed: int = 0
    use_prior: bool = True
    chunk: int = 8192

    def __post_init__(self):
        check_fields(self)
        if not (self.rho_theta >= 0 and self.epochs >= 1 and self.batch_size >= 1 and self.chunk >= 1):
            raise OptionsError(f"AdamLearnerOptions: need rho_theta >= 0, epochs >= 1, batch_size >= 1, "
                                 f"chunk >= 1; got {self.rho_theta}, {self.epochs}, {self.batch_size}, {self.chunk}")
        if not (self.lr_dynamics > 0 and self.lr_observation > 0 and self.decay >= 0):
            raise OptionsError(f"AdamLearnerOptions: need lr_dynamics, lr_observation > 0 and decay >= 0; "
                                 f"got {self.lr_dynamics}, {self.lr_observation}, {self.decay}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.eps > 0):
            raise OptionsError("AdamLearnerOptions: need 0 <= beta1, beta2 < 1 and eps > 0")


def _by_numpy(fun: ca.Function):
    """``fun`` evaluated by numpy where every operation of it is supported, else ``fun``."""
    try:
        return NumpyFunction(fun)
    except NotImplementedError as exc:
        log.debug("AdamLearner: %s evaluated by CasADi (%s)", fun.name(), exc)
        return fun


def _scalar(value) -> float:
    return float(np.asarray(value).reshape(-1)[0])


class AdamLearner:
    """Mini-batch Adam learning step with the interface of [`Learner`][ceem_casadi.learning.Learner].

    Pass it to [`ceem_casadi.ceem`][ceem_casadi.ceem] as ``learner=``. ``solve`` returns a
    [`LearnResult`][ceem_casadi.learning.LearnResult] whose ``iterations`` counts Adam steps and whose
    ``cost`` is the full learning objective F at the returned point.

    Parameters
    ----------
    model : StateSpaceModel
        The model.
    options : AdamLearnerOptions
        Step sizes, mini-batches, epochs, trust region, priors.
    step, observe : callable, optional
        ``f`` and ``g`` written for (n, B) matrices (columns = samples), e.g. a network head on
        all columns at once; checked against ``model.f``/``model.g``. Default: the model's
        Functions mapped over the columns.

    Raises
    ------
    ModelError
        ``step``/``observe`` fail on matrices or differ from the model's functions.
    """

    def __init__(self, model, options: AdamLearnerOptions = AdamLearnerOptions(), *, step=None, observe=None):
        if not isinstance(options, AdamLearnerOptions):
            raise TypeError(f"options must be an AdamLearnerOptions, got {type(options).__name__}")
        t0 = time.perf_counter()
        self.model, self.options = model, options
        self._step, self._observe = step, observe
        for name, fun, ref in (("step", step, model.f), ("observe", observe, model.g)):
            if fun is not None:
                check_columnwise(model, name, fun, ref)
        nx, nu, npar = model.nx, model.nu, model.params.size
        self.free = model.params.free_index
        # which parameters the dynamics use: their Adam step is lr_dynamics
        ps = ca.SX.sym("p", npar)
        uses = ca.which_depends(model.f(ca.SX.sym("x", nx), ca.SX.sym("u", nu), ps), ps, 1, False)
        self.dynamics_mask = np.array(uses, bool)
        self._batch = {}
        self._rng = np.random.default_rng(options.seed)
        self.build_s = time.perf_counter() - t0

    # --- CasADi pieces -------------------------------------------------------------------------
    def _functions(self, B: int) -> tuple[ca.Function, ca.Function]:
        """``(cost, grad)`` Functions over B columns with inputs
        ``(p, so, sd, Xo, Uo, Yo, Mo, IV, X0, X1, U0, IW)``: cost -> (obs cost, dyn cost), grad ->
        (obs cost, dyn cost, gradient of ``so * obs + sd * dyn`` with respect to p)."""
        if B not in self._batch:
            m = self.model
            nx, nu, ny = m.nx, m.nu, m.ny
            p = ca.MX.sym("p", m.params.size)
            so, sd = ca.MX.sym("so"), ca.MX.sym("sd")
            Xo, Uo, X0, X1, U0 = (ca.MX.sym(n, r, B) for n, r in
                                  (("Xo", nx), ("Uo", nu), ("X0", nx), ("X1", nx), ("U0", nu)))
            Yo, Mo, IV, IW = ca.MX.sym("Yo", ny, B), ca.MX.sym("Mo", ny, B), ca.MX.sym("IV", ny, B), \
                ca.MX.sym("IW", nx, B)
            ns = m.params.symbols(p)
            G = self._observe(Xo, Uo, ns) if self._observe is not None else m.g.map(B)(Xo, Uo, p)
            F = self._step(X0, U0, ns) if self._step is not None else m.f.map(B)(X0, U0, p)
            r_obs = Mo * IV * (Yo - G)
            r_dyn = IW * (X1 - F)
            c_obs, c_dyn = 0.5 * ca.sumsqr(r_obs), 0.5 * ca.sumsqr(r_dyn)
            ins = [p, so, sd, Xo, Uo, Yo, Mo, IV, X0, X1, U0, IW]
            self._batch[B] = tuple(_by_numpy(f) for f in (
                ca.Function("batch_cost", ins, [c_obs, c_dyn]),
                ca.Function("batch_grad", ins, [c_obs, c_dyn, ca.gradient(so * c_obs + sd * c_dyn, p)])))
        return self._batch[B]

    def _columns(self, data, xs, weights):
        return weighted_stage_columns(self.model, data, xs, weights)

    @staticmethod
    def _take(cols, idx, B):
        """Columns ``idx`` of each array, zero-padded to B columns (zero weight)."""
        out = []
        for a in cols:
            blk = a[:, idx]
            if blk.shape[1] < B:
                blk = np.hstack([blk, np.zeros((a.shape[0], B - blk.shape[1]))])
            out.append(blk)
        return out

    def _regulariser(self, p, p_prev, rho):
        mean, w = self.model.params.prior
        if not self.options.use_prior:
            w = np.zeros_like(w)
        f = self.free
        dz, dm = p[f] - p_prev[f], w[f] * (p[f] - mean[f])
        g = np.zeros_like(p)
        g[f] = 2 * rho * dz + w[f] * dm
        return rho * dz @ dz + 0.5 * dm @ dm, g

    # --- public --------------------------------------------------------------------------------
    def objective(self, theta_vec, data, xs, theta_prev=None, rho_theta: float | None = None,
                  weights=None, *, gradient: bool = False):
        """Full learning objective F at ``theta_vec``, optionally with its gradient.

        Parameters
        ----------
        theta_vec : numpy.ndarray
            (n_p,) flat parameter vector.
        data : Trajectories
            The trajectories.
        xs : list of numpy.ndarray
            Fixed states (T_b, nx).
        theta_prev : numpy.ndarray, optional
            Trust-region centre (default ``theta_vec``).
        rho_theta : float, optional
            Trust-region weight (default ``options.rho_theta``).
        weights : numpy.ndarray, optional
            (B,) scales of each trajectory's terms.
        gradient : bool
            Also return dF/dp (n_p,) (zero on fixed entries).

        Returns
        -------
        float or (float, numpy.ndarray)
        """
        rho = self.options.rho_theta if rho_theta is None else rho_theta
        p = np.asarray(theta_vec, float)
        obs, dyn = self._columns(data, xs, weights)
        return self._full(p, np.asarray(p if theta_prev is None else theta_prev, float), rho, obs, dyn, gradient)

    def _full(self, p, p_prev, rho, obs, dyn, gradient=False):
        C = self.options.chunk
        n_obs, n_dyn = obs[0].shape[1], dyn[0].shape[1]
        C = min(C, max(n_obs, n_dyn))
        fc, fg = self._functions(C)
        f, g = (fg if gradient else fc), np.zeros_like(p)
        total = 0.0
        for s in range(0, max(n_obs, n_dyn), C):
            io, idn = np.arange(s, min(s + C, n_obs)), np.arange(s, min(s + C, n_dyn))
            out = f(p, 1.0, 1.0, *self._take(obs, io, C), *self._take(dyn, idn, C))
            total += _scalar(out[0]) + _scalar(out[1])
            if gradient:
                g += np.asarray(out[2]).ravel()
        reg, greg = self._regulariser(p, p_prev, rho)
        g[np.setdiff1d(np.arange(p.size), self.free)] = 0.0
        return (total + reg, g + greg) if gradient else total + reg

    def solve(self, theta_vec: np.ndarray, data, xs: list[np.ndarray], rho_theta: float | None = None,
              weights=None) -> LearnResult:
        """Adam passes over the stages of ``data`` for fixed states, from ``theta_vec``.

        Parameters
        ----------
        theta_vec : numpy.ndarray
            (n_p,) start and trust-region centre.
        data : Trajectories
            The trajectories.
        xs : list of numpy.ndarray
            Fixed states (T_b, nx).
        rho_theta : float, optional
            Trust-region weight (default ``options.rho_theta``).
        weights : numpy.ndarray, optional
            (B,) scales of each trajectory's terms.

        Returns
        -------
        LearnResult
            The full flat vector; the start when the passes did not lower F.
        """
        o = self.options
        rho = o.rho_theta if rho_theta is None else rho_theta
        t0 = time.perf_counter()
        p0 = np.asarray(theta_vec, float).copy()
        obs, dyn = self._columns(data, xs, weights)
        n_obs, n_dyn = obs[0].shape[1], dyn[0].shape[1]
        B = min(o.batch_size, max(n_obs, n_dyn))
        _, fg = self._functions(B)
        params, free = self.model.params, self.free
        lo, hi = params.lower[free], params.upper[free]
        lr_vec = np.where(self.dynamics_mask, o.lr_dynamics, o.lr_observation)[free]
        F0 = self._full(p0, p0, rho, obs, dyn)
        p, m, v, k = p0.copy(), np.zeros(free.size), np.zeros(free.size), 0
        steps = max(1, -(-n_obs // B))
        for epoch in range(o.epochs):
            perm_o, perm_d = self._rng.permutation(n_obs), self._rng.permutation(n_dyn)
            scale = 1.0 / (1.0 + o.decay * epoch)
            for s in range(steps):
                io = perm_o[s * B:(s + 1) * B] if n_obs else perm_o
                idn = perm_d[s * B:(s + 1) * B]
                if len(idn) == 0:                     # fewer dynamics than observation columns
                    idn = perm_d[:B]
                # the unbiased estimate divides by the number of real (non-padded) columns
                so_k = n_obs / max(len(io), 1)
                sd_k = n_dyn / max(len(idn), 1)
                _, _, g = fg(p, so_k, sd_k, *self._take(obs, io, B), *self._take(dyn, idn, B))
                _, greg = self._regulariser(p, p0, rho)
                g = (np.asarray(g).ravel() + greg)[free]
                if not np.all(np.isfinite(g)):
                    raise NonFiniteError(f"AdamLearner: non-finite gradient at epoch {epoch}, step {s}")
                k += 1
                step, m, v = adam_step(g, m, v, k, scale * lr_vec, beta1=o.beta1, beta2=o.beta2, eps=o.eps)
                p[free] = np.clip(p[free] - step, lo, hi)
        F1 = self._full(p, p0, rho, obs, dyn)
        # never worse than the start (the shared best-iterate rule; no slack: a step must lower F)
        p, F1, which = BestIterate(p0, F0, rtol=0.0).choose(p, F1, label="the last Adam step")
        kept = which == "returning the last Adam step"
        if not kept:
            log.info("AdamLearner: %d steps did not lower F; %s", k, which)
        wall = time.perf_counter() - t0
        log.info("AdamLearner: %d steps, F %.6g -> %.6g, %.2fs", k, F0, F1, wall)
        status = "Solve_Succeeded" if kept else "Search_Direction_Becomes_Too_Small"
        return LearnResult(p, float(F1), status, True, k, wall)
