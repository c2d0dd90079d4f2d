"""The scheduler's monotonic counters: what it was asked to do and how requests ended."""
from __future__ import annotations

import dataclasses
from collections import Counter

from pegainfer.lifecycle.states import TerminalReason


@dataclasses.dataclass(slots=True)
class SchedulerCounters:
    submitted: int = 0  # submit() calls, refused ones included
    late_events: int = 0  # engine events for unknown or already-terminal request ids
    protocol_errors: int = 0  # engine events the request's state could not take
    terminal: Counter[TerminalReason] = dataclasses.field(default_factory=Counter)

    def as_dict(self) -> dict[str, int]:
        counts = {
            "submitted": self.submitted,
            "late_events": self.late_events,
            "protocol_errors": self.protocol_errors,
        }
        for reason in TerminalReason:
            counts[reason.value] = self.terminal[reason]
        return counts
