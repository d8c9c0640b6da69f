"""Checks of scalar arguments shared by every entry point (counts, noise levels, seeds, the argument
order): a library error naming the argument, what was expected and what was given."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import NonFiniteError, ShapeError


def count(value, what: str, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an ``int`` when it is an integer (or an integral float) in ``[minimum, maximum]``."""
    integral = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)) \
        and np.isfinite(value) and int(value) == value
    if not (integral and minimum <= value and (maximum is None or value <= maximum)):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ShapeError(f"{what}: expected an integer {bound}, got {value!r}")
    return int(value)


def noise_level(value, what: str, n: int, *, positive: bool = False) -> np.ndarray:
    """``value`` (a number or ``n`` numbers) as an (n,) array of finite standard deviations >= 0 (``positive``: > 0)."""
    bound = "> 0" if positive else ">= 0"
    try:
        not_numbers = any(isinstance(v, (str, bytes, bool, np.bool_)) for v in np.asarray(value, dtype=object).ravel())
        arr = np.asarray(value, float)
    except (TypeError, ValueError):
        not_numbers = True
    if not_numbers:
        raise ShapeError(f"{what}: expected a number or {n} numbers {bound}, got {value!r}")
    if arr.size not in (1, n) or arr.ndim > 1:
        raise ShapeError(f"{what}: expected a number or {n} numbers {bound}, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0 if positive else arr < 0):
        wanted = "positive values" if positive else "standard deviations >= 0"
        raise NonFiniteError(f"{what}: expected finite {wanted}, got {value!r}")
    return np.broadcast_to(arr.reshape(-1) if arr.size == n else arr.reshape(()), (n,)).copy()


def seed_value(seed, what: str = "seed"):
    """``seed`` when it is an integer >= 0 or a ``numpy.random.Generator``."""
    if isinstance(seed, np.random.Generator):
        return seed
    return count(seed, what, minimum=0)


__all__ = ["count", "is_integer", "noise_level", "seed_value"]


def is_integer(value) -> bool:
    """True for an ``int`` or numpy integer (not a bool, not a float such as ``inf`` or ``2.5``)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


ORDER = ("the arguments are (model, data, theta): data before the parameters (older versions took "
         "(model, theta, data)); swap them")


def _looks_like_data(value, n_params: int) -> bool:
    if hasattr(value, "lengths") and hasattr(value, "y"):  # a Trajectories
        return True
    if isinstance(value, (list, tuple)) and value and all(np.ndim(v) >= 1 for v in value) and \
            any(np.ndim(v) == 2 for v in value):
        return True  # a list of (T, ny) arrays
    return isinstance(value, np.ndarray) and value.ndim >= 2 and value.size != n_params


def check_argument_order(data=None, theta=None, *, n_params: int | None = None) -> None:
    """Raise ``TypeError`` naming the order ``(model, data, theta)`` when ``data`` is a parameter dict or ``theta``
    looks like data (the old order); called by `check_data` and `as_theta_vector`."""
    if isinstance(data, Mapping):
        names = ", ".join(repr(k) for k in list(data)[:4])
        raise TypeError(f"data: got a dict of parameters ({names}); {ORDER}")
    if theta is not None and _looks_like_data(theta, -1 if n_params is None else n_params):
        what = (f"a {type(theta).__name__}" if not isinstance(theta, np.ndarray)
                else f"an array of shape {theta.shape}")
        raise TypeError(f"theta: got {what}, which looks like data; {ORDER}")
