"""Learning step (M-step) by IPOPT: the free parameters minimising -J (plus trust region and prior) for fixed
states, derivatives mapped from per-stage Functions (docs/model_learning_notes.md)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import casadi as ca
import numpy as np

from ..learning._options import LearnerOptions
from ..objective._stages import StageFunctions, stack_stages
from ..runtime._compile import compile_or_none, compiler
from ..runtime._result import Result
from ..runtime._solve import ACCEPTABLE, grad_f_function, hess_lag_function, ipopt_options, solve
from ._chunks import chunk_length, chunk_map, pack_columns
from ._gauss_newton import GaussNewtonHessian
from ._newton import NEWTON_STEPS, newton_steps

log = logging.getLogger(__name__)

# "auto" Hessian: exact while the per-stage exact Hessian program is at most this long
AUTO_EXACT_INSTRUCTIONS = 100_000


@dataclass(repr=False)
class LearnResult(Result):
    """Outcome of one learning step.

    Attributes
    ----------
    theta_vec : numpy.ndarray
        (n_p,) the full flat parameter vector (fixed entries unchanged).
    cost : float
        Final objective (-J without constants, minus the log-prior, plus the trust region).
    status : str
        Solver return status.
    success : bool
        An acceptable status and finite parameters.
    iterations : int
        Solver iterations (Adam: steps).
    wall_s : float
        Wall-clock seconds.

    Examples
    --------
    >>> from ceem_casadi.learning import LearnResult
    >>> LearnResult([0.8], 1.5, "Solve_Succeeded", True, 4, 0.01).status
    'Solve_Succeeded'
    """

    SUMMARY = ('status', 'iterations', 'cost')

    theta_vec: np.ndarray
    cost: float
    status: str
    success: bool
    iterations: int
    wall_s: float


def weighted_stage_columns(model, data, xs: list[np.ndarray], weights=None):
    """`stack_stages` plus the per-column inverse noise scales ``iv`` (ny, sum T_b) and ``iw``
    (nx, sum (T_b - 1)). ``weights`` (B,) scale each trajectory's squared residuals (e.g. SAEM
    weights), i.e. multiply its 1/sigma by sqrt(w); default 1."""
    (Xo, Uo, Yo, Mo), (X0, X1, U0) = stack_stages(data, xs)
    w = np.ones(len(xs)) if weights is None else np.asarray(weights, float)
    if w.shape != (len(xs),) or np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError(f"weights: expected {len(xs)} finite non-negative values, got {weights}")
    sq, noise = np.sqrt(w), model.noise
    iw = np.outer(noise.inv_process_std, np.repeat(sq, [T - 1 for T in data.lengths]))
    iv = np.outer(noise.inv_measurement_std, np.repeat(sq, data.lengths))
    return (Xo, Uo, Yo, Mo, iv), (X0, X1, U0, iw)


def learn_result(theta_vec, free: np.ndarray, z, cost, status: str, iterations: int, t0: float) -> LearnResult:
    """The `LearnResult` of a learning step started at ``time.perf_counter()`` ``t0``: ``theta_vec``
    (n_p,) with its ``free`` entries set to ``z``; successful when ``status`` is acceptable and all finite."""
    out = np.asarray(theta_vec, float).copy()
    out[free] = np.asarray(z, float).ravel()
    return LearnResult(out, float(cost), status, status in ACCEPTABLE and bool(np.all(np.isfinite(out))),
                       int(iterations), time.perf_counter() - t0)


def step_result(solver, sol, theta_vec, free: np.ndarray, z, cost, steps: int, t0: float) -> LearnResult:
    """`learn_result` after ``steps`` Newton steps: converged at ``z`` when ``cost`` is a float, else IPOPT's ``sol``."""
    if cost is not None:
        return learn_result(theta_vec, free, z, cost, "Solve_Succeeded", steps, t0)
    st = solver.stats()
    return learn_result(theta_vec, free, sol["x"], sol["f"], st["return_status"], st["iter_count"] + steps, t0)


def symmetric(triu_cols: np.ndarray, n: int) -> np.ndarray:
    """The symmetric (n, n) matrix of its column-major upper triangle ``triu_cols`` (n (n + 1) / 2,)."""
    H = np.zeros((n, n))
    rows, cols = np.tril_indices(n)  # (col, row) pairs of the column-major upper triangle
    H[cols, rows] = triu_cols
    return np.triu(H) + np.triu(H, 1).T


def prior_weights(model, use_prior: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, 1 / std)`` (n_p,) of the parameters' Gaussian priors; the weights zero without ``use_prior``."""
    mean, w = model.params.prior
    return mean, (w if use_prior else np.zeros_like(w))


def _hessian_kind(model, options: LearnerOptions, stages: StageFunctions | None):
    """``(kind, stages)``: the Hessian ``options.hessian`` resolves to (``"auto"``: exact while the
    per-stage exact Hessian program is short) and stage Functions that provide it."""
    kind = options.hessian
    if kind == "auto":
        base = stages if stages is not None and stages.hessian == "exact" else \
            StageFunctions(model, "exact", options.compile)
        names = ["dyn_p_hess"] + (["obs_p_hess"] if base.obs_uses_p else [])
        # cheap lower estimate first (cost length x parameters): an exact parameter Hessian
        # of a large model takes seconds to minutes just to build
        estimate = base.instructions(["dyn_cost", "obs_cost"]) * model.params.size
        if estimate > AUTO_EXACT_INSTRUCTIONS or base.instructions(names) > AUTO_EXACT_INSTRUCTIONS:
            kind = "gauss-newton"
        else:
            kind, stages = "exact", base
    # limited-memory needs only costs and gradients, which do not depend on the Hessian kind
    want = (stages.hessian if stages is not None else "gauss-newton") if kind == "limited-memory" else kind
    if stages is None or stages.hessian != want:
        stages = StageFunctions(model, want, options.compile)
    return kind, stages


class Learner:
    """Learning step (M-step): the IPOPT solver for one model and one set of trajectory lengths.

    Parameters
    ----------
    model : StateSpaceModel
    lengths : sequence of int
        The trajectory lengths T_b of the data it will learn from.
    options : LearnerOptions
    stages : StageFunctions, optional
        Stage Functions shared with a smoother (built from the model when None).
    columns : int, optional
        Stages per objective evaluation, for the automatic compilation of the stage Functions
        (default: this learner's own; a piece learner passes its record's).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1)
    >>> data, x = cc.simulate(model, {"a": 0.8}, [0.0], 200, u=np.ones((200, 1)), process_std=0.1, seed=1)
    >>> res = cc.learning.Learner(model, data.lengths, cc.LearnerOptions(compile=False)).solve([0.5], data, x)
    >>> round(float(res.theta_vec[0]), 1)               # a for the true states
    0.8
    """

    def __init__(self, model, lengths, options: LearnerOptions = LearnerOptions(),
                 stages: StageFunctions | None = None, columns: int | None = None):
        t0 = time.perf_counter()
        self.model, self.options, self.lengths = model, options, tuple(lengths)
        self.hessian, stages = _hessian_kind(model, options, stages)
        self.free = model.params.free_index
        nx, ny, n_obs, n_dyn = model.nx, model.ny, sum(self.lengths), sum(T - 1 for T in self.lengths)
        # the terms of the objective: (prefix, stages, residual rows, per-stage column arrays)
        terms = ([("dyn", n_dyn, nx, ["X0", "X1", "U0", "iw"])] if stages.dyn_uses_p else []) + \
                ([("obs", n_obs, ny, ["Xo", "Uo", "Yo", "Mo", "iv"])] if stages.obs_uses_p else [])
        self._chunk = chunk_length(n_dyn)  # long records: chunk-major data (learner_chunks)
        z, P = self._symbols(terms, n_obs, n_dyn)
        cost, cost_sx, cost_g, grad, hess, jacs, diag = self._objective(z, terms, stages, columns)
        extra = {"grad_f": grad_f_function(z, P, cost_g, grad)}
        if self.hessian == "limited-memory":
            extra["ipopt.hessian_approximation"] = "limited-memory"
        elif self.hessian == "exact":
            extra["hess_lag"] = hess_lag_function(z, P, ca.triu(hess))
            self._hess_fun = ca.Function("learn_hess", [z, P], [ca.densify(hess)])
        else:
            jac_fun = ca.Function("stage_jacobians", [z, P], [*jacs, diag])
            stacked = [(nr, self._padded(n)) for _, n, nr, _ in terms]  # incl. padding
            self._hess_callback = GaussNewtonHessian(jac_fun, stacked, self.free, model.params.size)
            extra["hess_lag"] = self._hess_callback
        self.solver = ca.nlpsol("learner", "ipopt", {"x": z, "p": P, "f": cost_sx},
                                ipopt_options(options.max_iters, options.tol, **extra))
        self.cost_function = ca.Function("learn_cost", [z, P], [cost])
        self._graph = (z, P, [(prefix, n, cols) for prefix, n, _, cols in terms], stages)
        self._stage_terms: dict[tuple, ca.Function] = {}
        self.build_s = time.perf_counter() - t0

    def _padded(self, n: int) -> int:
        """Stages of a term of ``n`` stages in the chunk-major layout (n itself without chunks)."""
        L = self._chunk
        return -(-n // L) * L if L else n

    def _symbols(self, terms, n_obs: int, n_dyn: int):
        """The NLP's symbols ``z`` (n_free,) and ``P`` (all data, noise weights, trust region, prior
        stacked); sets ``slots`` (name -> slice of P), the split ``_s`` and ``_p`` (n_p,) = p(z)."""
        model, L, nfree = self.model, self._chunk, self.free.size
        nx, nu, ny, npar = model.nx, model.nu, model.ny, model.params.size
        small = dict(z_prev=ca.MX.sym("z_prev", nfree), rho=ca.MX.sym("rho"), mu=ca.MX.sym("mu", nfree),
                     w=ca.MX.sym("w", nfree))
        rows = dict(Xo=nx, Uo=nu, Yo=ny, Mo=ny, X0=nx, X1=nx, U0=nu, iw=nx, iv=ny)
        if L:
            data = {f"{k}_data": ca.MX.sym(f"{k}_data", self._padded(n) * sum(rows[c] for c in cols))
                    for k, n, _, cols in terms}
        else:  # per-stage columns: observation terms over n_obs stages, dynamics terms over n_dyn
            data = {k: ca.MX.sym(k, r, n_obs if k in ("Xo", "Uo", "Yo", "Mo", "iv") else n_dyn)
                    for k, r in rows.items()}
        syms = {"p_base": ca.MX.sym("p_base", npar), **data, **small}
        self._names = list(syms)
        sizes = [v.numel() for v in syms.values()]
        # where each part lies in the NLP parameter vector: name -> slice (parameter_vector's layout)
        self.slots = {k: slice(a, a + n) for k, a, n in zip(self._names, np.cumsum([0] + sizes[:-1]), sizes)}
        z, P = ca.MX.sym("z", nfree), ca.MX.sym("P", sum(sizes))
        parts = ca.vertsplit(P, np.concatenate([[0], np.cumsum(sizes)]).tolist())
        self._s = s = {k: ca.reshape(part, v.shape[0], v.shape[1]) for (k, v), part in zip(syms.items(), parts)}
        E = ca.DM(ca.Sparsity.triplet(npar, nfree, self.free.tolist(), list(range(nfree))), 1.0)
        self._p = s["p_base"] + ca.mtimes(E, z)
        # chunk-major data: (c, K), one column per chunk
        self._blocks = {k: ca.reshape(s[f"{k}_data"], s[f"{k}_data"].numel() // -(-n // L), -(-n // L))
                        for k, n, _, _ in terms} if L else {}
        return z, P

    def _over_stages(self, fun, prefix, n, cols, reduce=True):
        """``fun`` over the n stages of a term (``p`` shared by them), outputs summed (``reduce``) or stacked; a list
        of bools: per output."""
        L, p, p_index = self._chunk, self._p, 4 if prefix == "obs" else 3
        flags = list(reduce) if isinstance(reduce, (list, tuple)) else [bool(reduce)] * fun.n_out()
        if not L:
            args = [self._s[c] for c in cols]
            args.insert(p_index, p)
            return fun.map(n, [name == "p" for name in fun.name_in()], flags)(*args)
        # padded stages add exact zeros (zero weights), stacked or summed
        K, block = -(-n // L), self._blocks[prefix]
        out = [chunk_map(fun, p_index, L, K, flag, block, p)[i] for i, flag in enumerate(flags)] \
            if len(set(flags)) > 1 else chunk_map(fun, p_index, L, K, flags[0], block, p)
        return out[0] if len(out) == 1 else out

    def _objective(self, z, terms, stages, columns):
        """The objective's expressions in ``z``: cost (compiled stages), cost_sx (the NLP's, raw SX
        stages), cost_g and grad (one pass), the exact Hessian or the stage Jacobians, diag (n_free,)."""
        s, kind, free = self._s, self.hessian, self.free.tolist()
        dz = z - s["z_prev"]
        diag = 2 * s["rho"] + s["w"] ** 2
        cost = s["rho"] * ca.sumsqr(dz) + 0.5 * ca.sumsqr(s["w"] * (z - s["mu"]))
        grad = 2 * s["rho"] * dz + s["w"] ** 2 * (z - s["mu"])
        hess, jacs = ca.diag(diag), []
        cost_sx = cost  # the NLP's objective expression must stay differentiable by CasADi
        cost_g = cost  # grad_f's cost: from the gradient's own pass (a cost map beside it cost 1/3 more)
        for prefix, n, _, cols in terms:
            fcost, fgrad = stages.get(f"{prefix}_cost", f"{prefix}_p_grad", columns=columns or n)
            cost = cost + self._over_stages(fcost, prefix, n, cols)
            cost_sx = cost_sx + self._over_stages(getattr(stages, f"{prefix}_cost"), prefix, n, cols)
            stage_cost, stage_grad = self._over_stages(fgrad, prefix, n, cols)
            cost_g, grad = cost_g + stage_cost, grad + stage_grad[free]
            if kind == "exact":
                (fhess,) = stages.get(f"{prefix}_p_hess", columns=columns or n)
                hess = hess + self._over_stages(fhess, prefix, n, cols)[free, free]
            elif kind == "gauss-newton":
                (fjac,) = stages.get(f"{prefix}_p_jac", columns=columns or n)
                jacs.append(self._over_stages(fjac, prefix, n, cols, reduce=False))
        return cost, cost_sx, cost_g, grad, hess, jacs, diag

    def stage_terms_function(self, gradient: str = "none", hessian: bool = False) -> ca.Function:
        """``(z, P) -> terms (rows, N)[, gradient (n_free, 1)]``: each stage's data terms unsummed (one
        column per stage, dynamics first; no trust region, no prior): the cost, with ``gradient="rows"``
        its gradient (n_free rows) and with ``hessian`` the exact Hessian's upper triangle (column-major);
        ``gradient="summed"``: the gradient summed as a second output. Built on first use."""
        key = (gradient, bool(hessian))
        if gradient not in ("none", "rows", "summed"):
            raise ValueError(f"gradient must be 'none', 'rows' or 'summed', got {gradient!r}")
        if hessian and (self.hessian != "exact" or gradient != "rows"):
            raise ValueError(f"per-stage Hessians need an exact-Hessian learner and gradient='rows', "
                             f"got {self.hessian!r} and {gradient!r}")
        if key not in self._stage_terms:
            z, P, calls, stages = self._graph
            over_stages = self._over_stages
            free = self.free.tolist()
            rows, cols = np.tril_indices(len(free))  # (col, row) pairs of the column-major upper triangle
            blocks, grads = [], []
            for prefix, n, cols_of in calls:
                # the solver's stage Functions (compiled as a group when compilation is on)
                fcost, fgrad = stages.get(f"{prefix}_cost", f"{prefix}_p_grad")
                if gradient == "summed":  # costs unsummed, the gradient summed, in one pass
                    cost, grad = over_stages(fgrad, prefix, n, cols_of, reduce=[False, True])
                    blocks.append(cost)
                    grads.append(grad[free])
                    continue
                if gradient == "none":
                    blocks.append(over_stages(fcost, prefix, n, cols_of, reduce=False))
                    continue
                # one SX program per stage (an MX wrapper mapped over 10^5 stages is interpreted per stage)
                fgrad = getattr(stages, f"{prefix}_p_grad")
                a = [ca.SX.sym(f"a{i}", fgrad.sparsity_in(i)) for i in range(fgrad.n_in())]
                out = fgrad.call(a)
                parts = [out[0], out[1][free]]
                if hessian:
                    H = getattr(stages, f"{prefix}_p_hess").call(a)[0][free, free]
                    parts.append(ca.vertcat(*[H[c, r] for r, c in zip(rows, cols)]))
                stage = self._compiled(ca.Function(f"{prefix}_stage_terms", a, [ca.cse(ca.densify(ca.vertcat(*parts)))],
                                                   fgrad.name_in(), ["terms"]))
                blocks.append(over_stages(stage, prefix, n, cols_of, reduce=False))
            outs = [ca.horzcat(*blocks)] + ([ca.densify(sum(grads))] if grads else [])
            self._stage_terms[key] = ca.Function("stage_terms", [z, P], outs)
        return self._stage_terms[key]

    def _compiled(self, fun: ca.Function) -> ca.Function:
        """``fun`` compiled unless ``options.compile`` is False or no compiler exists (then, and when
        compilation fails, the SX Function itself); cached per machine like the stage Functions."""
        want = self.options.compile
        if want is False or (want is None and compiler() is None):
            return fun
        out = compile_or_none([fun], f"ceem_{self.model.name}_learn", log, "per-stage learning terms",
                              strict=bool(want))
        return fun if out is None else out[0]

    def parameter_vector(self, theta_vec, data, xs, rho: float, weights=None) -> np.ndarray:
        """The NLP parameter of a learning solve (data columns, noise weights, trust-region centre)."""
        (Xo, Uo, Yo, Mo, iv), (X0, X1, U0, iw) = weighted_stage_columns(self.model, data, xs, weights)
        base = np.asarray(theta_vec, float).copy()
        base[self.free] = 0.0
        mean, w = prior_weights(self.model, self.options.use_prior)
        vals = dict(p_base=base, Xo=Xo, Uo=Uo, Yo=Yo, Mo=Mo, X0=X0, X1=X1, U0=U0, iw=iw, iv=iv,
                    z_prev=np.asarray(theta_vec, float)[self.free], rho=np.array([rho]),
                    mu=mean[self.free], w=w[self.free])
        if self._chunk:  # zero padding for outputs, masks and noise weights, else the last column
            if "dyn_data" in self._names:
                vals["dyn_data"] = pack_columns([X0, X1, U0, iw], [False, False, False, True], self._chunk)
            if "obs_data" in self._names:
                vals["obs_data"] = pack_columns([Xo, Uo, Yo, Mo, iv], [False, False, True, True, True], self._chunk)
        return np.concatenate([np.asarray(vals[k], float).ravel(order="F") for k in self._names])

    def hessian_matrix(self, theta_vec, data, xs) -> np.ndarray | None:
        """The learning objective's Hessian (n_free, n_free) over the free parameters at
        ``theta_vec`` for fixed states ``xs``, without the trust region (prior included when
        ``use_prior``); ``None`` for a limited-memory learner (it has no Hessian)."""
        P = ca.DM(self.parameter_vector(theta_vec, data, xs, 0.0))
        return self._hessian(np.asarray(theta_vec, float)[self.free], P)

    def _hessian(self, z: np.ndarray, P) -> np.ndarray | None:
        """The objective Hessian (n_free, n_free) at ``z`` (trust region and prior as in ``P``);
        None for a limited-memory learner."""
        if self.hessian == "exact":
            return np.asarray(self._hess_fun(z, P))
        if self.hessian == "gauss-newton":
            H = np.asarray(ca.DM(self._hess_callback(z, P, 1.0, ca.DM(0, 1))).full())
            return np.triu(H) + np.triu(H, 1).T
        return None

    def solve(self, theta_vec: np.ndarray, data, xs: list[np.ndarray], rho_theta: float | None = None,
              weights=None) -> LearnResult:
        """Learn the free parameters for fixed states, warm-started at ``theta_vec``: plain Newton steps
        near the optimum (``iterations`` counts them), IPOPT from their last iterate when they stop working.

        Parameters
        ----------
        theta_vec : numpy.ndarray
            (n_p,) start and trust-region centre.
        data : Trajectories
            The trajectories (lengths as given to the constructor).
        xs : list of numpy.ndarray
            Fixed states (T_b, nx).
        rho_theta : float, optional
            Trust-region weight; default ``options.rho_theta``.
        weights : numpy.ndarray, optional
            (B,) scales of each trajectory's terms of J (e.g. SAEM weights); default 1.

        Returns
        -------
        LearnResult
            With the full flat parameter vector.
        """
        rho = self.options.rho_theta if rho_theta is None else rho_theta
        # one conversion for the start test and the solve (~0.2 s per 10^6 entries)
        P = ca.DM(self.parameter_vector(theta_vec, data, xs, rho, weights))
        params = self.model.params
        t0 = time.perf_counter()
        z0, lower, upper = np.asarray(theta_vec, float)[self.free], params.lower[self.free], params.upper[self.free]
        z, cost, steps = self._newton(z0, P, lower, upper)  # near the optimum: Newton (learning/_newton.py)
        sol = None if cost is not None else solve(self.solver, x0=z, p=P, lbx=lower, ubx=upper)
        return step_result(self.solver, sol, theta_vec, self.free, z, cost, steps, t0)

    def _newton(self, z, P, lower, upper):
        """`newton_steps` with the solver's own cost, gradient and Hessian (trust region and prior
        as in ``P``); none for a limited-memory learner."""
        if self.hessian == "limited-memory":
            return z, None, 0
        grad_f = self.solver.get_function("nlp_grad_f")

        def value(z):
            f, g = grad_f(z, P)
            return float(f), np.asarray(ca.DM(g).full(), float).ravel()

        steps = min(NEWTON_STEPS, self.options.max_iters)
        return newton_steps(value, lambda z: self._hessian(z, P), z, lower, upper, self.options.tol, steps)
