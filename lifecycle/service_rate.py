"""The service rate: how fast requests leave the engine, which turns a queue depth into a
Retry-After worth waiting for.

An exponentially weighted rate over engine-busy time only: requests that left (any terminal state
that freed a slot), and the seconds the engine held work, both weighted by exp(-age / window) where
age counts busy seconds. Idle time neither dilutes the rate (an idle server is not a slow one) nor
ages what was measured. A refusal then says: the queue ahead of you, plus you, over that rate.

Times come from the scheduler's injected clock, so tests drive it with a fake one.
"""
from __future__ import annotations

import math
from collections.abc import Callable

WINDOW_S = 10.0  # busy seconds after which a departure weighs 1/e
RETRY_AFTER_BOUNDS_S = (1, 60)  # what a Retry-After may say, in whole seconds


class ServiceRate:
    __slots__ = ("window_s", "_clock", "_departed", "_busy_s", "_last", "_busy")

    def __init__(self, clock: Callable[[], float], window_s: float = WINDOW_S) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._clock = clock
        self._departed = 0.0  # weighted departures
        self._busy_s = 0.0  # weighted busy seconds
        self._last: float | None = None
        self._busy = False  # whether the engine held work since `_last`

    def observe(self, busy: bool) -> None:
        """Account the time since the last call (busy or not, as the last call said), and record
        whether the engine holds work from now on. Call it whenever that changes."""
        now = self._clock()
        if self._last is not None and self._busy and now > self._last:
            decay = math.exp(-(now - self._last) / self.window_s)
            self._departed *= decay
            # the weighted length of the busy interval just ended: the integral of exp(-age / window)
            self._busy_s = self._busy_s * decay + self.window_s * (1.0 - decay)
        if self._last is None or now > self._last:
            self._last = now
        self._busy = busy

    def departed(self, busy: bool) -> None:
        """A request left the engine just now; `busy`: whether the engine still holds work."""
        self.observe(busy)
        self._departed += 1.0

    def per_second(self) -> float | None:
        """Requests leaving per busy second, or None before the engine has been busy at all. Until
        a whole departure has been weighed in, it counts one: "one is about to leave" is the
        optimistic bound, and it keeps the estimate finite on a server that only just got busy."""
        self.observe(self._busy)
        if self._busy_s <= 0.0:
            return None
        return max(self._departed, 1.0) / self._busy_s

    def retry_after_s(self, queued: int, unknown: float) -> float:
        """Whole seconds until the `queued` requests ahead and one more are likely through, within
        RETRY_AFTER_BOUNDS_S; `unknown` while no rate is known yet."""
        rate = self.per_second()
        if rate is None:
            return unknown
        low, high = RETRY_AFTER_BOUNDS_S
        return float(min(high, max(low, math.ceil((queued + 1) / rate))))
