"""Named model parameters (shapes, values, bounds, free masks, priors) and their flat vector: the entries in
declaration order, row-major within a matrix; values travel as ``theta``, a dict name -> array."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace

import casadi as ca
import numpy as np

from ..errors import NonFiniteError, ParameterError, ShapeError

Theta = dict[str, np.ndarray]


def _as_shape(value, shape) -> tuple[int, ...]:
    if shape is not None:
        shape = tuple(int(s) for s in np.atleast_1d(shape)) if not isinstance(shape, tuple) else shape
        if len(shape) > 2:
            raise ShapeError(f"parameter shapes have at most 2 dimensions, got {shape}")
        return shape
    return np.shape(value)


@dataclass(frozen=True)
class Param:
    """One named parameter (a scalar, vector or matrix) with bounds, free mask and prior.

    Parameters
    ----------
    name : str
        Identifier used as ``p.<name>`` inside model functions.
    value : float or array_like
        Initial value (scalar, vector or matrix); defines the shape unless ``shape`` is given.
    shape : tuple, optional
        Explicit shape ``()``, ``(n,)`` or ``(r, c)``; ``value`` is broadcast to it.
    lower, upper : float or array_like
        Bounds (scalar or array of the parameter's shape); default unbounded.
    free : bool or array_like
        ``True``/``False`` or a boolean array of the parameter's shape (per entry).
    prior_mean, prior_std : float or array_like, optional
        Gaussian prior ``N(prior_mean, prior_std**2)`` per entry (give both or neither).

    Raises
    ------
    ParameterError
        A name that is not an identifier, lower above upper, an incomplete or non-positive prior.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> a = cc.Param("a", 0.5, lower=0.0, upper=1.0)
    >>> A = cc.Param("A", 0.0, shape=(2, 2), free=[[True, False], [True, True]])
    >>> a.shape, A.shape, A.size
    ((), (2, 2), 4)
    >>> try:
    ...     cc.Param("a", 0.5, lower=1.0, upper=0.0)
    ... except cc.ParameterError as err:
    ...     print(type(err).__name__)
    ParameterError
    """

    name: str
    value: object = 0.0
    shape: tuple | None = None
    lower: object = -np.inf
    upper: object = np.inf
    free: object = True
    prior_mean: object = None
    prior_std: object = None
    _arrays: dict = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ParameterError(f"parameter name must be a Python identifier, got {self.name!r}")
        shape = _as_shape(self.value, self.shape)
        arrays = {}
        for key in ("value", "lower", "upper", "free", "prior_mean", "prior_std"):
            raw = getattr(self, key)
            if raw is None:
                arrays[key] = None
                continue
            dtype = bool if key == "free" else float
            try:
                arrays[key] = np.broadcast_to(np.asarray(raw, dtype=dtype), shape).copy()
            except ValueError:
                raise ShapeError(
                    f"parameter {self.name!r}: {key} of shape {np.shape(raw)} does not fit the "
                    f"parameter shape {shape}") from None
        if not np.all(np.isfinite(arrays["value"])):
            raise NonFiniteError(f"parameter {self.name!r}: initial value must be finite, got {self.value}")
        if np.any(arrays["lower"] > arrays["upper"]):
            raise ParameterError(f"parameter {self.name!r}: lower bound above upper bound")
        if (arrays["prior_mean"] is None) != (arrays["prior_std"] is None):
            raise ParameterError(f"parameter {self.name!r}: give both prior_mean and prior_std, or neither")
        if arrays["prior_std"] is not None and np.any(arrays["prior_std"] <= 0):
            raise ParameterError(f"parameter {self.name!r}: prior_std must be positive")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "_arrays", arrays)

    @property
    def size(self) -> int:
        """Number of scalar entries."""
        return int(np.prod(self.shape, dtype=int))

    def array(self, key: str) -> np.ndarray | None:
        """The field ``key`` broadcast to the parameter's shape."""
        return self._arrays[key]


class Parameters:
    """An ordered collection of [`Param`][ceem_casadi.Param] with flat-vector conversions.

    The flat parameter vector (``theta_vec``, ``size`` entries) stacks every parameter's entries
    in declaration order (row-major within a matrix).

    Parameters
    ----------
    *params : Param
        The parameters (or one iterable of them).

    Attributes
    ----------
    size : int
        Total number of scalar entries.
    free_mask : numpy.ndarray
        (size,) bool, the entries the learning step optimises.

    Raises
    ------
    ParameterError
        Duplicate names.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> params = cc.Parameters(cc.Param("a", 0.5), cc.Param("b", [1.0, 2.0]))
    >>> params.names, params.size
    (['a', 'b'], 3)
    >>> params.to_vector({"a": 0.9, "b": [3.0, 4.0]})
    array([0.9, 3. , 4. ])
    """

    def __init__(self, *params: Param):
        if len(params) == 1 and not isinstance(params[0], Param):
            params = tuple(params[0])
        names = [p.name for p in params]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ParameterError(f"duplicate parameter names: {sorted(dup)}")
        self._params: dict[str, Param] = {p.name: p for p in params}
        self._offsets: dict[str, slice] = {}
        start = 0
        for p in params:
            self._offsets[p.name] = slice(start, start + p.size)
            start += p.size
        self.size = start

    # --- structure -----------------------------------------------------------------
    def __iter__(self):
        return iter(self._params.values())

    def __len__(self) -> int:
        return len(self._params)

    def __getitem__(self, name: str) -> Param:
        try:
            return self._params[name]
        except KeyError:
            raise ParameterError(f"unknown parameter {name!r}; known: {self.names}") from None

    @property
    def names(self) -> list[str]:
        """Parameter names in declaration order."""
        return list(self._params)

    def slice(self, name: str) -> slice:
        """Position of parameter ``name`` in the flat vector."""
        self[name]
        return self._offsets[name]

    def _stack(self, key: str, fill: float | bool) -> np.ndarray:
        out = [np.full(p.size, fill) if p.array(key) is None else p.array(key).ravel() for p in self]
        return np.concatenate(out) if out else np.zeros(0)

    @property
    def free_mask(self) -> np.ndarray:
        """(size,) bool: the entries the learning step optimises."""
        return self._stack("free", True).astype(bool)

    @property
    def free_index(self) -> np.ndarray:
        """Positions of the free entries in the flat vector."""
        return np.flatnonzero(self.free_mask)

    @property
    def lower(self) -> np.ndarray:
        """(size,) lower bounds (-inf where none)."""
        return self._stack("lower", -np.inf)

    @property
    def upper(self) -> np.ndarray:
        """(size,) upper bounds (inf where none)."""
        return self._stack("upper", np.inf)

    @property
    def prior(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, precision_sqrt)`` flat vectors; precision 0 where no prior is set."""
        mean = self._stack("prior_mean", 0.0)
        std = self._stack("prior_std", np.inf)
        return mean, 1.0 / std

    def initial(self) -> Theta:
        """The declared initial values as a theta dict."""
        return {p.name: p.array("value").copy() for p in self}

    # --- values <-> vector -----------------------------------------------------------
    def validate(self, theta: Mapping[str, object], *, partial: bool = False) -> Theta:
        """Check names, shapes, finiteness and bounds; return a clean theta dict.

        With ``partial=True`` missing names are filled from the declared initial values.
        """
        if not isinstance(theta, Mapping):
            raise ParameterError(f"theta must be a mapping name -> value, got {type(theta).__name__}")
        unknown = sorted(set(theta) - set(self._params))
        if unknown:
            raise ParameterError(f"unknown parameter name(s) {unknown}; the model declares {self.names}")
        missing = [n for n in self._params if n not in theta]
        if missing and not partial:
            raise ParameterError(f"missing value(s) for parameter(s) {missing}; give all of {self.names}")
        out: Theta = {}
        for p in self:
            if p.name not in theta:
                out[p.name] = p.array("value").copy()
                continue
            try:
                v = np.asarray(theta[p.name], dtype=float)
            except (TypeError, ValueError):
                raise ParameterError(f"parameter {p.name!r}: expected a number or an array of numbers of shape "
                                     f"{p.shape}, got {theta[p.name]!r}") from None
            if v.shape != p.shape and v.size == p.size == 1:
                v = v.reshape(p.shape)
            if v.shape != p.shape:
                raise ShapeError(f"parameter {p.name!r}: expected shape {p.shape}, got {v.shape}")
            if not np.all(np.isfinite(v)):
                raise NonFiniteError(f"parameter {p.name!r}: values must be finite, got {v}")
            lo, hi = p.array("lower"), p.array("upper")
            if np.any(v < lo) or np.any(v > hi):
                raise ParameterError(
                    f"parameter {p.name!r}: value {v} outside its bounds [{lo}, {hi}]")
            out[p.name] = v.copy()
        return out

    def to_vector(self, theta: Mapping[str, object]) -> np.ndarray:
        """Flat vector (``size``,) of a complete theta dict (validated)."""
        theta = self.validate(theta)
        return np.concatenate([theta[p.name].ravel() for p in self]) if self._params else np.zeros(0)

    def from_vector(self, vec: Iterable[float]) -> Theta:
        """Theta dict of a flat vector (``size``,)."""
        vec = np.asarray(vec, dtype=float).ravel()
        if vec.size != self.size:
            raise ShapeError(f"parameter vector: expected {self.size} entries, got {vec.size}")
        return {p.name: vec[self._offsets[p.name]].reshape(p.shape).copy() for p in self}

    # --- symbols ---------------------------------------------------------------------
    def symbols(self, vec: ca.SX | ca.MX) -> SimpleNamespace:
        """Namespace ``p`` with ``p.<name>`` symbolic views of the flat symbol ``vec``.

        Matrices are views in row-major order, so ``p.H @ x`` means what it says.
        """
        ns = {}
        for p in self:
            v = vec[self._offsets[p.name]]
            ns[p.name] = v if len(p.shape) < 2 else ca.reshape(v, p.shape[1], p.shape[0]).T
        return SimpleNamespace(**ns)
