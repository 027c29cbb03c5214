"""At most one line per interval for errors that repeat per connection attempt.

At the process's descriptor limit every accept() fails, and asyncio logs each failure
with its traceback: 16,009 of them (6.6 MB) in two seconds in an unrotated log. The
filter lets the first through, drops the rest for `interval_s`, then logs how many it
dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

FLOOD_MARKERS = ("out of system resource", "Too many open files")


class RateLimitFilter(logging.Filter):
    def __init__(
        self, markers: tuple[str, ...] = FLOOD_MARKERS, interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        super().__init__()
        self.markers = markers
        self.interval_s = interval_s
        self.clock = clock
        self.dropped = 0
        self._last = -float("inf")

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += " " + str(record.exc_info[1])
        if not any(m in text for m in self.markers):
            return True
        now = self.clock()
        if now - self._last < self.interval_s:
            self.dropped += 1
            return False
        self._last = now
        if self.dropped:
            record.msg = f"{record.msg} ({self.dropped} more like it in the last "\
                         f"{self.interval_s:g} s not logged)"
            self.dropped = 0
        record.exc_info = None  # the message says it; the traceback is the same each time
        record.exc_text = None
        return True


def install(logger_name: str = "asyncio") -> RateLimitFilter:
    """Rate-limit descriptor-exhaustion errors on `logger_name` (once per process)."""
    logger = logging.getLogger(logger_name)
    for existing in logger.filters:
        if isinstance(existing, RateLimitFilter):
            return existing
    flt = RateLimitFilter()
    logger.addFilter(flt)
    return flt
