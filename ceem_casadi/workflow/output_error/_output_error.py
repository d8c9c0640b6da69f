"""Output-error identification ([`refine_output_error`][ceem_casadi.refine_output_error]) and its
IPOPT solver: one NLP on the engine's problem and its chunked sensitivities (docs/output_error.md)."""
from __future__ import annotations

import time

import casadi as ca
import numpy as np

from ...errors import ShapeError
from ...io._data import Trajectories
from ...io._validate import check_data
from ...model._params import Theta
from ...runtime._best import BestIterate
from ...runtime._callbacks import SparsityCallback
from ...runtime._checks import count
from ...runtime._model_cache import cached
from ...runtime._solve import deadline, deadline_after, expired, ipopt_options, ipopt_solver, solve
from ...runtime._status import Status
from .._initial_state import estimate_initial_state
from .._starts import resolve_starts
from ._fit import COMPILE_SAMPLES, initial_states, output_error_least_squares
from ._least_squares import output_error_problem
from ._lm import box_bounds, exploding_guard, half_squared_norm
from ._output_error_options import OutputErrorOptions, OutputErrorResult, raise_if_failed

__all__ = ["refine_output_error"]


class _Call(SparsityCallback):
    """A Callback evaluating ``fun(*inputs as flat arrays) -> outputs (their nonzeros)``."""

    def __init__(self, fun, name, sp_in, sp_out, names_in, names_out):
        self.fun = fun
        super().__init__(name, sp_in, sp_out, names_in, names_out)

    def eval(self, arg):
        out = self.fun(*(np.asarray(a.full(), float).ravel() for a in arg))
        return [ca.DM(sp, np.asarray(v, float).ravel()) for sp, v in zip(self.sp_out, out)]


class OutputErrorProblem:
    """The IPOPT NLP of one model, set of lengths and shooting (built once): objective, gaps, gradient
    ``J^T r``, gap Jacobian and Gauss-Newton Hessian ``J^T J`` all from the engine's chunked forward
    sensitivities (`OutputErrorLeastSquares.evaluate`): nothing rollout-sized is built symbolically."""

    def __init__(self, model, lengths, shooting, options: OutputErrorOptions, compiled: bool):
        self.model, self.lengths, self.shooting = model, tuple(lengths), shooting
        # the one problem definition: the residuals, gaps and sensitivities of the Levenberg-Marquardt engine
        self.lsq = lsq = output_error_problem(model, self.lengths, shooting, compiled)
        self.free, self.segs, self.ng = lsq.free, lsq.segs, lsq.n_con
        nw, ng, nf, nx = lsq.nw, lsq.n_con, lsq.free.size, model.nx
        # J^T J (upper triangle): dense in the parameter rows, one block per node (a residual sees one node)
        zr, zc = np.triu_indices(nf, 0, nw)
        br, bc = np.triu_indices(nx)
        off = nf + nx * np.arange(len(self.segs))[:, None]
        hess = ca.Sparsity.triplet(nw, nw, np.r_[zr, (off + br).ravel()].tolist(),
                                   np.r_[zc, (off + bc).ravel()].tolist())
        # gap k (the order of OutputErrorLeastSquares' gaps) = end of segment i - node i + 1
        gaps = [i for _, idx in lsq.groups for i in idx if self.segs[i][3]]
        rows = [k * nx + a for k in range(len(gaps)) for a in range(nx) for _ in range(nf + nx + 1)]
        cols = [c for i in gaps for a in range(nx)
                for c in [*range(nf), *range(nf + i * nx, nf + i * nx + nx), nf + (i + 1) * nx + a]]
        jac = ca.Sparsity.triplet(ng, nw, rows, cols)
        self._hr, self._hc = (np.array(a, int) for a in hess.get_triplet())
        self._gr, self._gc = (np.array(a, int) for a in jac.get_triplet())
        x, p, one, gsp = (ca.Sparsity.dense(n, 1) for n in (nw, 0, 1, ng))
        self.callbacks = [
            _Call(self.cost_gaps, "oe_values", [x], [one, gsp], ["x"], ["f", "g"]),
            _Call(lambda w, p: self._derivatives(w)[:2], "grad_f", [x, p], [one, x], ["x", "p"], ["f", "grad_f_x"]),
            _Call(lambda w, p: self._derivatives(w)[2:4], "jac_g", [x, p], [gsp, jac], ["x", "p"], ["g", "jac_g_x"]),
            _Call(lambda w, p, lam_f, lam_g: [lam_f[0] * self._derivatives(w)[4]], "hess_lag", [x, p, one, gsp],
                  [hess], ["x", "p", "lam_f", "lam_g"], ["triu_hess_gamma_x_x"])]
        w = ca.MX.sym("w", nw)
        f, g = self.callbacks[0](w)
        # adaptive barrier: the monotone one crawled on Cascaded Tanks (docs/output_error.md, "IPOPT")
        extra = {"ipopt.mu_strategy": "adaptive", "no_nlp_grad": True,
                 **dict(zip(("grad_f", "jac_g", "hess_lag"), self.callbacks[1:]))}
        self.solver = ipopt_solver("output_error", {"x": w, "f": f, "g": g},
                                   ipopt_options(options.max_iters, options.tol, show_eval_warnings=False,
                                                 track=(nw, ng), **extra))

    def bind(self, model, theta_vec, data: Trajectories, use_prior: bool) -> None:
        """Bind the data (`OutputErrorLeastSquares.set_data`) and forget the cached evaluations."""
        self.lsq.set_data(model, theta_vec, data, use_prior)
        self._key = self._val = None
        self._values = (None, None)

    def cost_gaps(self, w) -> list:
        """``[0.5 ||r||^2 (prior rows included), gaps (ng,)]`` at ``w`` (NaN when not finite)."""
        w = np.asarray(w, float).ravel()
        if not np.array_equal(self._values[0], w):    # IPOPT asks for f and g at one point one by one
            out = self.lsq.evaluate(w, False)
            val = [np.nan, np.full(self.ng, np.nan)] if out is None else [half_squared_norm(out[0]), out[2]]
            self._values = (w, val)
        return self._values[1]

    def _derivatives(self, w) -> tuple:
        """``(cost, J^T r, gaps, gap Jacobian nonzeros, J^T J nonzeros)`` at ``w`` (the last one cached)."""
        if self._key is not None and np.array_equal(self._key, w):
            return self._val
        out = self.lsq.evaluate(w, True)
        if out is None:
            nan = np.full(self.lsq.nw, np.nan)
            val = (np.nan, nan, nan[:self.ng], np.full(self._gr.size, np.nan), np.full(self._hr.size, np.nan))
        else:
            r, J, g, G = out
            with np.errstate(over="ignore", invalid="ignore"):   # they overflow from an exploding start
                H, Jr = J.T @ J, J.T @ r
            val = (half_squared_norm(r), Jr, g, np.asarray(G.tocsr()[self._gr, self._gc]).ravel(),
                   np.asarray((H.tocsr() if hasattr(H, "tocsr") else H)[self._hr, self._hc]).ravel())
        self._key, self._val = np.array(w, float), val
        return val


def problem_for(model, lengths, shooting, options: OutputErrorOptions) -> OutputErrorProblem:
    """The cached `OutputErrorProblem` (per model, lengths, shooting, max_iters, tol)."""
    compiled = sum(lengths) >= COMPILE_SAMPLES
    key = (tuple(lengths), shooting, options.max_iters, options.tol, compiled)
    # per thread: an IPOPT solver's memory, statistics and tracking callback are its own
    return cached(model, "output-error problem", key,
                  lambda: OutputErrorProblem(model, lengths, shooting, options, compiled), per_thread=True)


# largest continuity gap of an iterate that may be returned (multiple shooting)
CONTINUITY_TOL = 1e-6


def _offer_resimulated(prob, model, theta_vec, data, w, lo, hi, tracker) -> None:
    """Offer ``tracker`` the iterate ``w``'s free parameters and initial states with every other
    node replaced by the free run from them (continuity met by construction)."""
    nf = prob.free.size
    th = theta_vec.copy()
    th[prob.free] = w[:nf]
    nodes = w[nf:].reshape(len(prob.segs), model.nx)
    x0 = nodes[prob.lsq.first_nodes()]
    with np.errstate(all="ignore"):
        resim = np.clip(prob.lsq.initial_nodes(model, th, data, x0).T, lo[:, None], hi[:, None])
    w_new = np.concatenate([w[:nf], resim.ravel(order="F")])
    cost, g = prob.cost_gaps(w_new)
    gap = float(np.max(np.abs(np.asarray(g))))
    tracker.offer(w_new, float(cost), gap, label="IPOPT's final parameters and initial states, the other "
                                                 "nodes re-simulated from them")


def refine_output_error(model, data: Trajectories, theta: Theta, *, shooting: int | None = None, x0=None,
                        starts=None, options: OutputErrorOptions = OutputErrorOptions()) -> OutputErrorResult:
    """Fit the free parameters and every trajectory's initial state by output (simulation) error
    (docs/output_error.md).

    Parameters
    ----------
    model : StateSpaceModel
        The model (its ``measurement_std`` weights the outputs).
    data : Trajectories
        The data (NaN = missing output).
    theta : dict
        Starting parameters (all names; fixed entries stay as given), e.g. a CE-EM fit's.
    shooting : int, optional
        ``None`` (single shooting) or the segment length k >= 1 of multiple shooting.
    x0 : numpy.ndarray, optional
        Starting initial states (B, nx) (or (nx,) for all); default
        [`estimate_initial_state`][ceem_casadi.estimate_initial_state] on the first ``options.x0_window`` samples.
    starts : int or list of dict, optional
        More starting parameter sets (possibly partial), ``solver="lm"`` only: the lowest
        objective over all starts is returned (``result.starts``: one row per start). An int n:
        n seeded log-uniform starts around ``theta`` within the bounds
        ([`log_uniform_starts`][ceem_casadi.workflow.log_uniform_starts], seed 0).
    options : OutputErrorOptions
        Iteration limit, tolerance, time limit, state bounds.

    Returns
    -------
    OutputErrorResult
        theta, x0 (B, nx), cost, status, message, iterations, wall time. On any stop the returned
        point is the best iterate (never above the start's objective); ``message`` says which.

    Raises
    ------
    SolverError
        With ``options.raise_on_failure``, when the fit fails (``solver_failed`` or ``diverged``).

    Examples
    --------
    Output-error (simulation-error) fit of a from the same start:

    >>> import numpy as np
    >>> import ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(
    ...     lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(60, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [0.0], 60, u=u, process_std=0.1,
    ...                       measurement_std=0.1, seed=1)
    >>> res = cc.refine_output_error(model, data, {"a": 0.5})
    >>> res.status, round(float(res.theta["a"]), 2), res.cost < res.initial_cost
    (<Status.CONVERGED: 'converged'>, 0.8, True)
    """
    if not isinstance(options, OutputErrorOptions):
        raise TypeError(f"options must be an OutputErrorOptions, got {type(options).__name__}")
    t0 = time.perf_counter()
    check_data(model, data)  # the type, the sizes, and the argument order (model, data, theta)
    theta = model.params.validate(theta)
    starts = resolve_starts(model, theta, starts)  # an int n: n seeded log-uniform starts (workflow/_starts.py)
    shooting = None if shooting is None else count(shooting, "shooting (None: single shooting, or a segment length)")
    if options.solver == "lm":
        res = output_error_least_squares(model, data, theta, shooting=shooting, x0=x0, starts=starts, options=options)
        return OutputErrorResult(res.theta, res.x0, res.cost, res.status, res.message, res.iterations, res.wall_s,
                                 res.initial_cost, res.constraint_violation, "lm", res.returned, res.starts, res.advice)
    if starts is not None:
        raise ShapeError("starts= needs solver='lm' (OutputErrorOptions(solver='lm'))")
    return _refine_with_ipopt(model, data, theta, shooting, x0, options, t0)


def _refine_with_ipopt(model, data, theta, shooting, x0, options, t0) -> OutputErrorResult:
    """[`refine_output_error`][ceem_casadi.refine_output_error] with ``solver="ipopt"``."""
    theta_vec = model.params.to_vector(theta)
    lo = box_bounds(options.x_lower, model.nx, -np.inf, "x_lower")
    hi = box_bounds(options.x_upper, model.nx, np.inf, "x_upper")
    expires = deadline_after(options.time_limit, t0)  # never beyond a deadline already in force
    with deadline(expires):
        if x0 is None:
            x0 = estimate_initial_state(model, data, theta_vec, window=options.x0_window, x_lower=lo, x_upper=hi)
        x0 = initial_states(x0, len(data), model.nx)
        prob = problem_for(model, data.lengths, None if shooting is None else int(shooting), options)
        free = prob.free
        prob.bind(model, theta_vec, data, options.use_prior)
        nodes = np.clip(prob.lsq.initial_nodes(model, theta_vec, data, x0).T, lo[:, None], hi[:, None])
        w0 = np.concatenate([theta_vec[free], nodes.ravel(order="F")])
        n_nodes = len(prob.segs)
        lbx = np.concatenate([model.params.lower[free], np.tile(lo, n_nodes)])
        ubx = np.concatenate([model.params.upper[free], np.tile(hi, n_nodes)])
        initial_cost = prob.cost_gaps(w0)[0]
        # the best feasible iterate IPOPT visits or the start: what any stop returns is never worse than either
        tracker = BestIterate(w0, initial_cost, feasibility_tol=CONTINUITY_TOL, lower=lbx, upper=ubx)
        sol = solve(prob.solver, x0=w0, lbx=lbx, ubx=ubx, lbg=0.0, ubg=0.0, best=tracker)
        st = prob.solver.stats()
        status = Status.from_ipopt(st["return_status"], time_up=expired())
    w, cost, g, status, message, advice = _ipopt_outcome(prob, model, theta_vec, data, sol, st, status, w0,
                                                         initial_cost, tracker, lo, hi)
    out, nodes = theta_vec.copy(), w[free.size:].reshape(n_nodes, model.nx)
    out[free] = w[:free.size]
    res = OutputErrorResult(model.params.from_vector(out), nodes[prob.lsq.first_nodes()], float(cost), status, message,
                            int(st["iter_count"]), time.perf_counter() - t0, initial_cost,
                            float(np.max(np.abs(np.asarray(g)))) if prob.ng else 0.0, advice=advice)
    raise_if_failed("refine_output_error", res, options)
    return res


def _ipopt_outcome(prob, model, theta_vec, data, sol, st, status, w0, initial_cost, tracker, lo, hi):
    """The iterate to return after IPOPT (its final one, the best feasible one seen, or the start),
    its cost and gaps, status (the engine's exploding-run guard included), message and advice."""
    w = np.asarray(sol["x"], float).ravel()
    message = f"IPOPT: {st['return_status']} after {st['iter_count']} iterations"
    cost, g = prob.cost_gaps(w)
    gap = float(np.max(np.abs(np.asarray(g)))) if prob.ng else 0.0
    if not (np.all(np.isfinite(w)) and np.isfinite(float(cost))):
        status = Status.SOLVER_FAILED
        message += "; non-finite iterate"
    if status is Status.CONVERGED and gap <= CONTINUITY_TOL:
        # as is: an earlier iterate within the continuity tolerance is lower only by being slightly infeasible
        message += "; returning IPOPT's final iterate"
    else:
        if prob.ng and gap > CONTINUITY_TOL and np.all(np.isfinite(w)):   # nodes that do not join
            _offer_resimulated(prob, model, theta_vec, data, w, lo, hi, tracker)
        w, _, which = tracker.choose(w, float(cost), gap, label="IPOPT's final iterate")
        message += "; " + which
    if not np.array_equal(w, np.asarray(sol["x"], float).ravel()):
        cost, g = prob.cost_gaps(w)
        if not float(cost) <= initial_cost:  # safety net: never worse than the start, recomputed
            w, (cost, g) = w0, prob.cost_gaps(w0)
            message += " (its recomputed cost exceeds the start's: returning the starting point instead)"
    status, explodes, advice = exploding_guard(prob.lsq, status, float(cost), w)
    return w, cost, g, status, message + (f"; {explodes}. {advice}" if advice else ""), advice
