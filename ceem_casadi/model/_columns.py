"""Check that model maps written for (n, B) sample columns agree with the model's one-sample Function."""
from __future__ import annotations

import casadi as ca
import numpy as np

from ..errors import ModelError

__all__ = ["check_columnwise"]


def check_columnwise(model, name: str, fun, ref: ca.Function, columns: int = 7) -> None:
    """Raise [`ModelError`][ceem_casadi.errors.ModelError] unless ``fun(X, U, p)`` on ``columns``
    random sample columns equals ``ref`` (``model.f`` or ``model.g``) column by column (1e-10).

    Parameters
    ----------
    model : StateSpaceModel
        The model (its parameters' namespace is passed to ``fun`` as ``p``).
    name : str
        The argument's name in messages (``"step"``, ``"observe"``).
    fun : callable
        ``fun(X (nx, B), U (nu, B), p) -> (n, B)`` on CasADi MX matrices.
    ref : casadi.Function
        The one-column Function it must agree with.
    columns : int
        Random columns checked.

    Returns
    -------
    None

    Raises
    ------
    ModelError
        ``fun`` fails on matrices, or differs from ``ref``.

    Examples
    --------
    >>> import casadi as ca, ceem_casadi as cc
    >>> from ceem_casadi.model import check_columnwise
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: 0.9 * x, lambda x, u, p: x ** 2, nx=1)
    >>> check_columnwise(model, "observe", lambda X, U, p: X ** 2, model.g)      # agrees: no error
    >>> try:
    ...     check_columnwise(model, "observe", lambda X, U, p: ca.sum1(X), model.g)
    ... except cc.errors.ModelError as e:
    ...     print(str(e)[:44])
    observe= on sample columns differs from mode
    """
    rng = np.random.default_rng(0)
    X, U = rng.normal(size=(model.nx, columns)), rng.normal(size=(model.nu, columns))
    p0 = model.params.to_vector({q.name: q.array("value") for q in model.params})
    p0 = p0 + 0.1 * rng.normal(size=p0.size)
    ps, Xs, Us = ca.MX.sym("p", p0.size), ca.MX.sym("X", model.nx, columns), ca.MX.sym("U", model.nu, columns)
    try:
        got = np.asarray(ca.Function("b", [Xs, Us, ps], [fun(Xs, Us, model.params.symbols(ps))])(X, U, p0))
    except Exception as exc:        # any failure means: not batch-capable
        raise ModelError(f"{name}= must accept (n, B) matrices (columns = samples): {exc}") from exc
    want = np.asarray(ref.map(columns)(X, U, p0))
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-10, atol=1e-10):
        raise ModelError(f"{name}= on sample columns differs from model.{ref.name()} "
                         f"(shape {got.shape} vs {want.shape}, max difference "
                         f"{np.max(np.abs(got - want)) if got.shape == want.shape else 'n/a'})")
