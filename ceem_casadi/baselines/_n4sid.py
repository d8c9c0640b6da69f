"""Subspace identification (N4SID with MOESP weighting) of a linear state-space model; the algorithm
(steps 1-6, order selection, default horizon) is written out in docs/api/baselines.md."""
from __future__ import annotations

import logging
import math

import numpy as np
import scipy.linalg as sla

from ..errors import OptionsError, ShapeError
from ._n4sid_result import N4SIDResult

logger = logging.getLogger(__name__)

_CHUNK_ELEMENTS = 2_000_000   # rows of H^T per QR chunk: about this many doubles (16 MB)
_RCOND = 1e-10                # relative rank tolerance of the projections' least squares
_SV_FLOOR = 1e-12             # singular values below this fraction of s_1 are treated as zero
_STABLE_RADIUS = 1.0 - 1e-4   # stable=True: reflected eigenvalues get at most this modulus


def _default_horizon(n_ref: int, ny: int, nu: int, lengths, i_min: int = 2) -> int:
    """Largest ``i <= ceil(2 n_ref / ny) + 1`` (and ``>= i_min``) with ``2 p`` Hankel columns, else with ``p``."""
    i_max = max(math.ceil(2 * max(n_ref, 1) / ny) + 1, i_min)
    for factor in (2, 1):
        for i in range(i_max, i_min - 1, -1):
            p = 2 * i * (nu + ny)
            n_total = sum(max(T - 2 * i + 1, 0) for T in lengths)
            if min(lengths) >= 2 * i and n_total >= factor * p:
                return i
    return i_min


def _horizon(order, horizon, ny: int, nu: int, lengths) -> int:
    """The block horizon i: ``horizon`` checked against ``order`` and the data, or the default one."""
    if horizon is None:
        i_min = 2 if order is None else max(2, math.ceil(order / ny) + 1)
        i = _default_horizon(order if order is not None else 10, ny, nu, lengths, i_min)
        if min(lengths) < 2 * i or (order is not None and (i - 1) * ny < order):
            raise ShapeError(
                f"order {order} is too large for the data: it needs a block horizon i >= {i_min} "
                f"(ny = {ny}), i.e. trajectories of at least {2 * i_min} samples and "
                f">= {2 * i_min * (nu + ny)} Hankel columns; the data have lengths "
                f"{min(lengths)}..{max(lengths)} ({len(lengths)} trajectories). Use a lower order or more data.")
        return i
    i = int(horizon)
    if i != horizon or i < 2:
        raise ShapeError(f"horizon must be an integer >= 2, got {horizon!r}")
    if order is not None and (i - 1) * ny < order:
        raise ShapeError(
            f"horizon i={i} is too short for order {order} with ny={ny} outputs: "
            f"(i-1)*ny = {(i - 1) * ny} < {order}; use horizon >= {math.ceil(order / ny) + 1}")
    if min(lengths) < 2 * i:
        raise ShapeError(
            f"horizon i={i} is too long for the data: every trajectory needs at least 2i = {2 * i} "
            f"samples, the shortest has {min(lengths)}")
    return i


def _order(s: np.ndarray, order, i: int, ny: int) -> int:
    """The model order: ``order`` checked against the horizon, or selected from the singular values ``s``."""
    n_max = min((i - 1) * ny, len(s) - 1)
    if order is None:
        n = _select_order(s, n_max)
        logger.info("n4sid: order %d selected from singular values %s", n, np.array2string(s[:n_max + 1], precision=3))
    else:
        n = int(order)
        if n > n_max:
            raise ShapeError(f"order {n} is too large for horizon i={i} and ny={ny}: at most {n_max}")
    if s[n - 1] <= _SV_FLOOR * s[0]:
        logger.warning("n4sid: singular value %d is numerically zero (%.3g); the data support a lower order",
                       n, s[n - 1])
    return n


def _hankel_rows(u: np.ndarray, y: np.ndarray, i: int) -> np.ndarray:
    """Rows of ``H^T`` for one trajectory: (j, p) with columns ``[U_f, U_p, Y_0 .. Y_{2i-1}]``."""
    T = y.shape[0]
    j = T - 2 * i + 1
    win_y = np.lib.stride_tricks.sliding_window_view(y, 2 * i, axis=0)[:j]   # (j, ny, 2i)
    Yw = win_y.transpose(0, 2, 1).reshape(j, -1)                              # time-major
    if u.shape[1]:
        win_u = np.lib.stride_tricks.sliding_window_view(u, 2 * i, axis=0)[:j]
        Uw = win_u.transpose(0, 2, 1).reshape(j, -1)
        nu_i = i * u.shape[1]
        rows = np.concatenate([Uw[:, nu_i:], Uw[:, :nu_i], Yw], axis=1)
    else:
        rows = Yw
    return rows[np.all(np.isfinite(rows), axis=1)]


def _lq(data, i: int) -> tuple[np.ndarray, int]:
    """Lower-triangular ``L`` (p, p) with ``H / sqrt(N) = L Q`` and the number of columns N."""
    R, N = None, 0
    for b in range(len(data)):
        rows = _hankel_rows(data.inputs(b), data.y[b], i)
        if not rows.size:
            continue
        p = rows.shape[1]
        step = max(p, _CHUNK_ELEMENTS // p)
        for s in range(0, rows.shape[0], step):
            chunk = rows[s:s + step]
            N += chunk.shape[0]
            stacked = chunk if R is None else np.vstack([R, chunk])
            R = sla.qr(stacked, mode="r", overwrite_a=True, check_finite=False)[0]
    if R is None:
        p = 2 * i * (data.nu + data.ny)
        return np.zeros((p, p)), 0
    p = R.shape[1]
    if R.shape[0] < p:
        R = np.vstack([R, np.zeros((p - R.shape[0], p))])
    return R.T / math.sqrt(max(N, 1)), N


def _lstsq_rows(T: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Minimum-norm ``c`` with ``c M ~= T`` (relative rank tolerance ``_RCOND``)."""
    return sla.lstsq(M.T, T.T, cond=_RCOND, check_finite=False, lapack_driver="gelsd")[0].T


def _oblique(L, target, along, onto, k) -> np.ndarray:
    """Coefficients (in the Q basis) of ``rows(target) /_{rows(along)} rows(onto)``: ``target`` projected on the first
    ``k`` rows of Q (which contain ``along`` and ``onto``), its ``onto`` component."""
    M = np.vstack([L[onto, :k], L[along, :k]])
    c = _lstsq_rows(L[target, :k], M)
    return c[:, :len(onto)] @ L[onto, :]


def _reflect_unstable(A: np.ndarray) -> np.ndarray:
    """``A`` with its eigenvalues outside the unit disc reflected inside (step 4b in docs/api/baselines.md)."""
    T, Z = sla.schur(A, output="real")
    n, k = A.shape[0], 0
    while k < n:
        size = 2 if k + 1 < n and T[k + 1, k] != 0.0 else 1
        block = T[k:k + size, k:k + size]                 # a real eigenvalue or a complex pair
        r = float(np.max(np.abs(np.linalg.eigvals(block))))
        if r >= 1.0:
            block *= min(1.0 / r, _STABLE_RADIUS) / r     # l -> l / |l|^2 = 1 / conj(l), same angle
        k += size
    return Z @ T @ Z.T


def _select_order(s: np.ndarray, n_max: int) -> int:
    s = np.maximum(s, _SV_FLOOR * s[0]) if s[0] > 0 else np.ones_like(s)
    gaps = np.log(s[:n_max]) - np.log(s[1:n_max + 1])
    return int(np.argmax(gaps)) + 1


def _free_response(A, C, T: int) -> np.ndarray:
    """``C A^t`` for t = 0..T-1, (T, ny, nx)."""
    Gam = np.empty((T, C.shape[0], A.shape[0]))
    G = C.copy()
    for t in range(T):
        Gam[t] = G
        G = G @ A
    return Gam


def _response_regressors(A, C, u: np.ndarray, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Free response ``Gamma`` (T, ny, nx) and input regressor ``Psi`` (nb, T, ny, nx nu + ny nu) of inputs
    ``u`` (nb, T, nu): ``Gamma @ x0 + Psi @ [vec(B); vec(D)]`` (column-major vec) is the noise-free output."""
    nx, ny, nb, nu = A.shape[0], C.shape[0], u.shape[0], u.shape[2]
    Gam = _free_response(A, C, T)
    eye_x, eye_y = np.eye(nx), np.eye(ny)
    Psi = np.empty((nb, T, ny, nx * nu + ny * nu))
    Z = np.zeros((nb, nx, nu * nx))
    for t in range(T):
        Psi[:, t, :, :nx * nu] = C @ Z
        Z = A @ Z + (u[:, t, None, :, None] * eye_x[None, :, None, :]).reshape(nb, nx, nu * nx)
    Psi[:, :, :, nx * nu:] = (u[:, :, None, :, None] * eye_y[None, None, :, None, :]).reshape(nb, T, ny, ny * nu)
    return Gam, Psi


def _groups(data, max_elements: int, width: int):
    """Batches of trajectory indices with equal length (bounded memory)."""
    by_len: dict[int, list[int]] = {}
    for b, T in enumerate(data.lengths):
        by_len.setdefault(T, []).append(b)
    for T, idx in by_len.items():
        nb = max(1, max_elements // max(T * data.ny * width, 1))
        for s in range(0, len(idx), nb):
            yield T, idx[s:s + nb]


def _fit_bd_x0(A, C, data, feedthrough: bool = True) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """``B``, ``D`` (zero without ``feedthrough``) and per-trajectory ``x0`` by output-error least squares (x0
    eliminated per trajectory)."""
    nx, ny, nu = A.shape[0], C.shape[0], data.nu
    ntheta = nx * nu + (ny * nu if feedthrough else 0)
    G = np.zeros((ntheta, ntheta))
    h = np.zeros(ntheta)
    cache = []
    for T, idx in _groups(data, 4_000_000, ntheta + nx + 1):
        u = np.stack([data.inputs(b) for b in idx])
        y = np.stack([data.y[b] for b in idx])
        Gam, Psi = _response_regressors(A, C, u, T)
        obs = np.isfinite(y)                                          # (nb, T, ny)
        yz = np.where(obs, y, 0.0).reshape(len(idx), T * ny)
        Gz = np.where(obs[..., None], Gam[None], 0.0).reshape(len(idx), T * ny, nx)
        Pz = np.where(obs[..., None], Psi[..., :ntheta], 0.0).reshape(len(idx), T * ny, ntheta)
        Qg, _ = np.linalg.qr(Gz)                                      # (nb, T ny, nx)
        Pp = Pz - Qg @ (Qg.transpose(0, 2, 1) @ Pz)
        yp = yz - (Qg @ (Qg.transpose(0, 2, 1) @ yz[..., None]))[..., 0]
        if ntheta:
            flat = Pp.reshape(-1, ntheta)
            G += flat.T @ flat
            h += flat.T @ yp.reshape(-1)
        cache.append((idx, Gz, Pz, yz))
    theta = sla.lstsq(G, h, cond=1e-14, check_finite=False)[0] if ntheta else np.zeros(0)
    B = theta[:nx * nu].reshape(nu, nx).T
    D = theta[nx * nu:].reshape(nu, ny).T if feedthrough else np.zeros((ny, nu))
    x0 = [None] * len(data)
    for idx, Gz, Pz, yz in cache:
        resid = yz - Pz @ theta
        for k, b in enumerate(idx):
            x0[b] = sla.lstsq(Gz[k], resid[k], check_finite=False)[0]
    return B, D, x0


def _fit_x0(A, B, C, D, data, window: int) -> list[np.ndarray]:
    """Per-trajectory ``x0`` by least squares on the first ``window`` samples given A, B, C, D."""
    nx = A.shape[0]
    out = []
    res = N4SIDResult(A, B, C, D, None, None, None, [], np.zeros(0), nx)
    for b in range(len(data)):
        y, u = data.y[b][:window], data.inputs(b)[:window]
        T = y.shape[0]
        y_forced = res.simulate(u, np.zeros(nx))
        Gam = _free_response(A, C, T)
        obs = np.isfinite(y)
        out.append(sla.lstsq(Gam[obs], (y - y_forced)[obs], check_finite=False)[0])
    return out


def _bd_from_states(A, C, X_i, X_i1, U_i, Y_i, feedthrough: bool) -> tuple[np.ndarray, np.ndarray]:
    """``B`` (n, nu) and ``D`` (ny, nu) by least squares on the state sequences (an unstable ``A``)."""
    n, ny, nu = A.shape[0], C.shape[0], U_i.shape[0]
    lhs = np.vstack([X_i1 - A @ X_i, Y_i - C @ X_i])
    if not feedthrough:
        lhs = lhs[:n]
    BD = _lstsq_rows(lhs, U_i) if nu else np.zeros((lhs.shape[0], 0))
    return BD[:n], (BD[n:] if feedthrough else np.zeros((ny, nu)))


def _as_data(data):
    """``Trajectories`` from a Trajectories, or a list of ``(y, u)`` pairs / ``y`` arrays."""
    from ..io._data import Trajectories

    if isinstance(data, Trajectories):
        return data
    if isinstance(data, tuple) and len(data) == 2 and not isinstance(data[0], tuple):
        data = [data]                                  # a single (y, u) pair
    pairs = [item if isinstance(item, tuple) else (item, None) for item in data]
    for k, item in enumerate(pairs):
        if len(item) != 2:
            raise ShapeError(f"data[{k}]: expected a (y, u) pair, got a tuple of {len(item)}")
    ys, us = [y for y, _ in pairs], [u for _, u in pairs]
    if any(u is None for u in us) and not all(u is None for u in us):
        raise ShapeError("data: either every trajectory has inputs u or none has")
    return Trajectories(ys, None if all(u is None for u in us) else us)


def n4sid(data, order: int | None = None, horizon: int | None = None, *,
          feedthrough: bool = True, stable: bool | str = False) -> N4SIDResult:
    """Identify a linear state-space model from one or several trajectories.

    Parameters
    ----------
    data : Trajectories or list
        ``y`` (T_b, ny) (NaN allowed) and optional ``u`` (T_b, nu), or a list of ``(y, u)`` pairs or ``y`` arrays.
    order : int, optional
        Model order nx, or None to select it from the singular values (docs/api/baselines.md).
    horizon : int, optional
        Block horizon i; needs ``(i-1) ny >= order`` and ``T_b >= 2 i``; default from the order and the data
        (docs/api/baselines.md).
    feedthrough : bool
        Estimate ``D``; ``False`` fixes ``D = 0``.
    stable : bool or str
        ``True`` (= ``"reflect"``) replaces an unstable least-squares ``A`` by a stable one (step 4b in
        docs/api/baselines.md).

    Returns
    -------
    N4SIDResult

    Examples
    --------
    The pole 0.8 of x[t+1] = 0.8 x[t] + u[t] from noise-free data:

    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> u = np.random.default_rng(0).normal(size=(200, 1))
    >>> data, _ = cc.simulate(model, {"a": 0.8}, [0.0], 200, u=u)
    >>> lin = cc.n4sid(data, order=1)
    >>> np.round(lin.A, 3)
    array([[0.8]])
    """
    data = _as_data(data)
    ny, nu = data.ny, data.nu
    if order is not None and (int(order) != order or order < 1):
        raise ShapeError(f"order must be a positive integer or None, got {order!r}")
    if stable not in (False, True, "reflect"):
        raise OptionsError(f"stable must be False or True (= 'reflect'), got {stable!r} ('maciejowski' was removed: "
                           f"measured worse than 'reflect' in every case, docs/block_oriented.md)")
    i = _horizon(order, horizon, ny, nu, data.lengths)
    p = 2 * i * (nu + ny)
    L, n_columns = _lq(data, i)
    if n_columns < p:
        raise ShapeError(
            f"not enough data for block horizon i={i}: {n_columns} complete Hankel columns (after dropping NaN), "
            f"at least 2i(nu+ny) = {p} needed; use more or longer trajectories, or a smaller horizon/order")

    def u_rows(times):
        # U_f (times i..2i-1) come first, then U_p (times 0..i-1)
        return [(t - i if t >= i else i + t) * nu + c for t in times for c in range(nu)]

    def y_rows(times):
        return [2 * i * nu + t * ny + c for t in times for c in range(ny)]

    onto_i = u_rows(range(i)) + y_rows(range(i))
    O_i = _oblique(L, y_rows(range(i, 2 * i)), u_rows(range(i, 2 * i)), onto_i, 2 * i * nu + i * ny)
    W = O_i.copy()
    W[:, :i * nu] = 0.0                      # Pi_{U_f^perp}: U_f spans the first i nu rows of Q
    U_svd, s, _ = np.linalg.svd(W, full_matrices=False)
    n = _order(s, order, i, ny)
    Gam = U_svd[:, :n] * np.sqrt(s[:n])
    C = Gam[:ny].copy()
    A = sla.lstsq(Gam[:-ny], Gam[ny:], check_finite=False)[0]
    rho_ls = float(np.max(np.abs(np.linalg.eigvals(A))))
    if stable and rho_ls >= 1.0:
        A = _reflect_unstable(A)
        logger.info("n4sid: least-squares A unstable (spectral radius %.4f); stable=%r gives %.4f",
                    rho_ls, stable, np.max(np.abs(np.linalg.eigvals(A))))

    # state sequences (Q basis) for the noise covariances (and the fallback B, D)
    O_i1 = _oblique(L, y_rows(range(i + 1, 2 * i)), u_rows(range(i + 1, 2 * i)),
                    u_rows(range(i + 1)) + y_rows(range(i + 1)), 2 * i * nu + (i + 1) * ny)
    X_i = sla.pinv(Gam) @ O_i
    X_i1 = sla.pinv(Gam[:-ny]) @ O_i1
    U_i, Y_i = L[u_rows([i])], L[y_rows([i])]

    rho = float(np.max(np.abs(np.linalg.eigvals(A))))
    if rho < 1.0:
        B, D, x0 = _fit_bd_x0(A, C, data, feedthrough)
    else:
        logger.warning("n4sid: identified A is not stable (spectral radius %.4f); B and D from the state "
                       "sequences, x0 from the first %d samples", rho, 4 * i)
        B, D = _bd_from_states(A, C, X_i, X_i1, U_i, Y_i, feedthrough)
        x0 = _fit_x0(A, B, C, D, data, 4 * i)
    res = np.vstack([X_i1 - A @ X_i - B @ U_i, Y_i - C @ X_i - D @ U_i])
    cov = res @ res.T
    cov = 0.5 * (cov + cov.T)
    return N4SIDResult(A=A, B=B, C=C, D=D, Q=cov[:n, :n], R=cov[n:, n:], S=cov[:n, n:], x0=x0,
                       singular_values=s, order=n, dt=data.dt, horizon=i, n_columns=n_columns)
