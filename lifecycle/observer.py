"""The lifecycle-observer protocol: how telemetry and metrics see every state change.

The scheduler calls `on_transition` after each move, once the request's fields (timestamps,
terminal reason, error) describe the new state. Observers only read the request; they must not
call back into the scheduler.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pegainfer.lifecycle.request import Request
    from pegainfer.lifecycle.states import RequestState


class LifecycleObserver(Protocol):
    def on_transition(self, request: Request, old: RequestState, new: RequestState) -> None:
        ...


class NullObserver:
    """The default observer: sees everything, does nothing."""

    def on_transition(self, request: Request, old: RequestState, new: RequestState) -> None:
        pass
