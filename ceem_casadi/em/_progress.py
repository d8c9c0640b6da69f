"""Progress display for CE-EM fits (one line per iteration, or a bar on a terminal): pass a `Progress` (or a `chain`
of callbacks) as the ``callback`` of `ceem`; the library itself stays quiet."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable


class Progress:
    """Per-iteration progress of ``max_iters`` (J, increase, timings, statuses) on ``stream`` (default stderr): a bar
    redrawn in place (``bar``, default on a terminal) or a line each; ``offset``: iterations of a resumed fit."""

    def __init__(self, max_iters: int, *, stream=None, quiet: bool = False, bar: bool | None = None,
                 offset: int = 0, width: int = 24):
        self.stream = sys.stderr if stream is None else stream
        self.max_iters, self.quiet, self.offset, self.width = int(max_iters), quiet, int(offset), width
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.bar = bool(isatty()) if bar is None else bool(bar)
        self.t0 = time.perf_counter()
        self._open = False

    def line(self, rec) -> str:
        """The progress text of one [`IterationRecord`][ceem_casadi.em.IterationRecord]."""
        k = self.offset + rec.iteration
        flag = "" if getattr(rec, "accepted", True) else " [rejected]"
        kind = "" if getattr(rec, "kind", "em") == "em" else f" ({rec.kind})"
        smooth = "/".join(sorted(set(rec.smooth_status or []))) or "-"
        return (f"iter {k:>3}/{self.max_iters}{kind}: J = {rec.J:.8g}  dJ = {rec.increase:+.3g}  "
                f"smooth {rec.smooth_s:.2f} s  learn {rec.learn_s:.2f} s  [{smooth} | {rec.learn_status}]{flag}")

    def __call__(self, rec) -> None:
        if self.quiet:
            return
        if self.bar:
            k = self.offset + rec.iteration
            done = min(self.width, round(self.width * k / max(self.max_iters, 1)))
            bar = "#" * done + "." * (self.width - done)
            elapsed = time.perf_counter() - self.t0
            self.stream.write(f"\r[{bar}] {k}/{self.max_iters} J = {rec.J:.8g} dJ = {rec.increase:+.2e} "
                              f"{elapsed:.1f} s\x1b[K")
            self._open = True
        else:
            self.stream.write(self.line(rec) + "\n")
        self.stream.flush()

    def close(self, status: str | None = None, message: str = "") -> None:
        """End the bar's line and print the final status."""
        if self.quiet:
            return
        if self._open:
            self.stream.write("\n")
            self._open = False
        if status is not None:
            elapsed = time.perf_counter() - self.t0
            self.stream.write(f"{status} after {elapsed:.1f} s{': ' + message if message else ''}\n")
        self.stream.flush()


def chain(*callbacks: Callable | None) -> Callable:
    """One ``ceem`` callback calling each of ``callbacks`` in turn; ``False`` from any stops the fit."""
    cbs = [c for c in callbacks if c is not None]

    def run(rec):
        keep = True
        for c in cbs:
            if c(rec) is False:
                keep = False
        return keep

    return run
