"""Shared test helpers (test modules never import each other: they take these as fixtures)."""
import os
import signal

os.environ.setdefault("MPLBACKEND", "Agg")

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc

NX, NY, NU, T = 4, 2, 1, 30


def pytest_configure(config):
    """A run started in the background without job control (``pytest ... &`` in a script) inherits SIGINT ignored,
    and so do its xdist workers and their subprocesses: the Ctrl-C tests then wait in vain (three failed so). Ctrl-C
    is Python's KeyboardInterrupt again here, as in a foreground run."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class LinearGaussian:
    """A random stable linear-Gaussian system (NX states, NY outputs, NU inputs, T steps) with full
    Q, R, its simulated data, its ceem_casadi model and a helper punching NaN holes in y."""

    NX, NY, NU, T = NX, NY, NU, T

    @staticmethod
    def system(seed=0):
        """(system dict A, B, C, D, Q, R, x0, Sigma0; u (T, NU); y (T, NY)) simulated with ``seed``."""
        rng = np.random.default_rng(seed)
        A = rng.standard_normal((NX, NX))
        A *= 0.95 / np.max(np.abs(np.linalg.eigvals(A)))
        B = rng.standard_normal((NX, NU))
        C = rng.standard_normal((NY, NX))
        D = rng.standard_normal((NY, NU))
        Lq = rng.standard_normal((NX, NX)) * 0.3
        Lr = rng.standard_normal((NY, NY)) * 0.3
        Q = Lq @ Lq.T + 0.05 * np.eye(NX)
        R = Lr @ Lr.T + 0.1 * np.eye(NY)
        x0 = rng.standard_normal(NX)
        S0 = np.diag(rng.uniform(0.5, 2.0, NX))
        u = rng.standard_normal((T, NU))
        # simulate
        x = np.empty((T, NX))
        x[0] = rng.multivariate_normal(x0, S0)
        for t in range(T - 1):
            x[t + 1] = A @ x[t] + B @ u[t] + rng.multivariate_normal(np.zeros(NX), Q)
        y = x @ C.T + u @ D.T + rng.multivariate_normal(np.zeros(NY), R, size=T)
        return dict(A=A, B=B, C=C, D=D, Q=Q, R=R, x0=x0, Sigma0=S0), u, y

    @staticmethod
    def model(sys):
        """(StateSpaceModel x+ = A x + B u, y = C x + D u with parameters A..D; its theta vector)."""
        params = cc.Parameters(cc.Param("A", sys["A"]), cc.Param("B", sys["B"]),
                               cc.Param("C", sys["C"]), cc.Param("D", sys["D"]))
        model = cc.StateSpaceModel.from_discrete(lambda x, u, p: ca.mtimes(p.A, x) + ca.mtimes(p.B, u),
                                                 lambda x, u, p: ca.mtimes(p.C, x) + ca.mtimes(p.D, u),
                                                 nx=NX, nu=NU, params=params)
        theta = {k: sys[k] for k in "ABCD"}
        return model, model.theta_vector(theta)

    @staticmethod
    def with_nans(y, seed=1):
        """A copy of ``y`` with ~25 % of the entries and all of step 5 missing (NaN)."""
        y = y.copy()
        rng = np.random.default_rng(seed)
        y[rng.random(y.shape) < 0.25] = np.nan
        y[5] = np.nan  # one fully missing step
        return y


@pytest.fixture
def lg():
    """The `LinearGaussian` helpers (``lg.system(seed)``, ``lg.model(sys)``, ``lg.with_nans(y)``)."""
    return LinearGaussian
