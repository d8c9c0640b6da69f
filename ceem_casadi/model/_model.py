"""State-space model structure ``x[t+1] = f(x[t], u[t], p) + w``, ``y[t] = g(x[t], u[t], p) + v`` with diagonal
Gaussian noise: user functions traced once into CasADi Functions (continuous time: RK4 over ``dt``)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import casadi as ca
import numpy as np

from ..errors import ModelError, OptionsError, ShapeError
from ..runtime._checks import noise_level
from ..runtime._schema import sample_time
from ._integrators import as_column, rk4_step
from ._params import Parameters, Theta


@dataclass(frozen=True)
class Noise:
    """Diagonal Gaussian noise model (standard deviations, in the units of x and y).

    Attributes
    ----------
    process_std : numpy.ndarray
        (nx,) standard deviations of the process noise w; weight the dynamics residuals of the
        CE-EM objective.
    measurement_std : numpy.ndarray
        (ny,) standard deviations of the measurement noise v.
    x1_mean, x1_std : numpy.ndarray or None
        (nx,) optional Gaussian prior on the first state.
    inv_process_std, inv_measurement_std, inv_x1_std : numpy.ndarray or None
        ``1 / process_std`` etc. (the residual weights of every stage).

    Examples
    --------
    >>> import numpy as np
    >>> from ceem_casadi.model import Noise
    >>> Noise(process_std=np.array([0.1]), measurement_std=np.array([0.2])).measurement_std
    array([0.2])
    """

    process_std: np.ndarray
    measurement_std: np.ndarray
    x1_mean: np.ndarray | None = None
    x1_std: np.ndarray | None = None
    inv_process_std: np.ndarray | None = field(init=False, repr=False, compare=False)
    inv_measurement_std: np.ndarray | None = field(init=False, repr=False, compare=False)
    inv_x1_std: np.ndarray | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        for name in ("process_std", "measurement_std", "x1_std"):
            v = getattr(self, name)
            object.__setattr__(self, f"inv_{name}", None if v is None else 1.0 / v)


_ROLE = {"f": "step", "rhs": "right-hand side", "observe": "observation"}
_SPARE = 64  # at most this many extra inputs/states are tried to find what a failing function indexes


def _traced(name, fun, x, u, p, nx: int, nu: int):
    """``fun(x, u, p)`` as a column; when tracing fails, find out whether the function indexes
    ``u`` beyond ``nu`` or ``x`` beyond ``nx`` and raise [`ModelError`][ceem_casadi.errors.ModelError] naming the fix."""
    try:
        return as_column(fun(x, u, p))
    except AttributeError as exc:  # p.<name> of an undeclared parameter
        raise ModelError(f"{name}: the {_ROLE.get(name, 'model')} function failed: {exc}; declare every parameter "
                         "it uses with cc.Param(...) in the model's Parameters") from exc
    except Exception as exc:  # CasADi raises RuntimeError ("slice.cpp ... stop<=len") for u[0] with nu=0
        for arg, n in (("u", nu), ("x", nx)):
            # exact sizes first (a matrix product needs one); size 1 last: CasADi broadcasts a 1x1
            # operand of a product like a scalar, which would hide a matrix's true width
            sizes = [m for m in (*range(n + 1, n + 5), n + _SPARE) if m > 1] + ([1] if n == 0 else [])
            for m in sizes:
                big = ca.SX.sym(arg, m)
                try:
                    expr = as_column(fun(big, u, p) if arg == "x" else fun(x, big, p))
                except Exception:
                    continue
                if name == "observe" or arg == "x" or expr.shape == (nx, 1):
                    break
            else:
                continue
            used = [i for i, d in enumerate(ca.which_depends(expr, big, 1, False)) if d]
            if used and used[-1] >= n:
                raise ModelError(
                    f"{name}: the {_ROLE.get(name, 'model')} function uses {arg}[{used[-1]}] but the model was "
                    f"declared with n{arg}={n}: pass n{arg}={used[-1] + 1} (the number of "
                    f"{'inputs' if arg == 'u' else 'states'}) to the model constructor") from exc
        raise ModelError(f"{name}: the {_ROLE.get(name, 'model')} function failed when traced with x ({nx},), "
                         f"u ({nu},) and the parameters: {type(exc).__name__}: {str(exc).strip()[:300]}") from exc


class StateSpaceModel:
    """Structure of a gray-box state-space model (no parameter values inside); build it with
    [`from_ode`][ceem_casadi.StateSpaceModel.from_ode] or [`from_discrete`][ceem_casadi.StateSpaceModel.from_discrete].

    Parameters
    ----------
    step : callable
        ``step(x, u, p) -> x_next`` with ``x`` (nx,), ``u`` (nu,) CasADi symbols and ``p`` a
        namespace of the parameters (``p.sigma``).
    observe : callable
        ``observe(x, u, p) -> y`` (ny,).
    nx, nu : int
        Numbers of states and inputs.
    params : Parameters, optional
        The named parameters (none by default).
    dt : float, optional
        Sample time in seconds.
    process_std, measurement_std : float or numpy.ndarray
        Noise standard deviations, scalar or (nx,) / (ny,), in the units of x and y.
    x1_mean, x1_std : numpy.ndarray, optional
        (nx,) Gaussian prior on the first state.
    rhs : callable, optional
        The continuous vector field ``rhs(x, u, p) -> dx/dt`` (kept for reference).
    name : str
        Model name (used in compiled-code file names).

    Attributes
    ----------
    f, g, rhs : casadi.Function
        The traced ``f(x, u, p) -> x_next``, ``g(x, u, p) -> y`` and the vector field (or None).
    nx, nu, ny : int
    noise : Noise

    Raises
    ------
    ModelError
        A function fails when traced, indexes ``u``/``x`` beyond ``nu``/``nx`` (naming the fix)
        or returns the wrong shape.

    Examples
    --------
    A scalar linear model x[t+1] = a x[t] + u[t], y[t] = x[t] with one parameter:

    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> model.nx, model.nu, model.ny, model.params.names
    (1, 1, 1, ['a'])
    >>> float(model.f(2.0, 1.0, 0.5))   # a x + u at x = 2, u = 1, a = 0.5
    2.0
    """

    def __init__(self, step: Callable, observe: Callable, *, nx: int, nu: int = 0,
                 params: Parameters | None = None, dt: float | None = None,
                 process_std=1.0, measurement_std=1.0, x1_mean=None, x1_std=None,
                 rhs: Callable | None = None, name: str = "model"):
        if int(nx) <= 0 or int(nu) < 0:
            raise ShapeError(f"nx must be positive and nu non-negative, got nx={nx}, nu={nu}")
        self.nx, self.nu = int(nx), int(nu)
        self.params = params if params is not None else Parameters()
        self.dt = sample_time(dt)
        self.name = name
        x = ca.SX.sym("x", self.nx)
        u = ca.SX.sym("u", self.nu)
        pv = ca.SX.sym("p", self.params.size)
        p = self.params.symbols(pv)
        # the right-hand side first: its indexing errors are diagnosed on it, not inside RK4
        self.rhs = None if rhs is None else self._trace("rhs", rhs, x, u, pv, p, self.nx, "xdot")
        self.f = self._trace("f", step, x, u, pv, p, self.nx, "x_next")
        y_expr = _traced("observe", observe, x, u, p, self.nx, self.nu)
        if y_expr.size2() != 1 or y_expr.size1() == 0:
            raise ModelError(f"observe: the observation function must return a vector (ny,), got shape "
                             f"{y_expr.shape}; return a column, e.g. ca.vertcat(...)")
        self.ny = y_expr.size1()
        m_std = np.asarray(measurement_std)
        if m_std.size not in (1, self.ny):
            raise ModelError(f"observe returns {self.ny} outputs (ny) but measurement_std has {m_std.size} entries: "
                             f"give {self.ny} standard deviations (or a scalar), or make observe return "
                             f"{m_std.size} outputs")
        self.g = ca.Function("g", [x, u, pv], [y_expr], ["x", "u", "p"], ["y"])
        self.noise = self._noise(process_std, measurement_std, x1_mean, x1_std)

    @staticmethod
    def _trace(name, fun, x, u, pv, p, n_out, out_name) -> ca.Function:
        expr = _traced(name, fun, x, u, p, x.numel(), u.numel())
        if expr.shape != (n_out, 1):
            fix = f"declare nx={expr.numel()}" if expr.size2() == 1 else "return a column vector"
            raise ModelError(f"{name}: the model function must return {n_out} entries (nx), "
                             f"got shape {expr.shape}: return nx={n_out} entries, or {fix}")
        return ca.Function(name, [x, u, pv], [expr], ["x", "u", "p"], [out_name])

    @classmethod
    def from_ode(cls, rhs: Callable, observe: Callable, *, nx: int, dt: float, nu: int = 0,
                 params: Parameters | None = None, substeps: int = 1, method: str = "rk4",
                 **kwargs) -> StateSpaceModel:
        """Continuous-time model ``dx/dt = rhs(x, u, p)``, discretised over ``dt`` seconds (``u`` held).

        Parameters
        ----------
        rhs : callable
            ``rhs(x, u, p) -> dx/dt`` (nx,).
        observe, nx, nu, params
            As for the constructor.
        dt : float
            Sample time in seconds, > 0.
        substeps : int
            Integrator steps per sample.
        method : str
            Integrator: ``"rk4"`` (classical Runge-Kutta, the only one).
        **kwargs
            Passed to the constructor (noise, ``x1_mean``, ``name``).

        Returns
        -------
        StateSpaceModel
        """
        sample_time(dt, required=True)   # a continuous-time model steps over dt
        if method != "rk4":
            raise OptionsError(f"method: the one integrator is 'rk4', got {method!r}")

        def step(x, u, p):
            return rk4_step(lambda xx, uu, pp: as_column(rhs(xx, uu, pp)), x, u, p, dt, int(substeps))

        return cls(step, observe, nx=nx, nu=nu, params=params, dt=dt, rhs=rhs, **kwargs)

    @classmethod
    def from_discrete(cls, step: Callable, observe: Callable, *, nx: int, nu: int = 0,
                      params: Parameters | None = None, **kwargs) -> StateSpaceModel:
        """Discrete-time model ``x[t+1] = step(x[t], u[t], p)``.

        Parameters
        ----------
        step, observe, nx, nu, params
            As for the constructor.
        **kwargs
            Passed to the constructor (``dt``, noise, ``x1_mean``, ``name``).

        Returns
        -------
        StateSpaceModel
        """
        return cls(step, observe, nx=nx, nu=nu, params=params, **kwargs)

    @classmethod
    def from_functions(cls, f: ca.Function, g: ca.Function, *, params: Parameters | None = None,
                       dt: float | None = None, rhs: ca.Function | None = None, name: str = "model",
                       process_std=1.0, measurement_std=1.0, x1_mean=None, x1_std=None) -> StateSpaceModel:
        """Model from ready CasADi Functions, e.g. rebuilt from a model file.

        Parameters
        ----------
        f, g : casadi.Function
            ``f(x, u, p) -> x_next`` and ``g(x, u, p) -> y``, inputs dense columns of nx, nu and
            ``params.size`` entries.
        params, dt, rhs, name, process_std, measurement_std, x1_mean, x1_std
            As for the constructor (``rhs`` a casadi.Function).

        Returns
        -------
        StateSpaceModel
        """
        params = params if params is not None else Parameters()
        nx, nu = f.nnz_in(0), f.nnz_in(1)
        for fun, n_out in ((f, nx), (g, None), (rhs, nx)):
            if fun is None:
                continue
            sizes = [fun.nnz_in(i) for i in range(fun.n_in())]
            if sizes != [nx, nu, params.size] or fun.n_out() != 1 or fun.size2_out(0) != 1 or \
                    (n_out is not None and fun.size1_out(0) != n_out):
                raise ModelError(f"{fun.name()}: expected inputs of sizes (nx, nu, np) = {(nx, nu, params.size)} "
                                 f"and one column output, got inputs {sizes} and output {fun.size_out(0)}")
        new = object.__new__(cls)
        new.nx, new.nu, new.ny, new.params, new.name = nx, nu, g.size1_out(0), params, name
        new.dt = sample_time(dt)
        new.f, new.g, new.rhs = f, g, rhs
        new.noise = new._noise(process_std, measurement_std, x1_mean, x1_std)
        return new

    # ------------------------------------------------------------------------------
    def theta_vector(self, theta: Theta) -> np.ndarray:
        """Validated flat parameter vector (n_p,) of a theta dict (see [`Parameters.to_vector`][ceem_casadi.Parameters.to_vector])."""
        return self.params.to_vector(theta)

    def with_noise(self, **kwargs) -> StateSpaceModel:
        """A shallow copy with other noise settings.

        Parameters
        ----------
        **kwargs
            Any of ``process_std``, ``measurement_std``, ``x1_mean``, ``x1_std``.

        Returns
        -------
        StateSpaceModel
        """
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        fields = {k: getattr(self.noise, k) for k in ("process_std", "measurement_std", "x1_mean", "x1_std")}
        unknown = set(kwargs) - set(fields)
        if unknown:
            raise TypeError(f"unknown noise setting(s) {sorted(unknown)}; known: {sorted(fields)}")
        fields.update(kwargs)
        new.noise = self._noise(**fields)
        return new

    def _noise(self, process_std, measurement_std, x1_mean, x1_std) -> Noise:
        """The validated `Noise` of these settings (scalars broadcast to nx / ny; a prior on x_1 needs both)."""
        if (x1_mean is None) != (x1_std is None):
            raise ShapeError("give both x1_mean and x1_std for a prior on x_1, or neither")
        return Noise(noise_level(process_std, "process_std", self.nx, positive=True),
                     noise_level(measurement_std, "measurement_std", self.ny, positive=True),
                     None if x1_mean is None else np.broadcast_to(np.asarray(x1_mean, float), (self.nx,)).copy(),
                     None if x1_std is None else noise_level(x1_std, "x1_std", self.nx, positive=True))

    def export_casadi(self, theta: Theta, path, *, keep_parameters: bool = False):
        """[`export_casadi`][ceem_casadi.export_casadi] of this model (same arguments, same result).

        Examples
        --------
        >>> import tempfile, ceem_casadi as cc
        >>> m = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
        ...                                      params=cc.Parameters(cc.Param("a", 0.5)))
        >>> m.export_casadi({"a": 0.5}, tempfile.mkdtemp()).keep_parameters
        False
        """
        from ._export import export_casadi
        return export_casadi(self, theta, path, keep_parameters=keep_parameters)

    def check(self, theta: Theta, x: np.ndarray, u: np.ndarray | None = None) -> None:
        """Evaluate f and g once and raise [`ModelError`][ceem_casadi.errors.ModelError] on NaN/inf.

        Parameters
        ----------
        theta : dict
        x : numpy.ndarray
            (nx,) state.
        u : numpy.ndarray, optional
            (nu,) input (default zero).
        """
        theta_vec = self.theta_vector(theta)
        uu = np.zeros(self.nu) if u is None else u
        for fun in (self.f, self.g):
            val = np.asarray(fun(x, uu, theta_vec))
            if not np.all(np.isfinite(val)):
                raise ModelError(f"model function {fun.name()} returns non-finite values at the initial "
                                 f"guess (x={np.round(x, 4)}, theta={theta}): {val.ravel()}")

    def __repr__(self) -> str:
        kind = "continuous (RK4)" if self.rhs is not None else "discrete"
        return (f"StateSpaceModel({self.name!r}, {kind}, nx={self.nx}, nu={self.nu}, ny={self.ny}, "
                f"params={self.params.names})")
