"""Initial state trajectories for CE-EM: an EKF + RTS smoother at the initial parameters, with the process
noise chosen by the EKF's likelihood (why and how: docs/algorithms.md)."""
from __future__ import annotations

import numpy as np

from ..errors import NonFiniteError, ShapeError
from ..filtering import EKF
from ..runtime import _policy as policy
from ..runtime._policy import FROM_POLICY
from ._banded import release_heap

# candidate process-noise variances of the initialising EKF, per state and step
Q_CANDIDATES = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def process_noise_scores(model, theta_vec, data, *, x0, Sigma0, R, ekf: EKF,
                         steps: int | None = FROM_POLICY) -> list[tuple[float, np.ndarray]]:
    """``[(loglik, Q (nx,)), ...]`` best first: the EKF's log-likelihood of the first ``steps`` samples (None: all) of
    every trajectory, summed, for each of `_candidates`; candidates whose filter breaks down are left out."""
    steps = policy.SELECT_STEPS if steps == FROM_POLICY else steps
    out = []
    for Qc in _candidates(model):
        ll, finite = 0.0, True
        for b, y in enumerate(data.y):
            y, u = y[:steps], data.inputs(b)[:steps]  # steps None: all
            try:
                r = ekf.run(theta_vec, y, u, x0=x0, Sigma0=Sigma0, Q=Qc, R=R, engine="casadi")
            except np.linalg.LinAlgError:
                finite = False
                break
            ll += r.loglik
            finite = finite and bool(np.isfinite(r.loglik) and np.all(np.isfinite(r.x_filt)))
        if finite:
            out.append((ll, Qc))
    return sorted(out, key=lambda s: -s[0])  # stable: ties keep the smaller variance first


def _candidates(model) -> list[np.ndarray]:
    """The distinct ``max(process_std**2, q)`` (nx,) for q in ``Q_CANDIDATES``, increasing
    (candidates below the model's own process noise coincide, e.g. sigma_w = 1)."""
    return [np.asarray(Qc) for Qc in sorted({tuple(np.maximum(model.noise.process_std ** 2, q))
                                             for q in Q_CANDIDATES})]


def eks_states(model, theta_vec, data, *, x0=None, Sigma0=None, Q=None, R=None, ekf: EKF | None = None,
               select_steps: int | None = FROM_POLICY, stop_at_deadline: bool = False) -> list[np.ndarray]:
    """EKF + RTS smoothed means (T_b, nx) of every trajectory, the process noise chosen among ``Q_CANDIDATES`` by
    the EKF's likelihood on the first ``select_steps`` samples; defaults of ``x0``, ``Sigma0``, ``Q``, ``R`` and
    the rules: docs/algorithms.md ("Initial states"). ``ekf``: a prebuilt `EKF` of ``model`` to reuse."""
    select_steps = policy.SELECT_STEPS if select_steps == FROM_POLICY else select_steps
    noise, nx = model.noise, model.nx
    x0 = (noise.x1_mean if noise.x1_mean is not None else np.zeros(nx)) if x0 is None else np.asarray(x0, float)
    if Sigma0 is None:
        Sigma0 = noise.x1_std ** 2 if noise.x1_std is not None else 100.0 * np.ones(nx)
    R = noise.measurement_std ** 2 if R is None else R
    ekf = EKF(model) if ekf is None else ekf
    ekf.stop_at_deadline = stop_at_deadline  # TimeLimitReached between EKF chunks (a fit's time limit)

    # filter from the first observed sample (open-loop prediction from the prior can overflow before it)
    lead = [int(np.argmax(np.any(np.isfinite(y), axis=1))) for y in data.y]

    def run(Qc):
        return _smoothed_pass(ekf, theta_vec, data, lead, x0, Sigma0, Qc, R)

    if Q is not None:
        return run(Q)[1]
    whole = select_steps is None or max(data.lengths) <= select_steps
    if whole:  # every candidate runs over all the data: the best of them
        order = _candidates(model)
    else:      # ranked on prefixes: the first whose pass over all the data stays finite
        order = [Qc for _, Qc in process_noise_scores(model, theta_vec, data, x0=x0, Sigma0=Sigma0, R=R,
                                                      ekf=ekf, steps=select_steps)]
    best = _best_pass(run, order, first_finite=not whole)
    if best is not None:
        return best
    cause = _nonfinite_model(ekf, model, theta_vec, data, x0, Sigma0, R) or \
        f"initial states: the EKF diverged for every process-noise level {Q_CANDIDATES}"
    err = NonFiniteError(f"{cause}; start from parameters closer to the truth, or pass x_init (list of "
                         f"(T_b, nx) arrays) to ceem()")
    err.cause = cause  # the first part, without the API advice (the CLI gives its own)
    raise err


def _smoothed_pass(ekf, theta_vec, data, lead, x0, Sigma0, Qc, R) -> tuple[float, list[np.ndarray]]:
    """``(log-likelihood, smoothed means)`` of one EKF + RTS pass with process noise ``Qc`` (`EKF.run_many`, means only),
    each trajectory filtered from its first observed sample ``lead[b]`` (the states before it repeat that one)."""
    loglik, xs = 0.0, []
    release_heap(max(data.lengths) * ekf.model.nx ** 2)
    for k, r in zip(lead, ekf.run_many(theta_vec, [y[k:] for y, k in zip(data.y, lead)],
                                       [data.inputs(b)[k:] for b, k in enumerate(lead)],
                                       x0=x0, Sigma0=Sigma0, Q=Qc, R=R, means=True)):
        loglik += r.loglik
        x = r.x_filt if r.x_smooth is None else r.x_smooth
        xs.append(np.vstack([np.repeat(x[:1], k, axis=0), x]) if k else x)
    return loglik, xs


def _best_pass(run, order, *, first_finite: bool) -> list[np.ndarray] | None:
    """The smoothed means of the candidate process noise in ``order`` with the highest finite
    log-likelihood (``first_finite``: of the first whose pass stays finite); None when none does."""
    best = None
    for Qc in order:
        try:
            ll, xs = run(Qc)
        except np.linalg.LinAlgError:
            continue
        if np.isfinite(ll) and all(np.all(np.isfinite(x)) for x in xs) and (best is None or ll > best[0]):
            best = (ll, xs)
            if first_finite:
                break
    return None if best is None else best[1]


def _nonfinite_model(ekf, model, theta_vec, data, x0, Sigma0, R) -> str | None:
    """The first point where the model's f or g gives NaN/inf along the EKF's filtered states
    (with the largest candidate process noise), as a message; None when none is found."""
    Q = np.maximum(model.noise.process_std ** 2, Q_CANDIDATES[-1])
    for b, y in enumerate(data.y):
        u = data.inputs(b)
        try:
            xf = ekf.run(theta_vec, y, u, x0=x0, Sigma0=Sigma0, Q=Q, R=R, smooth=False).x_filt
        except (np.linalg.LinAlgError, ValueError, RuntimeError):
            xf = np.empty((0, model.nx))
        points = [np.asarray(x0, float)] + [x for x in xf if np.all(np.isfinite(x))]
        for t, x in enumerate(points):
            ut = u[max(t - 1, 0)]
            for fun in (model.f, model.g):
                with np.errstate(all="ignore"):
                    val = np.asarray(fun(x, ut, theta_vec)).ravel()
                if not np.all(np.isfinite(val)):
                    return (f"non-finite model output: {fun.name()}(x, u, p) = {np.round(val, 6).tolist()} at "
                            f"x = {np.round(x, 6).tolist()} (trajectory {b}, step {t}, p = "
                            f"{np.round(theta_vec, 6).tolist()}): the EKF that initialises the states cannot "
                            f"continue; make the model finite there")
    return None


def check_states(model, data, xs, what: str = "x_init", hint: str = "") -> list[np.ndarray]:
    """Validate user-given state trajectories: one (T_b, nx) finite array per trajectory (``what``
    names them in messages, ``hint`` is appended to a shape error)."""
    if len(xs) != len(data):
        raise ShapeError(f"{what}: expected {len(data)} state trajectories, got {len(xs)}{hint}")
    out = []
    for b, (x, T) in enumerate(zip(xs, data.lengths)):
        x = np.asarray(x, float)
        if x.shape != (T, model.nx):
            raise ShapeError(f"{what}[{b}]: expected shape {(T, model.nx)}, got {x.shape}{hint}")
        if not np.all(np.isfinite(x)):
            raise ShapeError(f"{what}[{b}] contains NaN or inf")
        out.append(x.copy())
    return out
