"""Learning step (M-step) by Adam on mini-batches for models with large neural-network parts, never returning
a point worse than its start (the derivation and figures: docs/model_learning_notes.md)."""
from __future__ import annotations

import logging
import time
import warnings

import casadi as ca
import numpy as np

from ..model._columns import check_columnwise
from ..model._nn import AdamOptions, adam_loop
from ..runtime._best import BestIterate
from ..runtime._numpy_eval import NumpyFunction
from ._learner import LearnResult, prior_weights, weighted_stage_columns

__all__ = ["AdamLearner", "AdamLearnerOptions", "AdamOptions"]

log = logging.getLogger(__name__)


def AdamLearnerOptions(**kwargs) -> AdamOptions:
    """Deprecated: [`AdamOptions`][ceem_casadi.learning.AdamOptions] (``lr_observation`` is its ``lr``;
    the old default ``lr_dynamics`` 5e-4 is kept).

    Parameters
    ----------
    **kwargs
        The fields of `AdamOptions`, with ``lr_observation`` for ``lr``.

    Returns
    -------
    AdamOptions

    Examples
    --------
    >>> import warnings
    >>> from ceem_casadi.learning import AdamLearnerOptions
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     o = AdamLearnerOptions(lr_observation=2e-3)
    >>> type(o).__name__, o.lr, o.lr_dynamics
    ('AdamOptions', 0.002, 0.0005)
    """
    warnings.warn("AdamLearnerOptions is deprecated: use AdamOptions (lr_observation is its lr)", DeprecationWarning,
                  stacklevel=2)
    if "lr_observation" in kwargs:
        kwargs["lr"] = kwargs.pop("lr_observation")
    kwargs.setdefault("lr_dynamics", 5e-4)
    return AdamOptions(**kwargs)


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
    """Mini-batch Adam learning step with the interface of [`Learner`][ceem_casadi.learning.Learner]
    (``iterations`` counts Adam steps, ``cost`` is the full objective F at the returned point).

    Parameters
    ----------
    model : StateSpaceModel
    options : AdamOptions, optional
        Step sizes, mini-batches, epochs (default 1 per learning step, no decay), trust region, priors.
    step, observe : callable, optional
        ``f`` and ``g`` written for (n, B) matrices (columns = samples), checked against
        ``model.f``/``model.g``; default: the model's Functions mapped over the columns.

    Raises
    ------
    ModelError
        ``step``/``observe`` fail on matrices or differ from the model's functions.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> data, x = cc.simulate(model, {"a": 0.8}, [0.0], 200, u=np.random.default_rng(0).normal(size=(200, 1)),
    ...                       seed=1)
    >>> learner = cc.learning.AdamLearner(model, cc.learning.AdamOptions(lr=0.05, epochs=30, batch_size=50))
    >>> res = learner.solve(np.array([0.5]), data, x)
    >>> round(float(res.theta_vec[0]), 1)               # from 0.5 towards the truth 0.8
    0.8
    """

    chunk = 8192  # columns per forward chunk of the full objective (helicopter size: 2.8 ms by numpy)

    def __init__(self, model, options: AdamOptions | None = None, *, step=None, observe=None):
        options = AdamOptions() if options is None else options
        if not isinstance(options, AdamOptions):
            raise TypeError(f"options must be an AdamOptions, got {type(options).__name__}")
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

    @staticmethod
    def _take(cols, idx, B):
        """Columns ``idx`` of each array, zero-padded to B columns (zero weight)."""
        return [np.pad(a[:, idx], ((0, 0), (0, B - len(idx)))) for a in cols]

    def _regulariser(self, p, p_prev, rho):
        mean, w = prior_weights(self.model, self.options.use_prior)
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
        theta_vec, data, xs, rho_theta, weights
            As for [`Learner.solve`][ceem_casadi.learning.Learner.solve].
        theta_prev : numpy.ndarray, optional
            Trust-region centre (default ``theta_vec``).
        gradient : bool
            Also return dF/dp (n_p,) (zero on fixed entries).

        Returns
        -------
        float or (float, numpy.ndarray)
        """
        rho = self.options.rho_theta if rho_theta is None else rho_theta
        p = np.asarray(theta_vec, float)
        obs, dyn = weighted_stage_columns(self.model, data, xs, weights)
        return self._full(p, np.asarray(p if theta_prev is None else theta_prev, float), rho, obs, dyn, gradient)

    def _full(self, p, p_prev, rho, obs, dyn, gradient=False):
        n_obs, n_dyn = obs[0].shape[1], dyn[0].shape[1]
        C = min(self.chunk, max(n_obs, n_dyn))
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
        theta_vec, data, xs, rho_theta, weights
            As for [`Learner.solve`][ceem_casadi.learning.Learner.solve].

        Returns
        -------
        LearnResult
            The full flat vector; the start when the passes did not lower F.
        """
        o = self.options
        rho = o.rho_theta if rho_theta is None else rho_theta
        t0 = time.perf_counter()
        p0 = np.asarray(theta_vec, float).copy()
        obs, dyn = weighted_stage_columns(self.model, data, xs, weights)
        n_obs, n_dyn = obs[0].shape[1], dyn[0].shape[1]
        B = min(o.batch_size, max(n_obs, n_dyn))
        _, fg = self._functions(B)
        params, free = self.model.params, self.free
        lo, hi = params.lower[free], params.upper[free]
        lr_dynamics = o.lr / 2 if o.lr_dynamics is None else o.lr_dynamics
        lr_vec = np.where(self.dynamics_mask, lr_dynamics, o.lr)[free]
        epochs, decay = o.schedule(1, 0.0)
        F0 = self._full(p0, p0, rho, obs, dyn)
        steps = max(1, -(-n_obs // B))

        def batches(epoch):
            perm_o, perm_d = self._rng.permutation(n_obs), self._rng.permutation(n_dyn)
            for s in range(steps):
                io = perm_o[s * B:(s + 1) * B] if n_obs else perm_o
                idn = perm_d[s * B:(s + 1) * B]
                yield io, (idn if len(idn) else perm_d[:B])  # fewer dynamics than observation columns

        def grad(z, batch):
            io, idn = batch
            p = p0.copy()
            p[free] = z
            # the unbiased estimate divides by the number of real (non-padded) columns
            _, _, g = fg(p, n_obs / max(len(io), 1), n_dyn / max(len(idn), 1), *self._take(obs, io, B),
                         *self._take(dyn, idn, B))
            return (np.asarray(g).ravel() + self._regulariser(p, p0, rho)[1])[free]

        z, k = adam_loop(p0[free], grad, batches, lr_vec, epochs=epochs, decay=decay,
                         project=lambda z: np.clip(z, lo, hi), name="AdamLearner")
        p = p0.copy()
        p[free] = z
        # never worse than the start (the shared best-iterate rule; no slack: a step must lower F)
        p, F1, which = BestIterate(p0, F0, rtol=0.0).choose(p, self._full(p, p0, rho, obs, dyn),
                                                            label="the last Adam step")
        wall = time.perf_counter() - t0
        log.info("AdamLearner: %d steps, F %.6g -> %.6g, %.2fs; %s", k, F0, F1, wall, which)
        status = "Solve_Succeeded" if which == "returning the last Adam step" else "Search_Direction_Becomes_Too_Small"
        return LearnResult(p, float(F1), status, True, k, wall)
