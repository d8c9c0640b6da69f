"""Output-error (simulation-error) identification: the classical prediction-error method for
an output-error model (MATLAB ``nlgreyest`` / ``pem``), as one IPOPT NLP.

Decision variables: the free parameter entries z (fixed entries held at their values) and the
initial state x0_b of every trajectory b. With the noise-free free run ``yhat_b(z, x0_b)`` of
:mod:`ceem_casadi.simulation`,

    min_{z, x0}  0.5 sum_{b, t, j observed} ((y_b[t, j] - yhat_b[t, j]) / sigma_v[j])^2
                 + 0.5 ||(z - mu_p) / s_p||^2                 (the parameters' priors, optional)

subject to the parameter bounds (and optional state bounds), with ``sigma_v`` the model's
``measurement_std`` and NaN outputs left out. ``shooting=None`` is single shooting (the run from
x0 over the whole record). ``shooting=k`` is multiple shooting: the state at every k-th sample
is a decision variable too (a node), each k-sample segment is simulated from its node, and the
continuity constraints ``x(end of segment j) = node j+1`` make the optimum the same as single
shooting's, while the Jacobian no longer multiplies T state-transition Jacobians (long or
unstable records). Derivatives are exact and sparse (CasADi AD of the ``mapaccum`` rollout);
the Hessian is Gauss-Newton ``J^T J`` of the residuals (default) or CasADi's exact Lagrangian
Hessian. The NLP is built once per (model, trajectory lengths, shooting, options) and cached.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import casadi as ca
import numpy as np

from ._callbacks import SparsityCallback
from ._ipopt import DEADLINE, deadline, ipopt_options, solve
from .data import Trajectories
from .errors import ShapeError, SolverError
from .initial_state import estimate_initial_state
from .options import HESSIANS, _require, check_time_limit
from .params import Theta
from .simulation import rollout, run
from .status import Status

__all__ = ["OutputErrorOptions", "OutputErrorResult", "refine_output_error"]


@dataclass(frozen=True)
class OutputErrorOptions:
    """Options of :func:`refine_output_error`.

    Parameters
    ----------
    max_iter : int
        Iteration limit (default 500).
    tol : float
        Tolerance (default 1e-10): IPOPT's ``tol``; for ``solver="lm"`` the ``ftol``, ``xtol`` and
        ``gtol`` of [`LeastSquaresOptions`][ceem_casadi.LeastSquaresOptions].
    solver : str
        ``"lm"`` (default): the Levenberg-Marquardt engine of `ceem_casadi.least_squares` (exact
        sparse Jacobian, automatic scaling, rejection of non-finite or unstable trials, never
        returns an iterate worse than its start; Gauss-Newton by construction, ``hessian`` is not
        used). ``"ipopt"``: one IPOPT NLP (interior point, continuity as constraints).
    hessian : str
        ``"gauss-newton"`` (default: ``J^T J`` of the output residuals, positive semi-definite,
        constraint curvature ignored) or ``"exact"`` (CasADi's exact Hessian of the Lagrangian;
        2-5x slower per iteration in the measurements of the README). With multiple shooting on
        very short segments (``shooting=1``: all the dynamics sit in the constraints, whose
        curvature Gauss-Newton ignores) Gauss-Newton can stall (pendulum, 2 noisy trajectories:
        500 iterations without convergence at k = 1; 9 iterations at k = 2, 3, 5, like single
        shooting); use segments of a few samples, or ``"exact"`` there.
    use_prior : bool
        Include the parameters' Gaussian priors.
    time_limit : float, optional
        Wall-clock budget in seconds for the whole call (initial states included), or ``None``;
        when spent, IPOPT stops at its next iteration and the result has status
        ``"time_limit"`` with the last iterate.
    x0_window : int, optional
        Samples used to estimate initial states that are not given (default as in
        :func:`~ceem_casadi.estimate_initial_state`).
    x_lower, x_upper : float or sequence of float, optional
        Bounds on the initial states and shooting nodes (scalar or (nx,)).
    raise_on_failure : bool
        Raise :class:`~ceem_casadi.SolverError` instead of returning status ``"solver_failed"``.

    Raises
    ------
    OptionsError
        A value out of range (also a ``ValueError``).
    """

    max_iter: int = 500
    tol: float = 1e-10
    hessian: str = "gauss-newton"
    use_prior: bool = True
    time_limit: float | None = None
    x0_window: int | None = None
    x_lower: object = None
    x_upper: object = None
    raise_on_failure: bool = False
    solver: str = "lm"

    def __post_init__(self):
        _require(self.solver in ("lm", "ipopt"), f"solver must be 'lm' or 'ipopt', got {self.solver!r}")
        _require(isinstance(self.max_iter, int) and self.max_iter >= 1, f"max_iter must be an int >= 1, got {self.max_iter!r}")
        _require(np.isfinite(self.tol) and self.tol > 0, f"tol must be finite and > 0, got {self.tol!r}")
        _require(self.hessian in HESSIANS,
                 f"hessian must be 'gauss-newton' or 'exact', got {self.hessian!r}")
        check_time_limit(self.time_limit)
        _require(self.x0_window is None or (isinstance(self.x0_window, int) and self.x0_window >= 1),
                 f"x0_window must be None or an int >= 1, got {self.x0_window!r}")


@dataclass
class OutputErrorResult:
    """Outcome of :func:`refine_output_error`.

    Attributes
    ----------
    theta : dict
        Parameters, name -> array.
    x0 : numpy.ndarray
        (B, nx) initial state per trajectory.
    cost : float
        The minimised objective (module docstring) at the returned point.
    status : Status
        ``status.advice`` says what to try.
    message : str
        IPOPT's return status and more.
    iterations : int
        IPOPT iterations.
    wall_s : float
        Seconds for the whole call.
    initial_cost : float
        The objective at the start.
    constraint_violation : float
        Max |continuity gap| of multiple shooting (0 for single shooting).
    solver : str
        ``"lm"`` or ``"ipopt"``.
    returned : str
        ``solver="lm"``: which iterate came back (``"last"``, ``"best"``, ``"start"``).
    starts : list of dict
        ``solver="lm"`` with ``starts=``: one row per start.
    """

    theta: Theta
    x0: np.ndarray
    cost: float
    status: Status
    message: str
    iterations: int
    wall_s: float
    initial_cost: float = float("nan")
    constraint_violation: float = 0.0
    solver: str = "ipopt"
    returned: str = ""
    starts: list = field(default_factory=list, repr=False)

    @property
    def success(self) -> bool:
        """Whether ``status`` gives a regular estimate."""
        return self.status.usable


class _GaussNewtonEvaluations:
    """IPOPT ``grad_f`` and ``hess_lag`` Callbacks sharing one evaluation of ``fun(w, P) -> (cost,
    grad, triu(J^T J))`` per point (the last point is cached)."""

    def __init__(self, fun: ca.Function, ng: int):
        self.fun, self._key, self._val = fun, None, None
        self.grad_f = _Output(self, "grad_f", [fun.sparsity_in(0), fun.sparsity_in(1)],
                              [ca.Sparsity.dense(1, 1), fun.sparsity_out(1)], ["x", "p"], ["f", "grad_f_x"])
        self.hess_lag = _Output(self, "hess_lag", [fun.sparsity_in(0), fun.sparsity_in(1), ca.Sparsity.dense(1, 1),
                                                   ca.Sparsity.dense(ng, 1)],
                                [fun.sparsity_out(2)], ["x", "p", "lam_f", "lam_g"], ["triu_hess_gamma_x_x"])

    def at(self, w: ca.DM, P: ca.DM):
        w_np, P_np = np.asarray(w.full()).ravel(), np.asarray(P.full()).ravel()
        if self._key is None or not (np.array_equal(self._key[0], w_np) and np.array_equal(self._key[1], P_np)):
            self._val = self.fun(w, P)
            self._key = (w_np, P_np)
        return self._val


class _Output(SparsityCallback):
    def __init__(self, owner, name, sp_in, sp_out, names_in, names_out):
        self.owner = owner
        super().__init__(name, sp_in, sp_out, names_in, names_out)

    def eval(self, arg):
        cost, grad, hess = self.owner.at(arg[0], arg[1])
        return [cost, grad] if len(self.sp_out) == 2 else [arg[2] * hess]


def _segments(lengths, shooting):
    """(b, start, n_obs, has_next) per segment: k samples from every node, the last one shorter."""
    out = []
    for b, T in enumerate(lengths):
        k = T if shooting is None else int(shooting)
        for s in range(0, T, k):
            n = min(k, T - s)
            out.append((b, s, n, s + n < T))
    return out


class OutputErrorProblem:
    """The NLP of the module docstring for one model, set of lengths and shooting (built once)."""

    def __init__(self, model, lengths, shooting, options: OutputErrorOptions):
        self.model, self.lengths, self.shooting = model, tuple(lengths), shooting
        params = model.params
        nx, nu, ny, npar = model.nx, model.nu, model.ny, params.size
        self.free = params.free_index
        nf = self.free.size
        self.segs = _segments(self.lengths, shooting)
        n_nodes = len(self.segs)
        w = ca.MX.sym("w", nf + nx * n_nodes)
        z, nodes = w[:nf], ca.reshape(w[nf:], nx, n_nodes)
        # groups of segments simulated by one mapped rollout: (samples simulated) -> segment indices;
        # a segment with a successor simulates one sample more to predict the next node
        groups: dict[int, list[int]] = {}
        for i, (_, _, n, nxt) in enumerate(self.segs):
            groups.setdefault(n + int(nxt), []).append(i)
        self.groups = sorted(groups.items())
        n_u = sum(L * len(idx) for L, idx in self.groups)
        n_obs = sum(n for _, _, n, _ in self.segs)
        syms = dict(p_base=ca.MX.sym("p_base", npar), U=ca.MX.sym("U", nu, n_u), Y=ca.MX.sym("Y", ny, n_obs),
                    M=ca.MX.sym("M", ny, n_obs), iv=ca.MX.sym("iv", ny), mu=ca.MX.sym("mu", nf),
                    wp=ca.MX.sym("wp", nf))
        self._names = list(syms)
        sizes = [s.numel() for s in syms.values()]
        P = ca.MX.sym("P", sum(sizes))
        parts = ca.vertsplit(P, np.concatenate([[0], np.cumsum(sizes)]).tolist())
        s = {k: ca.reshape(a, v.shape[0], v.shape[1]) for (k, v), a in zip(syms.items(), parts)}
        E = ca.DM(ca.Sparsity.triplet(npar, nf, self.free.tolist(), list(range(nf))), 1.0)
        p = s["p_base"] + ca.mtimes(E, z)
        yhat, gaps, u_col = [], [], 0
        for L, idx in self.groups:
            Yh, Xh = rollout(model, L).map(len(idx))(nodes[:, idx], s["U"][:, u_col:u_col + L * len(idx)], p)
            u_col += L * len(idx)
            for j, i in enumerate(idx):
                _, _, n, nxt = self.segs[i]
                yhat.append(Yh[:, j * L:j * L + n])
                if nxt:
                    gaps.append(Xh[:, j * L + n] - nodes[:, i + 1])
        Yhat = ca.horzcat(*yhat)
        r = ca.vec(s["M"] * ca.repmat(s["iv"], 1, n_obs) * (s["Y"] - Yhat))
        prior = s["wp"] * (z - s["mu"])
        cost = 0.5 * ca.sumsqr(r) + 0.5 * ca.sumsqr(prior)
        g = ca.vertcat(*gaps) if gaps else ca.MX(0, 1)
        extra = {}
        if options.hessian == "gauss-newton":
            # cost, gradient J^T r and J^T J from ONE evaluation of the residual Jacobian J per
            # iterate (IPOPT asks for the gradient and the Hessian at the same point)
            jac = ca.jacobian(r, w)
            H = ca.mtimes(jac.T, jac) + ca.diag(ca.vertcat(s["wp"] ** 2, ca.MX(nx * n_nodes, 1)))
            grad = ca.mtimes(jac.T, r) + ca.vertcat(s["wp"] * prior, ca.MX(nx * n_nodes, 1))
            self._gn = _GaussNewtonEvaluations(ca.Function("gauss_newton", [w, P], [cost, grad, ca.triu(H)]),
                                               g.numel())
            extra["grad_f"], extra["hess_lag"] = self._gn.grad_f, self._gn.hess_lag
        # adaptive barrier: with bounds and a large-residual Gauss-Newton model the default monotone
        # strategy crawled (Cascaded Tanks, 11 parameters: 279 iterations, 62 s -> 23, 7.0 s)
        self.solver = ca.nlpsol("output_error", "ipopt", {"x": w, "p": P, "f": cost, "g": g},
                                ipopt_options(options.max_iter, options.tol, show_eval_warnings=False,
                                              **{"ipopt.mu_strategy": "adaptive"}, **extra))
        self.functions = ca.Function("output_error_eval", [w, P], [cost, g])
        self.ng = g.numel()

    def parameter(self, model, theta_vec, data: Trajectories, use_prior: bool) -> np.ndarray:
        """The NLP parameter vector: base parameters, the data in segment order, weights, prior
        (weights from ``model``: the structure is shared with its ``with_noise`` copies)."""
        base = np.asarray(theta_vec, float).copy()
        base[self.free] = 0.0
        U, Y = [], []
        for L, idx in self.groups:  # the order of the residual columns (see __init__)
            for i in idx:
                b, s0, n, _ = self.segs[i]
                U.append(data.inputs(b)[s0:s0 + L].T)
                Y.append(data.y[b][s0:s0 + n].T)
        Y = np.hstack(Y)
        mask = np.isfinite(Y)
        mean, wp = model.params.prior
        wp = wp if use_prior else np.zeros_like(wp)
        vals = dict(p_base=base, U=np.hstack(U), Y=np.where(mask, Y, 0.0), M=mask.astype(float),
                    iv=model.noise.inv_measurement_std, mu=mean[self.free], wp=wp[self.free])
        return np.concatenate([np.asarray(vals[k], float).ravel(order="F") for k in self._names])

    def nodes(self, model, theta_vec, data: Trajectories, x0: np.ndarray) -> np.ndarray:
        """Initial node states (nx, n_nodes): the free run from x0 sampled at the nodes, else
        (where it is not finite) the EKF/RTS smoothed states."""
        from .initialise import eks_states

        runs = [run(model, theta_vec, x0[b], data.inputs(b))[1] for b in range(len(data))]
        for b, x in enumerate(runs):
            if not np.all(np.isfinite(x)):
                runs[b] = eks_states(model, theta_vec, data[b])[0]
                runs[b][0] = x0[b]
        return np.array([runs[b][s0] for b, s0, _, _ in self.segs]).T


def problem_for(model, lengths, shooting, options: OutputErrorOptions) -> OutputErrorProblem:
    """The cached :class:`OutputErrorProblem` (per model, lengths, shooting, Hessian, max_iter, tol)."""
    cache = model.__dict__.setdefault("_output_error_problems", {})
    key = (tuple(lengths), shooting, options.hessian, options.max_iter, options.tol)
    if key not in cache:
        cache[key] = OutputErrorProblem(model, lengths, shooting, options)
    return cache[key]


def _state_bounds(model, value, fill, name) -> np.ndarray:
    v = np.asarray(fill if value is None else value, float)
    if v.size not in (1, model.nx):
        raise ShapeError(f"{name}: expected a scalar or {model.nx} entries (nx), got shape {v.shape}")
    return np.broadcast_to(v.ravel() if v.size > 1 else v, (model.nx,)).astype(float)


def refine_output_error(model, theta: Theta, data: Trajectories, *, shooting: int | None = None, x0=None,
                        starts=None, options: OutputErrorOptions = OutputErrorOptions()) -> OutputErrorResult:
    """Fit the free parameters and every trajectory's initial state by output error (module docstring).

    Parameters
    ----------
    model : :class:`~ceem_casadi.StateSpaceModel`.
    theta : starting parameters (dict, all names; fixed entries stay as given), e.g. a CE-EM fit.
    data : :class:`~ceem_casadi.Trajectories` (NaN = missing output).
    shooting : ``None`` (single shooting) or the segment length k >= 1 of multiple shooting.
    x0 : starting initial states (B, nx) (or (nx,) for all); default
        :func:`~ceem_casadi.estimate_initial_state` on the first ``options.x0_window`` samples.
    starts : more starting parameter sets (dicts, possibly partial), ``solver="lm"`` only: the
        lowest objective over all starts is returned (``result.starts``: one row per start).
    options : :class:`OutputErrorOptions`.

    Returns
    -------
    OutputErrorResult
        theta, x0 (B, nx), cost, status, message, iterations, wall time. On a solver failure the
        starting point comes back (status ``"solver_failed"``) unless ``raise_on_failure``; with
        ``solver="lm"`` the returned cost is never above the start's, whatever the status.
    """
    if not isinstance(options, OutputErrorOptions):
        raise TypeError(f"options must be an OutputErrorOptions, got {type(options).__name__}")
    if not isinstance(data, Trajectories):
        raise TypeError(f"data must be a Trajectories, got {type(data).__name__}")
    if options.solver == "lm":
        from .least_squares import refine_with_least_squares

        return refine_with_least_squares(model, theta, data, shooting=shooting, x0=x0, starts=starts, options=options)
    if starts is not None:
        raise ShapeError("starts= needs solver='lm' (OutputErrorOptions(solver='lm'))")
    t0 = time.perf_counter()
    data.check_model(model)
    theta = model.params.validate(theta)
    theta_vec = model.params.to_vector(theta)
    if shooting is not None and (int(shooting) != shooting or shooting < 1):
        raise ShapeError(f"shooting: expected None (single shooting) or a segment length >= 1, got {shooting!r}")
    lo = _state_bounds(model, options.x_lower, -np.inf, "x_lower")
    hi = _state_bounds(model, options.x_upper, np.inf, "x_upper")
    expires = None if options.time_limit is None else t0 + options.time_limit
    with deadline(expires):
        if x0 is None:
            x0 = estimate_initial_state(model, theta_vec, data, window=options.x0_window, x_lower=lo, x_upper=hi)
        x0 = np.asarray(x0, float)
        x0 = np.tile(x0, (len(data), 1)) if x0.ndim == 1 else x0
        if x0.shape != (len(data), model.nx) or not np.all(np.isfinite(x0)):
            raise ShapeError(f"x0: expected finite initial states ({len(data)}, {model.nx}), got {x0.shape}")
        prob = problem_for(model, data.lengths, None if shooting is None else int(shooting), options)
        free = prob.free
        P = prob.parameter(model, theta_vec, data, options.use_prior)
        nodes = np.clip(prob.nodes(model, theta_vec, data, x0), lo[:, None], hi[:, None])
        w0 = np.concatenate([theta_vec[free], nodes.ravel(order="F")])
        n_nodes = len(prob.segs)
        lbx = np.concatenate([model.params.lower[free], np.tile(lo, n_nodes)])
        ubx = np.concatenate([model.params.upper[free], np.tile(hi, n_nodes)])
        initial_cost = float(prob.functions(w0, P)[0])
        sol = solve(prob.solver, x0=w0, p=P, lbx=lbx, ubx=ubx, lbg=0.0, ubg=0.0)
        st = prob.solver.stats()
        status = Status.from_ipopt(st["return_status"], time_up=DEADLINE.expired())
    w = np.asarray(sol["x"], float).ravel()
    message = f"IPOPT: {st['return_status']} after {st['iter_count']} iterations"
    cost, g = prob.functions(w, P)
    gap = float(np.max(np.abs(np.asarray(g)))) if prob.ng else 0.0
    if not (np.all(np.isfinite(w)) and np.isfinite(float(cost))):
        status = Status.SOLVER_FAILED
        message += "; non-finite iterate"
    if status is Status.SOLVER_FAILED and options.raise_on_failure:
        raise SolverError(f"refine_output_error: {message}. {status.advice}")
    if not (np.isfinite(float(cost)) and float(cost) <= initial_cost and gap <= 1e-6):
        w = w0  # IPOPT's iterate (any status) is no better than the start: keep the start
        cost, g = prob.functions(w, P)
        message += "; returning the starting point (IPOPT's last iterate was not better, or broke continuity)"
    elif status is Status.SOLVER_FAILED:
        message += "; returning IPOPT's last iterate (lower cost than the start, continuity met)"
    out = theta_vec.copy()
    out[free] = w[:free.size]
    nodes = w[free.size:].reshape(n_nodes, model.nx)
    first = [i for i, (b, s0, _, _) in enumerate(prob.segs) if s0 == 0]
    return OutputErrorResult(model.params.from_vector(out), nodes[first], float(cost), status, message,
                             int(st["iter_count"]), time.perf_counter() - t0, initial_cost,
                             float(np.max(np.abs(np.asarray(g)))) if prob.ng else 0.0)
