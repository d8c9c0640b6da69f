"""Identifiability of the free parameters from an information (Hessian) matrix: the weak directions of its
Jacobi-scaled form as readable combinations (docs/runtime.md, "Identifiability")."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PRINT_WEIGHT = 0.05  # entries below this absolute weight are left out of the printed combination


def entry_names(params, index=None) -> list[str]:
    """Names of the entries of the flat parameter vector: ``"sigma"`` (scalar), ``"b[2]"``
    (vector), ``"H[0,1]"`` (matrix, row-major); only those at ``index`` when given."""
    names = []
    for p in params:
        if len(p.shape) == 0:
            names.append(p.name)
        else:
            names.extend(f"{p.name}[{','.join(str(i) for i in idx)}]" for idx in np.ndindex(*p.shape))
    return names if index is None else [names[i] for i in np.asarray(index, int)]


def combination(vector, names, weight: float = PRINT_WEIGHT) -> str:
    """``vector`` (n,) as ``"0.71 a - 0.71 b"``: entries of absolute weight >= ``weight`` in
    decreasing order of weight, sign chosen so that the largest weight is positive."""
    v = np.asarray(vector, float)
    order = np.argsort(-np.abs(v), kind="stable")
    if v[order[0]] < 0:
        v = -v
    parts = []
    for i in order:
        if abs(v[i]) < weight and parts:
            break
        sign = "-" if v[i] < 0 else "+"
        parts.append(f"{sign} {abs(v[i]):.2f} {names[i]}")
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else text


@dataclass(frozen=True)
class Direction:
    """A (nearly) non-identifiable direction of the free parameters: its readable ``combination``, the
    unit ``vector`` (n,) in original units, its ``relative_eigenvalue`` and ``information`` ``v^T I v``."""

    combination: str
    vector: np.ndarray
    relative_eigenvalue: float
    information: float

    def to_dict(self) -> dict:
        return {"combination": self.combination, "vector": self.vector.tolist(),
                "relative_eigenvalue": self.relative_eigenvalue, "information": self.information}


@dataclass(frozen=True)
class Spectrum:
    """Eigen-decomposition of a Jacobi-scaled information matrix: ``scale`` (n,) ``diag(I)^(-1/2)`` (1 where
    not positive), relative ``eigenvalues`` (n,) ascending, ``vectors`` (n, n) as columns, ``weak`` (n,)
    below the tolerance, ``top`` the largest eigenvalue of the scaled matrix."""

    scale: np.ndarray
    eigenvalues: np.ndarray
    vectors: np.ndarray
    weak: np.ndarray
    top: float


def spectrum(information, tol: float) -> Spectrum:
    """Relative eigenvalues and eigenvectors of the Jacobi-scaled ``information`` (n, n)."""
    H = np.asarray(information, float)
    H = 0.5 * (H + H.T)
    d = np.diag(H).copy()
    scale = np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 1.0)
    w, V = np.linalg.eigh(scale[:, None] * H * scale[None, :])
    top = max(float(w.max(initial=0.0)), np.finfo(float).tiny)
    rel = w / top
    return Spectrum(scale, rel, V, rel < tol, top)


def weak_directions(information, names, tol: float, spec: Spectrum | None = None) -> list[Direction]:
    """Directions of ``information`` (n, n) whose relative eigenvalue is below ``tol``,
    weakest first, each as a `Direction` over ``names`` (n,)."""
    H = np.asarray(information, float)
    spec = spectrum(H, tol) if spec is None else spec
    out = []
    weak = np.flatnonzero(spec.weak)
    N = sparse_basis(spec.vectors[:, weak])
    Hs = spec.scale[:, None] * H * spec.scale[None, :]
    for k in range(len(weak)):
        u = N[:, k]
        rel = float(u @ Hs @ u) / float(u @ u) / spec.top
        v = spec.scale * u
        v /= np.linalg.norm(v)
        if v[np.argmax(np.abs(v))] < 0:
            v = -v
        out.append(Direction(combination(v, names), v, rel, float(v @ H @ v)))
    return sorted(out, key=lambda d: d.relative_eigenvalue)


def sparse_basis(V) -> np.ndarray:
    """A basis of the column span of ``V`` (n, k) in reduced row-echelon form (pivots by pivoted QR), so
    that vectors with disjoint supports are returned unmixed (docs/runtime.md)."""
    from scipy.linalg import qr

    V = np.asarray(V, float)
    if V.shape[1] == 0:
        return V
    _, _, piv = qr(V.T, pivoting=True, mode="economic")
    k = V.shape[1]
    return (np.linalg.solve(V[piv[:k]].T, V.T)).T


def describe(directions: list[Direction], what: str = "the information matrix") -> str:
    """One message naming the weak directions (for warnings and logs)."""
    body = "; ".join(f"{d.combination} (relative eigenvalue {d.relative_eigenvalue:.1e})" for d in directions[:5])
    if len(directions) > 5:
        body += f"; and {len(directions) - 5} more"
    return (f"{what} is singular in {len(directions)} direction(s): the data do not determine "
            f"{body}; fix or constrain these parameters, or add a prior")


__all__ = ["Direction", "Spectrum", "combination", "describe", "entry_names", "sparse_basis", "spectrum",
           "weak_directions"]
