"""The one conversion from the scheduler's monotonic clock to the epoch nanoseconds spans carry.

The offset between the two clocks is captured once, so that every span of a process shares it and
the order and gaps of request timestamps survive the conversion exactly (re-reading the wall clock
per span would let an NTP step reorder a request's queue and prefill spans)."""
from __future__ import annotations

import time


class EpochClock:
    def __init__(self, wall_ns: int | None = None, monotonic_ns: int | None = None) -> None:
        wall = time.time_ns() if wall_ns is None else wall_ns
        mono = time.monotonic_ns() if monotonic_ns is None else monotonic_ns
        self.offset_ns = wall - mono

    def ns(self, monotonic_s: float) -> int:
        """Epoch nanoseconds of a time.monotonic() reading."""
        return round(monotonic_s * 1e9) + self.offset_ns

    def now_ns(self) -> int:
        return time.monotonic_ns() + self.offset_ns
