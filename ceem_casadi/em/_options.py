"""Options of the EM loop (Algorithm 1 of the paper)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from ..distributed._executors import check_executor, engine_has_learner
from ..errors import OptionsError
from ..learning._options import LearnerOptions
from ..model._nn import AdamOptions
from ..runtime._schema import check_fields, check_time_limit, renamed, require, typed_fields
from ..smoothing._options import SmootherOptions
from ._accelerations import Acceleration, Joint, acceleration_of


def _joint_hessian(value, kwargs) -> None:
    """use acceleration=ceem_casadi.em.Joint(hessian=...)"""
    acc = kwargs.get("acceleration", "none")
    require(value == "auto" or acc == "joint" or isinstance(acc, Joint),
            f"joint_hessian={value!r} is the Hessian of acceleration='joint', but acceleration={acc!r}: set "
            "acceleration=ceem_casadi.em.Joint(hessian=...), or leave joint_hessian out")
    if acc == "joint":
        kwargs["acceleration"] = Joint(hessian=value)
    elif isinstance(acc, Joint):
        require(value in ("auto", acc.hessian), f"joint_hessian={value!r} contradicts acceleration={acc!r}")


def _blas_threads(value, kwargs) -> None:
    """a fit always runs numpy's BLAS with one thread (measured faster: docs/algorithms.md)"""
    require(value == 1, f"blas_threads={value!r}: a fit always runs numpy's BLAS with one thread (multi-threaded "
                        "BLAS measured 1.7-4.4x slower per fit, docs/algorithms.md); leave blas_threads out")


@renamed(joint_hessian=_joint_hessian, blas_threads=_blas_threads)
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
    learner : LearnerOptions or AdamOptions
        The learning step: IPOPT (`LearnerOptions`) or mini-batch Adam (`AdamOptions`) for large neural-network
        terms (not with Dask).
    n_jobs : int
        Processes for the smoothing step (trajectories are independent problems).
    raise_on_failure : bool
        Raise [`SolverError`][ceem_casadi.SolverError] instead of returning ``status = "solver_failed"``.
    acceleration : str or Acceleration
        A strategy of `ceem_casadi.em` with its own settings, or its name for its defaults: ``"none"`` (`Plain`,
        Algorithm 1), ``"squarem"``, ``"newton"`` (joint Gauss-Newton steps) or ``"joint"`` (one IPOPT NLP over
        (x, theta)); which to choose: docs/choosing.md. ``joint_hessian=``: deprecated, ``Joint(hessian=...)``.
    time_limit : float, optional
        Wall-clock budget (s) of the whole [`ceem`][ceem_casadi.ceem] call; the interrupted step is discarded and
        the fit returns ``status = "time_limit"`` with the last accepted iterate.
    warm_start : int, optional
        Long records: first fit the leading ``warm_start`` samples of every trajectory (``result.warm_start``);
        ``None``: the long-record policy (docs/long_records.md), ``0``: never. The fixed point stays the same.
    executor : dask.distributed.Client, concurrent.futures.Executor or Sharded, optional
        A Dask ``Client`` (smoothing and learning on the cluster), a ``concurrent.futures.Executor`` (smoothing)
        or a [`Sharded`][ceem_casadi.Sharded] wrapping either (docs/scaling.md); not with ``n_jobs > 1``.

    Raises
    ------
    OptionsError
        A value out of range or of the wrong type (also a ``ValueError``).

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> opts = cc.CEEMOptions(max_iters=20, acceleration="newton", smoother=cc.SmootherOptions(compile=False))
    >>> opts.max_iters, opts.acceleration, opts.smoother.compile
    (20, 'newton', False)
    >>> try:
    ...     cc.CEEMOptions(acceleration="fast")
    ... except cc.OptionsError as err:
    ...     print(type(err).__name__)
    OptionsError
    """

    max_iters: int = 50
    tol: float = 1e-9
    smoother: SmootherOptions = field(default_factory=SmootherOptions)
    learner: LearnerOptions | AdamOptions = field(default_factory=LearnerOptions)
    n_jobs: int = 1
    raise_on_failure: bool = False
    acceleration: str | Acceleration = "none"
    time_limit: float | None = None
    executor: object = None
    warm_start: int | None = None

    def __post_init__(self):
        check_fields(self)
        check_time_limit(self.time_limit)
        check_executor(self.executor)
        require(self.executor is None or self.n_jobs == 1,
                 f"give either executor or n_jobs > 1, not both (n_jobs={self.n_jobs}): n_jobs is the "
                 "single-machine shorthand for an executor")
        acceleration_of(self.acceleration)  # a name or an Acceleration
        require(self.max_iters >= 1, f"max_iters must be >= 1 (an integer), got {self.max_iters!r}")
        require(self.tol >= 0, f"tol must be finite and >= 0, got {self.tol}")
        require(self.warm_start is None or self.warm_start >= 0,
                f"warm_start must be None (the long-record policy), 0 (never) or a number of samples >= 1, "
                f"got {self.warm_start!r}")
        require(self.n_jobs >= 1, f"n_jobs must be >= 1 (an integer), got {self.n_jobs!r}")
        require(isinstance(self.learner, (LearnerOptions, AdamOptions)),
                f"learner must be a LearnerOptions or an AdamOptions, got {type(self.learner).__name__}")
        # the strategies together: a Dask engine learns on its workers with the IPOPT learner
        require(not (isinstance(self.learner, AdamOptions) and engine_has_learner(self.executor)),
                "learner=AdamOptions(...) cannot be used with a Dask executor, whose engine learns from the states "
                "kept on its workers with the IPOPT learner (LearnerOptions): use LearnerOptions, or a "
                "concurrent.futures executor")

    @classmethod
    def from_mapping(cls, mapping) -> CEEMOptions:
        """Options from plain data (e.g. a parsed TOML or JSON file), with the types checked.

        Parameters
        ----------
        mapping : Mapping
            CEEMOptions fields at the top level, optional tables ``smoother`` and ``learner`` of `SmootherOptions` /
            `LearnerOptions` fields; absent fields keep their defaults. Integers must be integers (``max_iters =
            2.5`` is refused, not truncated), numbers finite unless a bound, strings strings, flags booleans.

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
        kwargs = typed_fields(cls, top, "", exclude=tuple(tables))
        for key, sub in tables.items():
            if key in mapping:
                if not isinstance(mapping[key], Mapping):
                    raise OptionsError(f"{key}: expected a table of {sub.__name__} options, got {mapping[key]!r}")
                kwargs[key] = sub(**typed_fields(sub, mapping[key], f"{key}."))
        return cls(**kwargs)


@dataclass(frozen=True)
class FitPlan:
    """A `CEEMOptions` resolved once by `ceem`: the strategy objects (smoother, learner, acceleration) and the loop's
    settings; each floor receives only its own."""

    smoother: SmootherOptions
    learner: LearnerOptions
    acceleration: Acceleration
    max_iters: int
    tol: float
    n_jobs: int
    executor: object
    warm_start: int | None
    raise_on_failure: bool
    time_limit: float | None

    @classmethod
    def of(cls, options: CEEMOptions) -> FitPlan:
        """The plan of ``options``: shorthands replaced by their strategy objects."""
        same = {f.name: getattr(options, f.name) for f in fields(cls)}
        return cls(**{**same, "acceleration": acceleration_of(options.acceleration)})
