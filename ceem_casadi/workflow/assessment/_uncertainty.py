"""Parameter uncertainty: the Laplace approximation at the CE-EM fixed point, the states eliminated from the
joint Hessian trajectory by trajectory (banded Cholesky); derivation and validation: docs/uncertainty.md."""
from __future__ import annotations

import logging

import numpy as np
from scipy.linalg import LinAlgError, cho_solve_banded, cholesky_banded
from scipy.special import ndtri

from ...em._hessian_blocks import ExactBlocks, GaussNewtonBlocks
from ...em._joint_gauss_newton import banded_upper
from ...errors import SolverError
from ...io._validate import check_data
from ...learning._learner import AUTO_EXACT_INSTRUCTIONS
from ...objective._identifiability import Direction, describe, entry_names, spectrum, weak_directions
from ...objective._stages import StageFunctions
from ...runtime._model_cache import cached, noise_key
from ...runtime._threads import blas_threads
from ._uncertainty_options import ParameterUncertainty, UncertaintyOptions

log = logging.getLogger(__name__)

def _blocks(model, lengths, options: UncertaintyOptions):
    """Mapped stage blocks of ``model`` for these trajectory lengths (library cache, one per thread)."""
    stages = cached(model, "uncertainty stages", (options.hessian, options.compile),
                    lambda: StageFunctions(model, options.hessian, options.compile), per_thread=True)
    if options.hessian == "exact":
        return cached(model, "uncertainty blocks", ("exact", options.compile, tuple(lengths)),
                      lambda: _exact_blocks(model, stages, lengths), per_thread=True)
    # the Gauss-Newton residuals bake the noise weights in
    return cached(model, "uncertainty blocks", ("gauss-newton", options.compile, tuple(lengths), noise_key(model)),
                  lambda: GaussNewtonBlocks(model, lengths, stages), per_thread=True)


def _exact_blocks(model, stages: StageFunctions, lengths) -> ExactBlocks:
    """The exact blocks, with a warning before a build that may take minutes."""
    estimate = stages.instructions(["dyn_cost", "obs_cost"]) * model.params.size
    if estimate > AUTO_EXACT_INSTRUCTIONS:
        log.warning("the exact parameter Hessian of model %r is long (~%d SX instructions per stage): building "
                    "it may take minutes; UncertaintyOptions(hessian='gauss-newton') is much cheaper",
                    getattr(model, "name", "model"), estimate)
    return ExactBlocks(stages, sum(lengths), sum(T - 1 for T in lengths))


def reduced_hessian(model, data, theta_vec, xs, options: UncertaintyOptions = UncertaintyOptions()) -> np.ndarray:
    """The information ``I = H_tt - H_tx H_xx^{-1} H_xt`` (n_free, n_free) of the free parameters
    at ``theta_vec`` (np,) and states ``xs`` (list of (T_b, nx)), states eliminated per trajectory
    by a banded Cholesky factorisation of the block-tridiagonal ``H_xx``; priors included."""
    theta_vec = np.asarray(theta_vec, float)
    params, nx, noise = model.params, model.nx, model.noise
    free = params.free_index
    Ho, Hd, Hxo, Hzd, S = _blocks(model, data.lengths, options)(model, theta_vec, data, xs, free)
    S = S.copy()
    if options.use_prior:
        S[np.diag_indices(free.size)] += params.prior[1][free] ** 2
    w1sq = None if noise.x1_std is None else noise.inv_x1_std ** 2
    o0 = d0 = 0
    for b, T in enumerate(data.lengths):
        so, sd = slice(o0, o0 + T), slice(d0, d0 + T - 1)
        D = Ho[so].copy()
        D[:-1] += Hd[sd, :nx, :nx]
        D[1:] += Hd[sd, nx:, nx:]
        Off = Hd[sd, :nx, nx:]
        Hxp = Hxo[so].copy()
        Hxp[:-1] += Hzd[sd, :nx]
        Hxp[1:] += Hzd[sd, nx:]
        if w1sq is not None:
            D[0][np.diag_indices(nx)] += w1sq
        try:
            chol = cholesky_banded(banded_upper(D, Off), lower=False)
        except LinAlgError:
            raise SolverError(
                f"trajectory {b}: the Hessian of -J over the states is not positive definite at this "
                f"point, so (x, theta) is not a maximum of J over the states; run ceem to convergence "
                f"first, or use UncertaintyOptions(hessian='gauss-newton')") from None
        Hxp = Hxp.reshape(T * nx, free.size)
        S -= Hxp.T @ cho_solve_banded((chol, False), Hxp)
        o0, d0 = o0 + T, d0 + T - 1
    return 0.5 * (S + S.T)


BOUND_TOL = 1e-6  # a parameter within BOUND_TOL * max(1, |bound|) of a bound is at the bound
GRADIENT_CHECK_MAX = 50  # free parameters up to which the stationarity of theta is checked (2 J per entry)


def _off_maximum(model, data, theta_vec, xs, free, cov, se, names, use_prior: bool) -> str | None:
    """A warning when one Newton step ``cov @ grad`` from ``theta_vec`` (gradient of J + log prior by central
    differences at the states ``xs``) moves some free parameter by more than one standard error, else None."""
    if not 0 < free.size <= GRADIENT_CHECK_MAX:
        return None
    from ...smoothing._smoother import Smoother

    sm = Smoother(model)
    mean, prec = model.params.prior

    def objective(v):
        val = sm.joint_log_density(v, data, xs)
        if use_prior:
            val -= 0.5 * float(np.sum(np.where(prec > 0, (v - mean) * prec, 0.0) ** 2))
        return val

    grad = np.zeros(free.size)
    for k, i in enumerate(free):
        h = 1e-6 * max(1.0, abs(theta_vec[i]))
        up, down = theta_vec.copy(), theta_vec.copy()
        up[i] += h
        down[i] -= h
        grad[k] = (objective(up) - objective(down)) / (2 * h)
    if not np.all(np.isfinite(grad)):
        return None
    ok = np.isfinite(se) & (se > 0)
    if not np.any(ok):
        return None
    z = np.abs(cov @ grad)[ok] / se[ok]
    worst = int(np.argmax(z))
    if z[worst] <= 1.0:
        return None
    name = [n for n, keep in zip(names, ok) if keep][worst]
    return (f"theta is not a maximum of J{' + log prior' if use_prior else ''}: one Newton step from it moves "
            f"{name} by {z[worst]:.1f} standard errors (the intervals describe the curvature at this point, not "
            f"at the estimate); fit to convergence first (ceem, or the CLI's fit) and pass its result")


def _states(model, data, theta_vec, xs) -> list:
    """The states (T_b, nx) per trajectory: ``xs`` checked against ``data``, or, when None, the smoothing step's
    optimum at fixed ``theta_vec`` from the EKF/RTS estimate."""
    from ...smoothing._initial_states import check_states, eks_states
    from ...smoothing._options import SmootherOptions
    from ...smoothing._smoother import Smoother

    if xs is not None:
        return check_states(model, data, xs, "result.x (the fit's states)",
                            f"; the fit's states cover trajectories of lengths {[len(x) for x in xs]}, the data "
                            f"{list(data.lengths)}: pass the data the fit used, or the theta dict (the states are "
                            f"then recomputed on this data)")
    res = Smoother(model, SmootherOptions(max_iters=500)).solve(theta_vec, data, eks_states(model, theta_vec, data))
    bad = [b for b, r in enumerate(res) if not r.success]
    if bad:
        raise SolverError(f"smoothing at theta failed on trajectories {bad} ({[res[b].status for b in bad]})")
    return [r.x for r in res]


def _at_bound(params, est) -> np.ndarray:
    """(n,) bool: free entries ``est`` within ``BOUND_TOL * max(1, |bound|)`` of a bound."""
    lo, hi = params.lower[params.free_index], params.upper[params.free_index]
    return ((np.isfinite(lo) & (est - lo <= BOUND_TOL * np.maximum(1.0, np.abs(lo))))
            | (np.isfinite(hi) & (hi - est <= BOUND_TOL * np.maximum(1.0, np.abs(hi)))))


def _covariance(info, active, names, tol: float):
    """``(covariance (n, n), identifiable (n,), spectrum, weak directions)`` of the information ``info`` (n, n): the
    Jacobi-scaled pseudo-inverse on the identifiable subspace of the entries not at a bound (``active``)."""
    inner = np.flatnonzero(~active)
    sub = info[np.ix_(inner, inner)]
    spec = spectrum(sub, tol)
    dirs: list[Direction] = weak_directions(sub, [names[i] for i in inner], tol, spec)
    U = spec.vectors[:, ~spec.weak]
    cov = np.zeros(info.shape)
    cov[np.ix_(inner, inner)] = spec.scale[:, None] * ((U / (spec.eigenvalues[~spec.weak] * spec.top)) @ U.T) \
        * spec.scale[None, :]
    identifiable = np.ones(len(names), bool)
    identifiable[inner] = np.sum(spec.vectors[:, spec.weak] ** 2, axis=1) < 1e-6
    return cov, identifiable, spec, dirs


def parameter_uncertainty(model, data, theta, *, states=None, options: UncertaintyOptions = UncertaintyOptions()
                          ) -> ParameterUncertainty:
    """Covariance, standard errors, intervals and identifiability of the free parameters.

    Parameters
    ----------
    model : StateSpaceModel
        The model that was fitted.
    data : Trajectories
        The data it was fitted on.
    theta : dict or CEEMResult
        The parameters, or a fit (its ``theta``, states ``x`` and ``status`` are used).
    states : list of (T_b, nx) arrays, optional
        States at ``theta``; default: the fit's, or the smoothing step's optimum.
    options : UncertaintyOptions

    Returns
    -------
    ParameterUncertainty
        The math and its caveat: docs/uncertainty.md.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(60, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [0.0], 60, u=u, process_std=0.1, measurement_std=0.1, seed=1)
    >>> options = cc.CEEMOptions(smoother=cc.SmootherOptions(compile=False), learner=cc.LearnerOptions(compile=False))
    >>> fit = cc.ceem(model, data, {"a": 0.5}, options=options)
    >>> unc = cc.parameter_uncertainty(model, data, fit.theta, states=fit.x,
    ...                                options=cc.UncertaintyOptions(compile=False))
    >>> print(unc.table())                    # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
    a  0.800... ± 0.0069  [0.78..., 0.81...]
    >>> bool(unc.lower[0] < 0.8 < unc.upper[0])
    True
    """
    if not isinstance(options, UncertaintyOptions):
        raise TypeError(f"options must be an UncertaintyOptions, got {type(options).__name__}")
    check_data(model, data)
    theta_vec = model.params.to_vector(theta if isinstance(theta, dict) else theta.theta)
    xs = states if states is not None else getattr(theta, "x", None)
    with blas_threads(1):  # multi-threaded BLAS spins on shared cores (as CEEMOptions' default)
        return _uncertainty(model, data, theta_vec, _states(model, data, theta_vec, xs),
                            getattr(theta, "status", "converged"), options)


def _uncertainty(model, data, theta_vec, xs, status, options: UncertaintyOptions) -> ParameterUncertainty:
    """`parameter_uncertainty` at ``theta_vec`` (np,) and the states ``xs``; ``status`` of the fit they come from."""
    free = model.params.free_index
    names = entry_names(model.params, free)
    est = theta_vec[free]
    info = reduced_hessian(model, data, theta_vec, xs, options)
    active = _at_bound(model.params, est)
    cov, identifiable, spec, dirs = _covariance(info, active, names, options.identifiability_tol)
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    se[~identifiable] = np.inf
    se[active] = np.nan
    z = float(ndtri(0.5 + options.level / 2))
    with np.errstate(invalid="ignore"):
        corr = cov / np.outer(se, se)
    corr[~np.isfinite(corr)] = np.nan
    at_bound = [names[i] for i in np.flatnonzero(active)]
    warnings = [describe(dirs, "the parameters' information (reduced Hessian)")] if dirs else []
    if at_bound:
        warnings.append(f"parameter(s) {at_bound} at a bound: no interval (the Laplace approximation does not "
                        f"apply there); the other parameters' covariance is conditional on them")
    if status != "converged":
        warnings.append(f"the fit's status is '{status}', not 'converged': the Laplace approximation assumes a "
                        f"fixed point of CE-EM")
    else:  # a stopped fit already has its warning
        warnings.append(_off_maximum(model, data, theta_vec, xs, free, cov, se, names, options.use_prior))
    if np.any(spec.eigenvalues < -options.identifiability_tol):
        warnings.append("the reduced Hessian has negative eigenvalues: the point is not a maximum of J; "
                        "run ceem to convergence before computing uncertainties")
    warnings = [w for w in warnings if w]
    for w in warnings:
        log.warning(w)
    return ParameterUncertainty(names, free, est, info, cov, se, est - z * se, est + z * se, corr, at_bound,
                                identifiable, dirs, spec.eigenvalues, options.hessian, options.level, warnings)


__all__ = ["parameter_uncertainty", "reduced_hessian"]
