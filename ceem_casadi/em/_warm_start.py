"""The long-record warm start of CE-EM: fit the leading samples first (`CEEMOptions.warm_start`); the fixed point
stays the whole record's (docs/long_records.md, docs/scaling.md)."""
from __future__ import annotations

import logging
import time

from ..errors import DataError, NonFiniteError, ShapeError
from ..io._validate import check_data
from ..runtime import _policy as policy
from ..runtime._solve import budget, deadline
from ..runtime._status import Status
from ._results import CEEMResult

log = logging.getLogger(__name__)

__all__ = ["leading_fit", "warm_start_length"]

WARM_SHARE = 0.4  # of the time left under a time limit: the leading fit's deadline


def warm_start_length(warm_start: int | None, lengths, x_init=None, executor=None) -> int:
    """Samples per trajectory of `ceem`'s leading fit (0: none): ``warm_start``, or for None the long-record policy
    (``policy.WARM_LENGTH`` from ``policy.WARM_FROM`` samples); 0 with ``x_init``, an executor or no longer record."""
    if x_init is not None or executor is not None:
        return 0
    longest = max(lengths)
    n = warm_start
    if n is None:
        n = policy.WARM_LENGTH if longest >= policy.WARM_FROM else 0
    return int(n) if n and longest > n else 0


def leading_fit(fit, model, data, theta_vec, n: int) -> CEEMResult | None:
    """The result of ``fit(lead, theta0)`` (`ceem`'s loop, no callback or warm start of its own) on the leading ``n``
    samples of every trajectory from ``theta_vec``; None when ``n`` is 0 or the leading part is no valid record."""
    if not n:
        return None
    try:
        lead = data.leading(n)
        check_data(model, lead)
    except (DataError, ShapeError, NonFiniteError) as exc:  # e.g. a leading part without one observation
        log.info("no warm start: the leading %d samples are not a valid record (%s)", n, exc)
        return None
    t0 = time.perf_counter()
    with deadline(budget(WARM_SHARE)):  # under a time limit: the rest is for the whole record's states and steps
        warm = fit(lead, model.params.from_vector(theta_vec))
    warm.wall_s = time.perf_counter() - t0
    log.info("warm start on the leading %d samples: %s after %d iterations (%.1f s)", n, Status(warm.status).value,
             warm.iterations, warm.wall_s)
    return warm
