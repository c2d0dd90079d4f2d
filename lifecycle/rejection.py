"""Typed reasons the scheduler refuses a new request; the daemon maps them to HTTP statuses
(QueueFull -> 429, NotReady and Draining -> 503), with Retry-After where one is given. Each has a
stable `code`, which the refused request records (its trace's error.type)."""
from __future__ import annotations


class Rejection(Exception):
    """Base of every admission refusal. The request is already REJECTED when this is raised."""
    code: str | None = None

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class QueueFull(Rejection):
    """Every active slot is taken and the pending queue is at its bound."""
    code = "queue_full"

    def __init__(self, retry_after_s: float) -> None:
        super().__init__("server busy: active set and pending queue are full", retry_after_s)


class NotReady(Rejection):
    """The engine is not (or no longer) able to take work: still loading, or it died (`reason`
    says how, e.g. which expert rank was lost)."""
    code = "not_ready"

    def __init__(self, retry_after_s: float, reason: str | None = None) -> None:
        super().__init__("server not ready" + (f": {reason}" if reason else ""), retry_after_s)
        self.reason = reason


class Draining(Rejection):
    """The server is shutting down and takes no new work; another replica should."""
    code = "draining"

    def __init__(self) -> None:
        super().__init__("server draining: not accepting new requests")
