"""The learning step of long records, its data terms evaluated piece by piece in this process (pieces of
``policy.PIECE_LENGTH`` + 1 samples overlapping by one; docs/long_records.md, "Learning over long records")."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..io._data import Trajectories
from ..runtime import _policy as policy
from ._learner import Learner
from ._remote import RemoteLearner
from ._terms import piece_terms


def piece_bounds(T: int, L: int) -> list[tuple[int, int]]:
    """``[(a, e), ...]``: pieces of samples a .. e - 1 (at most L + 1 of them), consecutive pieces
    sharing one sample, covering 0 .. T - 1."""
    out, a = [], 0
    while True:
        e = min(a + L, T - 1) + 1
        out.append((a, e))
        if e >= T:
            return out
        a = e - 1


class _LocalLearner(RemoteLearner):
    """`RemoteLearner` asking only for what IPOPT asks (a remote round trip fetches
    everything at once; here the pieces are local and a Hessian at a rejected trial point would
    be wasted work)."""

    def _fetch(self, z, what: str) -> str:
        return what

    def _hessian(self, z) -> np.ndarray:
        return self._remote(z, "hess")[0]


class PieceEngine:
    """Learning data terms of every trajectory's pieces of ``piece`` stages (default ``policy.PIECE_LENGTH``),
    the engine of the `RemoteLearner` ``self.learner``; the stage Functions compiled as for ``columns`` stages
    (docs/long_records.md)."""

    def __init__(self, model, options, stages=None, piece: int | None = None, columns: int | None = None):
        self.model, self.piece, self.stages, self.columns = model, int(piece or policy.PIECE_LENGTH), stages, columns
        self.options = replace(options, use_prior=False)  # prior and trust region: on the IPOPT side
        self._learners: dict[int, Learner] = {}
        self.data = None  # the trajectories of the current solve (set by PieceLearner)
        self._session = None  # (data, session) of the last learning_session
        self.learner = _LocalLearner(self, model, options, self._learner(self.piece + 1).hessian)

    def _learner(self, n: int) -> Learner:
        if n not in self._learners:
            self._learners[n] = Learner(self.model, (n,), self.options, self.stages, columns=self.columns)
        return self._learners[n]

    def learning_session(self, theta_vec, xs) -> list:
        """Each piece's (learner, NLP parameter vector) at ``theta_vec`` and the states ``xs``: built once per
        data set, then only rewritten in place (`_rewrite`; docs/long_records.md)."""
        data = self.data
        if self._session is not None and self._session[0] is data:
            return self._rewrite(self._session[1], theta_vec, xs)
        session = []
        for b, x in enumerate(xs):
            y, u = data.y[b], data.inputs(b)
            for a, e in piece_bounds(x.shape[0], self.piece):
                yp = y[a:e].copy()
                if a > 0:
                    yp[0] = np.nan  # counted in the previous piece
                learner = self._learner(e - a)
                P = learner.parameter_vector(theta_vec, Trajectories([yp], [u[a:e]]), [x[a:e]], 0.0)
                session.append((learner, np.asarray(P, float), b, a, e))
        self._session = (data, session)
        return session

    def _rewrite(self, session: list, theta_vec, xs) -> list:
        """``session`` with the states ``xs`` and the parameters ``theta_vec`` written into every
        piece's NLP parameter vector (the data, masks and noise weights stay)."""
        theta_vec = np.asarray(theta_vec, float)
        for learner, P, b, a, e in session:
            x, slot = xs[b], learner.slots
            if learner._chunk or x.shape != (self.data.lengths[b], self.model.nx):  # not the plain layout
                self._session = None
                return self.learning_session(theta_vec, xs)
            base = theta_vec.copy()
            base[learner.free] = 0.0
            P[slot["p_base"]] = base
            P[slot["z_prev"]] = theta_vec[learner.free]
            P[slot["Xo"]] = x[a:e].ravel()            # (nx, n) column-major = (n, nx) row-major
            P[slot["X0"]] = x[a:e - 1].ravel()
            P[slot["X1"]] = x[a + 1:e].ravel()
        return session

    def reduce(self, session: list, z: np.ndarray, what: str) -> tuple[list, int]:
        """Each piece's data terms at ``z`` (`piece_terms`); 0 bytes."""
        return [piece_terms(learner, P, z, what) for learner, P, *_ in session], 0

    def record(self, *args, **kwargs) -> None:  # no network to account for
        pass


class PieceLearner:
    """[`Learner`][ceem_casadi.learning.Learner]'s interface (``solve``, ``hessian_matrix``) over the
    pieces of the trajectories (docs/long_records.md)."""

    def __init__(self, model, options, stages=None, piece: int | None = None, columns: int | None = None):
        self.engine = PieceEngine(model, options, stages, piece, columns)
        self.hessian = self.engine.learner.hessian

    def solve(self, theta_vec, data, xs, rho_theta: float | None = None, weights=None):
        """As [`ceem_casadi.learning.Learner.solve`][ceem_casadi.learning.Learner.solve] (no ``weights``)."""
        self.engine.data = data
        return self.engine.learner.solve(theta_vec, data, xs, rho_theta, weights)

    def hessian_matrix(self, theta_vec, data, xs):
        """As [`ceem_casadi.learning.Learner.hessian_matrix`][ceem_casadi.learning.Learner.hessian_matrix]."""
        self.engine.data = data
        return self.engine.learner.hessian_matrix(theta_vec, data, xs)
