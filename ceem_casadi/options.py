"""Option dataclasses (frozen, self-validating) with defaults from the CE-EM paper."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import numpy as np

from .errors import OptionsError


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise OptionsError(msg)


ACCELERATIONS = ("none", "squarem", "newton", "joint")
SMOOTHER_SOLVERS = ("ipopt", "banded", "batched")  # of the smoothing NLP (:mod:`ceem_casadi.banded_newton`)
HESSIANS = ("gauss-newton", "exact")  # of the stage Functions (smoother, learner, uncertainty)


def check_time_limit(value) -> None:
    """Raise :class:`~ceem_casadi.errors.OptionsError` (a ValueError) unless ``value`` is None or a
    finite number of seconds > 0."""
    ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                           and np.isfinite(value) and value > 0)
    _require(ok, f"time_limit must be None or a finite number of seconds > 0, got {value!r}")


@dataclass(frozen=True)
class SmootherOptions:
    """Smoothing step (E-step): IPOPT over x_{1:T} of each trajectory.

    Parameters
    ----------
    rho_x : float
        Trust-region weight of ``rho_x * ||x - x_prev||^2`` (paper: rho_x), >= 0.
    hessian : str
        ``"gauss-newton"`` (default; fastest in ``scripts/bench_lorenz.py``) or ``"exact"``.
    max_iter : int
        IPOPT iteration limit.
    tol : float
        IPOPT (scaled) tolerance.
    x_lower, x_upper : float or sequence of float, optional
        Bounds on every hidden state (a scalar or nx values).
    compile : bool, optional
        Compile the stage Functions to native code (cached on disk); ``None`` = when a C
        compiler exists and the stage programs are long enough to pay off.
    chunk : int, optional
        Evaluate cost, gradient and Hessian in chunks of this many time steps (memory of long
        records, same numbers); ``None`` = chunks of 2,000 from T = 20,000 on, 0 = never.
    solver : str, optional
        ``"ipopt"`` (IPOPT + MUMPS), ``"banded"`` (Newton steps on the block-tridiagonal Hessian
        with LAPACK's banded Cholesky, a Levenberg-Marquardt shift and an Armijo line search,
        :mod:`ceem_casadi.banded_newton`; same optimum, no state bounds), ``"batched"`` (the same
        Newton steps for all trajectories of a length at once, `ceem_casadi.batched_smoother`)
        or ``None`` (default): ``"banded"`` from T = 20,000 on when there are no bounds, batched
        where `ceem_casadi.batched_smoother.batched_default` says so, else ``"ipopt"``.

    Raises
    ------
    OptionsError
        A value out of range (also a ``ValueError``).
    """

    rho_x: float = 0.0
    hessian: str = "gauss-newton"
    max_iter: int = 100
    tol: float = 1e-8
    x_lower: object = None
    x_upper: object = None
    compile: bool | None = None
    chunk: int | None = None
    solver: str | None = None

    def __post_init__(self):
        _require(self.solver is None or self.solver in SMOOTHER_SOLVERS,
                 f"solver must be None or one of {SMOOTHER_SOLVERS}, got {self.solver!r}")
        _require(self.solver not in ("banded", "batched") or (self.x_lower is None and self.x_upper is None),
                 f"solver={self.solver!r} solves the smoothing problem without state bounds, but x_lower / x_upper "
                 f"were given ({self.x_lower!r}, {self.x_upper!r}): use solver='ipopt' (or None) with bounds, "
                 "or drop the bounds")
        _require(self.chunk is None or (isinstance(self.chunk, int) and not isinstance(self.chunk, bool)
                                        and self.chunk >= 0), f"chunk must be None or an int >= 0, got {self.chunk!r}")
        _require(self.rho_x >= 0, f"rho_x must be >= 0, got {self.rho_x}")
        _require(self.hessian in HESSIANS, f"hessian must be one of {HESSIANS}, got {self.hessian!r}")
        _require(self.max_iter > 0 and self.tol > 0, "max_iter and tol must be positive")
        for name in ("x_lower", "x_upper"):
            v = getattr(self, name)
            ok = v is None or not isinstance(v, (str, bytes, bool))
            if ok and v is not None:
                try:
                    ok = np.asarray(v, dtype=float).ndim <= 1 and not np.any(np.isnan(np.asarray(v, dtype=float)))
                except (TypeError, ValueError):
                    ok = False
            _require(ok, f"{name} must be None, a number or a list of nx numbers, got {v!r}")


@dataclass(frozen=True)
class LearnerOptions:
    """Learning step (M-step): IPOPT over the free parameters for fixed states.

    Parameters
    ----------
    rho_theta : float
        Trust-region weight of ``rho_theta * ||theta - theta_prev||^2``, >= 0.
    hessian : str
        ``"exact"``, ``"gauss-newton"`` (J^T J of the stacked residual Jacobians, formed with
        BLAS), ``"limited-memory"`` (L-BFGS in IPOPT) or ``"auto"`` (default): exact when the
        per-stage exact Hessian program is short (parameters touch few states, e.g. single
        Lorenz), Gauss-Newton when it is long (e.g. RK4 mixing hundreds of coupling parameters,
        where the exact Hessian costs ~10x more per evaluation for the same iterations).
    max_iter : int
        IPOPT iteration limit.
    tol : float
        IPOPT (scaled) tolerance.
    use_prior : bool
        Include the parameters' Gaussian priors ``log p(theta)``.
    compile : bool, optional
        As in :class:`SmootherOptions`.

    Raises
    ------
    OptionsError
        A value out of range (also a ``ValueError``).
    """

    rho_theta: float = 0.0
    hessian: str = "auto"
    max_iter: int = 200
    tol: float = 1e-9
    use_prior: bool = True
    compile: bool | None = None

    def __post_init__(self):
        _require(self.rho_theta >= 0, f"rho_theta must be >= 0, got {self.rho_theta}")
        allowed = (*HESSIANS, "limited-memory", "auto")
        _require(self.hessian in allowed, f"hessian must be one of {allowed}, got {self.hessian!r}")
        _require(self.max_iter > 0 and self.tol > 0, "max_iter and tol must be positive")


@dataclass(frozen=True)
class CEEMOptions:
    """The EM loop (Algorithm 1 of the paper).

    Parameters
    ----------
    max_iters : int
        Maximum number of EM iterations (smoothing + learning), >= 1.
    tol : float
        Stop when the increase of J over one iteration is at most ``tol * max(1, |J|)``.
    smoother : SmootherOptions
        Options of the smoothing step.
    learner : LearnerOptions
        Options of the learning step.
    n_jobs : int
        Processes for the smoothing step (trajectories are independent problems).
    raise_on_failure : bool
        Raise :class:`~ceem_casadi.errors.SolverError` instead of returning a result with
        ``status = "solver_failed"``.
    acceleration : str
        ``"none"`` (Algorithm 1 as in the paper) or ``"squarem"``: after every two EM steps, one
        step from a SQUAREM extrapolation, kept only if it improves the objective. Plain EM
        converges linearly and slowly when states and parameters are strongly coupled (many
        hidden, nearly deterministic states); SQUAREM needs far fewer iterations there.
        ``"newton"``: after the first EM step, joint Gauss-Newton (Levenberg-Marquardt) steps on
        (x, theta) over the same objective, each kept only if it improves it, with plain EM steps
        whenever one fails; converges quadratically near the optimum (see :func:`ceem`).
        ``"joint"``: after the first EM step, IPOPT solves the joint problem max_{x, theta} J in
        one NLP (all states, free parameters; arrowhead Hessian, :mod:`ceem_casadi.joint_nlp`),
        then a plain EM step checks the result (convergence is judged on it as always).
    joint_hessian : str
        Hessian of the ``"joint"`` NLP: ``"auto"`` (default; Gauss-Newton, then exact once
        Gauss-Newton's progress per iteration is small), ``"exact"`` or ``"gauss-newton"``.
    blas_threads : int, optional
        Threads of numpy's/scipy's BLAS during the fit (1 by default: multi-threaded BLAS
        degrades badly on shared cores, see :mod:`ceem_casadi._threads`); ``None`` leaves the
        library's setting alone.
    time_limit : float, optional
        Wall-clock budget in seconds for the whole :func:`~ceem_casadi.ceem` call (solver
        construction and initial states included), or ``None`` (default: no limit). The budget is
        checked before every step and passed to every IPOPT solve, which stops at its next
        iteration once it is spent (overrun: about one IPOPT iteration plus one evaluation of J);
        the interrupted step is discarded and the fit returns ``status = "time_limit"`` with the
        last accepted iterate (theta, states, history).
    executor : ``None`` (default: ``n_jobs`` decides), a ``dask.distributed.Client`` (smoothing and
        learning distributed, states kept on the workers), a ``concurrent.futures.Executor``
        (smoothing distributed) or a :class:`~ceem_casadi.distributed.Sharded` wrapping either
        (see :mod:`ceem_casadi.distributed` and docs/scaling.md). Not together with ``n_jobs > 1``.

    Raises
    ------
    OptionsError
        A value out of range or of the wrong type (also a ``ValueError``).
    """

    max_iters: int = 50
    tol: float = 1e-9
    smoother: SmootherOptions = field(default_factory=SmootherOptions)
    learner: LearnerOptions = field(default_factory=LearnerOptions)
    n_jobs: int = 1
    raise_on_failure: bool = False
    acceleration: str = "none"
    blas_threads: int | None = 1
    time_limit: float | None = None
    joint_hessian: str = "auto"
    executor: object = None

    def __post_init__(self):
        check_time_limit(self.time_limit)
        _require(self.joint_hessian in (*HESSIANS, "auto"),
                 f"joint_hessian must be one of {(*HESSIANS, 'auto')}, got {self.joint_hessian!r}")
        from .distributed import check_executor  # not at module level: it imports the solvers

        check_executor(self.executor)
        _require(self.executor is None or self.n_jobs == 1,
                 f"give either executor or n_jobs > 1, not both (n_jobs={self.n_jobs}): n_jobs is the "
                 "single-machine shorthand for an executor")
        _require(self.blas_threads is None or (isinstance(self.blas_threads, int) and self.blas_threads >= 1),
                 f"blas_threads must be None or an int >= 1, got {self.blas_threads!r}")
        _require(self.acceleration in ACCELERATIONS,
                 f"acceleration must be one of {ACCELERATIONS}, got {self.acceleration!r}")
        _require(self.max_iters >= 1, f"max_iters must be >= 1, got {self.max_iters}")
        _require(np.isfinite(self.tol) and self.tol >= 0, f"tol must be finite and >= 0, got {self.tol}")
        _require(self.n_jobs >= 1, f"n_jobs must be >= 1, got {self.n_jobs}")
        _require(isinstance(self.smoother, SmootherOptions), "smoother must be a SmootherOptions")
        _require(isinstance(self.learner, LearnerOptions), "learner must be a LearnerOptions")

    @classmethod
    def from_mapping(cls, mapping) -> CEEMOptions:
        """Options from plain data (e.g. a parsed TOML or JSON file), with the types checked.

        Parameters
        ----------
        mapping : Mapping
            CEEMOptions fields at the top level and optional tables ``smoother`` and ``learner``
            of :class:`SmootherOptions` / :class:`LearnerOptions` fields; absent fields keep
            their defaults. Integers must be integers (``max_iters = 2.5`` is refused, not
            truncated), numbers finite unless a bound, strings strings, flags booleans.

        Returns
        -------
        CEEMOptions

        Raises
        ------
        OptionsError
            Naming the key, what was expected and what was given (also a ``ValueError``).
        """
        if not isinstance(mapping, Mapping):
            raise OptionsError(f"options: expected a mapping of option names to values, got {type(mapping).__name__}")
        tables = {"smoother": SmootherOptions, "learner": LearnerOptions}
        top = {k: v for k, v in mapping.items() if k not in tables}
        kwargs = _typed_fields(cls, top, "", exclude=tuple(tables))
        for key, sub in tables.items():
            if key in mapping:
                if not isinstance(mapping[key], Mapping):
                    raise OptionsError(f"{key}: expected a table of {sub.__name__} options, got {mapping[key]!r}")
                kwargs[key] = sub(**_typed_fields(sub, mapping[key], f"{key}."))
        return cls(**kwargs)


_KINDS = {"max_iters": "int", "n_jobs": "int", "max_iter": "int", "blas_threads": "int?", "tol": "float",
          "rho_x": "float", "rho_theta": "float", "hessian": "str", "acceleration": "str", "joint_hessian": "str",
          "use_prior": "bool", "raise_on_failure": "bool", "compile": "bool?", "chunk": "int?", "solver": "str?",
          "x_lower": "bound",
          "x_upper": "bound"}
_EXPECT = {"int": "an integer", "int?": "an integer", "float": "a finite number", "str": "a string",
           "str?": "a string",
           "bool": "true or false", "bool?": "true or false", "bound": "a number or a list of numbers"}


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _typed_fields(cls, mapping, prefix: str, exclude=()) -> dict:
    known = [f.name for f in fields(cls) if f.name not in exclude]
    out = {}
    for key, v in mapping.items():
        if key not in known:
            raise OptionsError(f"unknown option '{prefix}{key}'; known: {sorted(known)}"
                             + (", tables smoother, learner" if exclude else ""))
        kind = _KINDS.get(key)
        if kind is None:  # a field without a declared kind: its dataclass validates it
            out[key] = v
            continue
        if kind.endswith("?") and v is None:
            ok = True
        elif kind.startswith("int"):
            ok = _is_number(v) and float(v).is_integer() and not isinstance(v, (float, np.floating))
        elif kind == "float":
            ok = _is_number(v) and bool(np.isfinite(v))
        elif kind.startswith("str"):
            ok = isinstance(v, str)
        elif kind.startswith("bool"):
            ok = isinstance(v, (bool, np.bool_))
        else:  # bound: a number (inf allowed) or a flat list of numbers
            ok = (_is_number(v) and not np.isnan(v)) or (isinstance(v, (list, tuple)) and len(v) > 0 and all(
                _is_number(e) and not np.isnan(e) for e in v))
        if not ok:
            raise OptionsError(f"option {prefix}{key} must be {_EXPECT[kind]}, got {v!r} ({type(v).__name__})")
        out[key] = int(v) if kind.startswith("int") and v is not None else v
    return out
