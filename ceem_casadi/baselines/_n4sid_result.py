"""The identified linear model of [`n4sid`][ceem_casadi.baselines.n4sid]."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as sla

from ..errors import ShapeError
from ..runtime._result import Result


@dataclass(repr=False)
class N4SIDResult(Result):
    """Identified linear model (see `ceem_casadi.baselines._n4sid` for the equations).

    Attributes
    ----------
    A, B, C, D : numpy.ndarray
        (nx, nx), (nx, nu), (ny, nx), (ny, nu) system matrices.
    Q, R, S : numpy.ndarray
        (nx, nx), (ny, ny), (nx, ny) covariances of the residuals of the estimated state sequences (those of
        the innovation model, docs/api/baselines.md).
    x0 : list of numpy.ndarray
        One (nx,) initial state per trajectory (the state at the first sample).
    singular_values : numpy.ndarray
        (i ny,) of the weighted oblique projection.
    order, horizon : int
        nx and the block horizon i used.
    dt : float or None
        Sample time in seconds (from the data).

    Examples
    --------
    >>> import numpy as np, scipy.signal as ss, ceem_casadi as cc
    >>> u = np.random.default_rng(0).normal(size=(400, 1))
    >>> y = ss.lfilter([0.0, 1.0], [1.0, -0.7], u, axis=0)           # x+ = 0.7 x + u, y = x
    >>> res = cc.n4sid(cc.Trajectories([y], [u]), order=1, horizon=5)
    >>> res.order, round(float(res.A[0, 0]), 3)
    (1, 0.7)
    """

    SUMMARY = ('order', 'dt', 'horizon')

    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    D: np.ndarray
    Q: np.ndarray
    R: np.ndarray
    S: np.ndarray
    x0: list
    singular_values: np.ndarray
    order: int
    dt: float | None = None
    horizon: int = 0
    n_columns: int = field(default=0, repr=False)

    @property
    def nx(self) -> int:
        """Number of states."""
        return self.A.shape[0]

    @property
    def nu(self) -> int:
        """Number of inputs."""
        return self.B.shape[1]

    @property
    def ny(self) -> int:
        """Number of outputs."""
        return self.C.shape[0]

    def simulate(self, u, x0, *, steps: int | None = None) -> np.ndarray:
        """(T, ny) free-run (noise-free) output from ``x0`` (nx,) for inputs ``u`` (T, nu), or, without inputs
        (nu = 0), ``u=None`` and ``steps=T``."""
        x = np.asarray(x0, float).reshape(-1)
        if x.shape != (self.nx,):
            raise ShapeError(f"x0: expected shape ({self.nx},), got {np.shape(x0)}")
        if u is None:
            if self.nu or steps is None:
                raise ShapeError(f"u: expected a (T, {self.nu}) input array" +
                                 ("" if self.nu else " or steps=T"))
            u = np.zeros((int(steps), 0))
        u = np.asarray(u, float)
        if u.ndim == 1 and self.nu == 1:
            u = u[:, None]
        if u.ndim != 2 or u.shape[1] != self.nu:
            raise ShapeError(f"u: expected shape (T, {self.nu}), got {u.shape}")
        T = u.shape[0]
        xs = np.empty((T, self.nx))
        Bu = u @ self.B.T
        for t in range(T):
            xs[t] = x
            x = self.A @ x + Bu[t]
        return xs @ self.C.T + u @ self.D.T

    def kalman_gain(self) -> tuple[np.ndarray, np.ndarray]:
        """``(K (nx, ny), Re (ny, ny))`` of the steady-state innovation form ``x+ = A x + B u + K e``,
        ``y = C x + D u + e``, ``cov(e) = Re`` (discrete Riccati equation with ``Q``, ``S``, ``R``)."""
        P = sla.solve_discrete_are(self.A.T, self.C.T, self.Q, self.R, s=self.S)
        Re = self.C @ P @ self.C.T + self.R
        K = np.linalg.solve(Re, (self.A @ P @ self.C.T + self.S).T).T
        return K, 0.5 * (Re + Re.T)

    def to_model(self, process_std=None, measurement_std=None, free=True, *, name: str = "n4sid"):
        """``(model, theta)``: a [`StateSpaceModel`][ceem_casadi.StateSpaceModel] ``x+ = A x + B u``,
        ``y = C x + D u`` with parameters ``"A"`` ... ``"D"`` at the identified values (e.g. to warm-start CE-EM).

        Parameters
        ----------
        process_std, measurement_std : numpy.ndarray, optional
            (nx,) / (ny,); default ``sqrt(diag(Q))`` / ``sqrt(diag(R))`` (floored at 1e-6 of the largest entry).
        free : bool or dict
            A bool for all matrices, or name -> bool / boolean mask (missing names free).
        name : str
            Model name.
        """
        from ..model._model import StateSpaceModel
        from ..model._params import Param, Parameters

        def _std(cov, given):
            if given is not None:
                return given
            s = np.sqrt(np.clip(np.diag(cov), 0.0, None))
            return np.maximum(s, max(1e-6 * float(s.max(initial=0.0)), 1e-12))

        theta = {"A": self.A.copy(), "B": self.B.copy(), "C": self.C.copy(), "D": self.D.copy()}
        if isinstance(free, dict):
            unknown = set(free) - set(theta)
            if unknown:
                raise ShapeError(f"free: unknown parameter name(s) {sorted(unknown)}; known: A, B, C, D")
            masks = {k: free.get(k, True) for k in theta}
        else:
            masks = dict.fromkeys(theta, bool(free))
        params = Parameters(*(Param(k, value=v, free=masks[k]) for k, v in theta.items()))
        nu = self.nu

        def step(x, u, p):
            return p.A @ x + (p.B @ u if nu else 0)

        def observe(x, u, p):
            return p.C @ x + (p.D @ u if nu else 0)

        model = StateSpaceModel.from_discrete(
            step, observe, nx=self.nx, nu=nu, params=params, dt=self.dt, name=name,
            process_std=_std(self.Q, process_std), measurement_std=_std(self.R, measurement_std))
        return model, theta
