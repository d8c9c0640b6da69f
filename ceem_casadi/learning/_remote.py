"""The learning step with the data terms map-reduced over shards: IPOPT (after plain Newton steps) on the
client, each callback one round of small tasks (docs/long_records.md, "Learning over long records")."""
from __future__ import annotations

import time

import casadi as ca
import numpy as np

from ..objective._exact_sum import SplitSum, combine
from ..runtime._callbacks import SparsityCallback
from ..runtime._solve import ipopt_options, solve
from ._learner import LearnResult, prior_weights, step_result, symmetric
from ._newton import NEWTON_STEPS, newton_steps


def _total(items: list):
    """The client's sum of one term over the shards: exact for `SplitSum` parts, a plain
    sum in shard order for arrays, None for None."""
    if items[0] is None:
        return None
    if isinstance(items[0], SplitSum):
        return combine(items)
    return sum(items)


class _Call(SparsityCallback):
    """A CasADi Callback calling ``fn`` of dense numpy inputs; an exception is kept in ``owner._error`` (CasADi
    swallows exceptions raised in callbacks: the learner re-raises it after the solve)."""

    def __init__(self, owner, name, fn, sp_in, sp_out, names_in, names_out, opts=None):
        self.owner, self.fn = owner, fn
        super().__init__(name, sp_in, sp_out, names_in, names_out, opts)

    def eval(self, arg):
        try:
            return self.fn(*[np.asarray(a.full(), float).ravel() if a.numel() else None for a in arg])
        except Exception as exc:
            self.owner._error = self.owner._error or exc
            raise


class RemoteLearner:
    """IPOPT learning solver on the client; the data terms come from ``engine`` (built once per fit), which provides
    ``learning_session(theta_vec, xs)``, ``reduce(session, z, what) -> (per-shard results, bytes received)`` and
    ``record`` (see `ceem_casadi.distributed._tasks.ShardActor.terms`)."""

    def __init__(self, engine, model, options, hessian: str):
        self.engine, self.model, self.options, self.hessian = engine, model, options, hessian
        self.free = model.params.free_index
        self.n = n = self.free.size
        dense = ca.Sparsity.dense
        sp_in = [dense(n, 1), dense(3 * n + 1, 1)]
        f_cb = _Call(self, "remote_f", lambda z, p: [self._value(z, p, "f")[0]], sp_in, [dense(1, 1)],
                     ["x", "p"], ["f"], {"enable_fd": True})  # derivatives are built, never called
        g_cb = _Call(self, "remote_grad_f", lambda z, p: list(self._value(z, p, "grad")), sp_in,
                     [dense(1, 1), dense(n, 1)], ["x", "p"], ["f", "grad_f_x"])
        self._callbacks = [f_cb, g_cb]
        extra = {"grad_f": g_cb}
        if hessian == "limited-memory":
            extra["ipopt.hessian_approximation"] = "limited-memory"
        else:
            rows, cols = np.tril_indices(n)  # column-major upper triangle: (col, row) pairs
            self._diag = np.flatnonzero(rows == cols)
            h_cb = _Call(self, "remote_hess_lag", self._hess_lag, [*sp_in, dense(1, 1), ca.Sparsity(0, 1)],
                         [ca.Sparsity.upper(n)], ["x", "p", "lam_f", "lam_g"], ["triu_hess_gamma_x_x"])
            self._callbacks.append(h_cb)
            extra["hess_lag"] = h_cb
        z, p = ca.MX.sym("z", n), ca.MX.sym("p", 3 * n + 1)
        self.solver = ca.nlpsol("remote_learner", "ipopt", {"x": z, "p": p, "f": f_cb(z, p)},
                                ipopt_options(options.max_iters, options.tol, **extra))
        self._session, self._cache, self._costs, self._error = None, {}, {}, None

    # --- terms -----------------------------------------------------------------------------
    def _split(self, p):
        n = self.n
        return p[:n], p[n], p[n + 1:2 * n + 1], p[2 * n + 1:]

    def _remote(self, z, what):
        """Summed shard terms at ``z``: everything IPOPT may ask there is fetched in one round
        (what = "all"; a rejected trial point wastes its gradient and Hessian)."""
        key = (what, z.tobytes())
        if key not in self._cache:
            t0 = time.perf_counter()
            res, received = self.engine.reduce(self._session, z, what)
            self._trips += 1
            self._wait += time.perf_counter() - t0
            self._slowest += max(r[-1] for r in res)
            self._store(key, res, received)
        return self._cache[key]

    def _store(self, key, res, received: int) -> None:
        """The shards' terms ``res`` of one round (``received`` bytes) summed into the cache at ``(what, z bytes)``."""
        self._calls, self._received = self._calls + 1, self._received + received
        self._shard_s += np.array([r[-1] for r in res])
        parts = [r[:-1] for r in res]
        totals = [_total([p[i] for p in parts]) for i in range(len(parts[0]))]
        if key[0] != "hess":  # the cost first, as a float
            totals[0] = float(totals[0][0])
        self._cache[key] = tuple(totals)

    def cost_at(self, z) -> float | None:
        """The summed data terms' cost at ``z`` (n_free,) when the last learning session evaluated it, else None."""
        return self._costs.get(z.tobytes())

    def _fetch(self, z, what: str) -> str:
        """What to fetch at ``z`` when IPOPT asks for ``what`` ("f" or "grad"): everything in one round with a
        Hessian; limited-memory: the cost alone at trial points (docs/long_records.md)."""
        if self.hessian != "limited-memory":
            return "all"
        if what == "f" and ("grad", z.tobytes()) in self._cache:
            return "grad"
        return what

    def _value(self, z, p, what):
        z_prev, rho, mu, w = self._split(p)
        dz, dm = z - z_prev, z - mu
        reg = rho * dz @ dz + 0.5 * (w * dm) @ (w * dm)
        terms = self._remote(z, self._fetch(z, what))
        if what == "f":
            return (terms[0] + reg,)
        return terms[0] + reg, terms[1] + 2 * rho * dz + w ** 2 * dm

    def _hess_lag(self, z, p, lam_f, lam_g):
        _, rho, _, w = self._split(p)
        h = self._remote(z, "all")[2].copy()  # the summed data terms' Hessian triangle
        h[self._diag] += 2 * rho + w ** 2
        return [ca.DM(ca.Sparsity.upper(self.n), float(lam_f[0]) * h)]

    def _p(self, theta_vec, rho):
        mean, w = prior_weights(self.model, self.options.use_prior)
        return np.concatenate([np.asarray(theta_vec, float)[self.free], [rho], mean[self.free], w[self.free]])

    def _begin(self, theta_vec, xs):
        t0 = time.perf_counter()
        self._session, self._cache, self._error = self.engine.learning_session(theta_vec, xs), {}, None
        self._setup_s = time.perf_counter() - t0
        self._calls, self._trips, self._wait, self._received, self._slowest = 0, 0, 0.0, 0, 0.0
        self._shard_s = np.zeros(len(self._session))
        first = getattr(self.engine, "first_round", lambda: None)()  # computed with the states (Dask)
        if first is not None:
            self._store((first[1], first[0].tobytes()), first[2], first[3])

    def _end(self, t0):
        self.engine.record("learn", t0, self._shard_s, getattr(self.engine, "session_sent", 0)
                           + 8 * self.n * self._trips * len(self._session), self._received, calls=self._calls,
                           trips=self._trips, wait_s=self._wait, setup_s=self._setup_s, slowest_s=self._slowest)
        self._costs = {k[1]: v[0] for k, v in self._cache.items() if k[0] != "hess"}
        self._session, self._cache = None, {}

    # --- the learner interface ---------------------------------------------------------------
    def solve(self, theta_vec, data, xs, rho_theta: float | None = None, weights=None) -> LearnResult:
        """As [`ceem_casadi.learning.Learner.solve`][ceem_casadi.learning.Learner.solve] (``weights`` are not supported here)."""
        if weights is not None:
            raise NotImplementedError("weights are not supported by the distributed learner; run without executor")
        rho = self.options.rho_theta if rho_theta is None else rho_theta
        params = self.model.params
        t0 = time.perf_counter()
        z0, lower, upper = np.asarray(theta_vec, float)[self.free], params.lower[self.free], params.upper[self.free]
        self._begin(theta_vec, xs)
        p = self._p(theta_vec, rho)
        try:  # Newton steps while they work (docs/long_records.md), else IPOPT from the last of them
            z, cost, steps = self._newton(z0, p, lower, upper)
            sol = None if cost is not None else solve(self.solver, x0=z, p=p, lbx=lower, ubx=upper)
        except RuntimeError:
            if self._error is None:
                raise
        finally:
            self._end(t0)
        if self._error is not None:
            raise self._error
        return step_result(self.solver, sol, theta_vec, self.free, z, cost, steps, t0)

    def _newton(self, z, p, lower, upper):
        """`newton_steps` on the summed terms (with the remote engine, each round fetches cost,
        gradient and Hessian together; the pieces' cost and gradient, then the Hessian)."""
        if self.hessian == "limited-memory":
            return z, None, 0
        reg = np.diag(2 * self._split(p)[1] + self._split(p)[3] ** 2)
        steps = min(NEWTON_STEPS, self.options.max_iters)
        return newton_steps(lambda z: self._value(z, p, "grad"),
                            lambda z: symmetric(self._remote(z, "all")[2], self.n) + reg,  # the summed triangle
                            z, lower, upper, self.options.tol, steps)

    def hessian_matrix(self, theta_vec, data, xs) -> np.ndarray | None:
        """As [`ceem_casadi.learning.Learner.hessian_matrix`][ceem_casadi.learning.Learner.hessian_matrix]: data terms + prior, no trust region."""
        if self.hessian == "limited-memory":
            return None
        t0 = time.perf_counter()
        self._begin(theta_vec, xs)
        try:
            z = np.asarray(theta_vec, float)[self.free]
            (h,) = self._remote(z, "hess")
        finally:
            self._end(t0)
        return symmetric(h, self.n) + np.diag(self._p(theta_vec, 0.0)[2 * self.n + 1:] ** 2)
