"""The measured floor of one CE-EM iteration, shared by the performance benchmarks (issue 26).

``floor_s`` is the irreducible work of one iteration on this machine, timed in the same run as
the phase it is compared with:

- smoothing: ONE evaluation of every stage derivative of every trajectory (cost, gradient and
  Hessian band; the compiled stage Functions mapped over all steps, p passed once:
  `ceem_casadi.smoothing._batch_objective.BatchObjective`, or for a long record the chunked objective of
  the banded solver) plus ONE banded Cholesky factorisation and solve over all trajectories
  (`ceem_casadi.smoothing._batched_newton.stacked_directions`). A Newton smoother needs at least this per
  iteration (plus line-search costs).
- learning: ONE evaluation of the learning objective and its gradient over all stages (the
  compiled ``*_p_grad`` stage Functions mapped with p shared, summed by the map) and, with
  ``hessian=True``, the Gauss-Newton Hessian: the stage residual Jacobians (``*_p_jac``) and
  J^T J. For a learner with its own full-batch evaluation (the helicopter's Adam learner on
  matrix-valued model functions: a per-stage gradient of its 2,246 parameters would be a
  (2,246 x stages) map output) time that instead with `best_time`.

Each floor is the minimum of ``repeats`` timings (the machine is shared: the minimum is the
least disturbed). Benchmarks print and write ``floor_s`` beside each phase's time and
``ratio = phase_s / floor_s`` (`floor_row`).
"""
from __future__ import annotations

import time
from functools import partial

import numpy as np
from threadpoolctl import threadpool_limits

from ceem_casadi import SmootherOptions
from ceem_casadi.objective._stages import stack_stages
from ceem_casadi.runtime._linalg import BufferedCall, gram
from ceem_casadi.runtime._policy import BATCH_COLUMNS, CHUNK_FROM, CHUNK_LENGTH
from ceem_casadi.smoothing._banded import BandedNewton
from ceem_casadi.smoothing._batch_objective import BatchObjective
from ceem_casadi.smoothing._batched_newton import stacked_directions
from ceem_casadi.smoothing._chunks import ChunkedObjective
from ceem_casadi.smoothing._smoother import TrajectorySmoother
from ceem_casadi.smoothing._structure import band_column_functions

LEARN_CHUNK = 20_000  # stages per mapped learning evaluation (bounded memory at T = 10^6)


def best_time(work, repeats: int = 3, clock=time.perf_counter) -> float:
    """Run every closure of ``work`` (a list of callables without arguments) once untimed (builds
    the mapped Functions), then the minimum over ``repeats`` of the time to run them all; one BLAS
    thread, as ``ceem()`` by default. E.g. the floor of a learner that has its own full-batch
    evaluation: ``best_time([lambda: adam.objective(theta, data, xs, gradient=True)])``.
    ``clock``: ``time.perf_counter`` (wall) or ``time.process_time`` (this process's CPU time:
    on a machine shared with other jobs, comparable between runs where wall times are not)."""
    with threadpool_limits(limits=1, user_api="blas"):
        for w in work:
            w()
        best = np.inf
        for _ in range(max(1, repeats)):
            t0 = clock()
            for w in work:
                w()
            best = min(best, clock() - t0)
    return float(best)


def _long_record(obj, newton, P, x):
    f, g, nz, d0 = obj.bind(P).newton(x)
    newton.direction(nz, d0, g, 0.0)


def _batch(obj, x, nx, T):
    res = obj.newton_many(list(range(len(x))), x)
    stacked_directions([(nz, d0, g, 0.0) for _, g, nz, d0 in res], nx, T)


def smoothing_floor(stages, theta_vec, data, xs, rho: float = 0.0, repeats: int = 3,
                    clock=time.perf_counter, observe=None) -> float:
    """Seconds of one smoothing iteration's irreducible work for all trajectories (module docstring).

    Parameters
    ----------
    stages : StageFunctions
        The model's stage Functions (the smoother's: same compilation).
    theta_vec : numpy.ndarray
        (np,) parameters.
    data : Trajectories
        The B trajectories.
    xs : list of numpy.ndarray
        States (T_b, nx) at which to evaluate (e.g. the smoothed ones).
    rho : float
        Trust-region weight rho_x.
    repeats : int
        Timings; the minimum is returned.
    clock : callable
        ``time.perf_counter`` (wall seconds) or ``time.process_time`` (CPU seconds), see `best_time`.
    observe : callable, optional
        The smoother's column-wise observation map (`Smoother(observe=...)`): the batched
        trajectories' observation terms are then evaluated as the smoother evaluates them.
    """
    model = stages.model
    groups: dict[int, list[int]] = {}
    for b, T in enumerate(data.lengths):
        groups.setdefault(T, []).append(b)
    work = []  # one closure per evaluation unit, built (and warmed up) before timing
    for T, idx in groups.items():
        if T >= CHUNK_FROM:  # long records: the banded solver's chunked objective, one by one
            ts = TrajectorySmoother(stages, T, SmootherOptions(solver="banded"))
            obj = ChunkedObjective(stages, band_column_functions(model.nx)[1], T, CHUNK_LENGTH)
            newton = BandedNewton(model.nx, T, 1, 1e-8)
            for b in idx:
                P = ts.parameter_vector(model, theta_vec, data.y[b], data.inputs(b), xs[b], rho)
                work.append(partial(_long_record, obj, newton, P, np.ravel(xs[b])))
            continue
        per = max(1, BATCH_COLUMNS // T)
        for a in range(0, len(idx), per):
            part = idx[a:a + per]
            obj = BatchObjective(stages, T, observe).bind(model, theta_vec, [data.y[b] for b in part],
                                                 [data.inputs(b) for b in part], [xs[b] for b in part], rho)
            work.append(partial(_batch, obj, [np.ravel(xs[b]) for b in part], model.nx, T))
    return best_time(work, repeats, clock)


def _learn(calls, args, m: int, npar: int):
    calls[0](*args)
    if len(calls) > 1:  # stage Jacobians (nr, m np) column-major -> rows of J (m nr, np), then J^T J
        (J,) = calls[1](*args)
        nr = J.size // (m * npar)
        gram(J.reshape(m, npar, nr).transpose(0, 2, 1).reshape(m * nr, npar))


def _mapped_sum(fun, n: int, shared: list[bool], reduce_out: list[bool]):
    return BufferedCall(fun.map(n, shared, reduce_out))


def learning_floor(stages, theta_vec, data, xs, hessian: bool = True, repeats: int = 3,
                   clock=time.perf_counter) -> float:
    """Seconds of one evaluation of the learning objective, its gradient and (``hessian``) the
    Gauss-Newton Hessian over all stages of ``data`` at states ``xs`` (module docstring).

    Parameters
    ----------
    stages : StageFunctions
        The model's stage Functions.
    theta_vec : numpy.ndarray
        (np,) parameters.
    data : Trajectories
        The trajectories.
    xs : list of numpy.ndarray
        States (T_b, nx).
    hessian : bool
        Include the Gauss-Newton Hessian (False for learners without one, e.g. Adam).
    repeats : int
        Timings; the minimum is returned.
    clock : callable
        ``time.perf_counter`` (wall seconds) or ``time.process_time`` (CPU seconds), see `best_time`.
    """
    model = stages.model
    (Xo, Uo, Yo, Mo), (X0, X1, U0) = stack_stages(data, xs)
    noise = model.noise
    p = np.asarray(theta_vec, float)
    terms = [("dyn", [X0, X1, U0], noise.inv_process_std, stages.dyn_uses_p)]
    if stages.obs_uses_p:
        terms.append(("obs", [Xo, Uo, Yo, Mo], noise.inv_measurement_std, True))
    work = []
    for prefix, cols, w, _ in terms:
        n = cols[0].shape[1]
        names = [f"{prefix}_p_grad"] + ([f"{prefix}_p_jac"] if hessian else [])
        funs = stages.get(*names, columns=n)
        for a in range(0, n, LEARN_CHUNK):
            b = min(a + LEARN_CHUNK, n)
            args = [c[:, a:b] for c in cols]
            args.insert(len(cols), p)
            args.append(w)
            shared = [i >= len(cols) for i in range(len(args))]
            calls = [_mapped_sum(funs[0], b - a, shared, [True, True])]
            if hessian:
                calls.append(_mapped_sum(funs[1], b - a, shared, [False]))

            work.append(partial(_learn, calls, args, b - a, p.size))
    return best_time(work, repeats, clock)


def floor_row(phase_s: float, floor_s: float, iterations: float | None = None) -> dict:
    """``{"phase_s", "floor_s", "ratio"}`` (+ ``iterations`` and ``ratio_per_iteration`` =
    phase_s / (iterations floor_s) when the phase made several iterations)."""
    row = {"phase_s": float(phase_s), "floor_s": float(floor_s),
           "ratio": float(phase_s / floor_s) if floor_s > 0 else float("nan")}
    if iterations:
        row["iterations"] = float(iterations)
        row["ratio_per_iteration"] = float(phase_s / (iterations * floor_s)) if floor_s > 0 else float("nan")
    return row


def format_floor(name: str, row: dict) -> str:
    """One line: ``name: phase 1.234 s, floor 0.456 s, ratio 2.7x (per iteration 0.9x)``."""
    extra = f" (per iteration {row['ratio_per_iteration']:.2f}x over {row['iterations']:.1f})" \
        if "ratio_per_iteration" in row else ""
    return f"{name}: phase {row['phase_s']:.3f} s, floor {row['floor_s']:.3f} s, ratio {row['ratio']:.2f}x{extra}"


