"""Request states, the transition table between them, and the one function that applies it.

The table follows the diagram in DESIGN.md ("Request lifecycle"):

    RECEIVED ─► REJECTED
    RECEIVED ─► PENDING ─► ADMITTED ─► PREFILL ─► DECODE ─► FINISHED
    PENDING | ADMITTED | PREFILL | DECODE ─► CANCELLED | DISCONNECTED | FAILED

Decisions the diagram leaves open:
- An admitted request always passes through PENDING, even when a slot is free at once: the
  queueing span then has zero length, but every request tells the same story.
- FINISHED is reachable from DECODE only. DECODE means "at least one output token exists"; the
  engine emits the prefill's token before any finished event of the same step, so a request with
  max_tokens=1, or whose first token is EOS, goes PREFILL -> DECODE -> FINISHED in one step. A
  finish with zero output tokens is an engine protocol error, not a FINISHED request.
- RECEIVED has no cancel/disconnect/fail exits: a request that never reached the scheduler is
  only ever REJECTED (or simply dropped by the HTTP layer, which never submitted it).
"""
from __future__ import annotations

import enum


class RequestState(enum.Enum):
    RECEIVED = "received"
    PENDING = "pending"
    ADMITTED = "admitted"
    PREFILL = "prefill"
    DECODE = "decode"
    # everything below is terminal (see TERMINAL)
    FINISHED = "finished"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    DISCONNECTED = "disconnected"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL: frozenset[RequestState] = frozenset({
    RequestState.FINISHED,
    RequestState.REJECTED,
    RequestState.CANCELLED,
    RequestState.DISCONNECTED,
    RequestState.FAILED,
})

# The states in which the engine (GPU thread) holds the request and a KV slot is reserved for it.
ENGINE_HELD: frozenset[RequestState] = frozenset({
    RequestState.ADMITTED,
    RequestState.PREFILL,
    RequestState.DECODE,
})

_ABORTS = frozenset({RequestState.CANCELLED, RequestState.DISCONNECTED, RequestState.FAILED})

TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    RequestState.RECEIVED: frozenset({RequestState.REJECTED, RequestState.PENDING}),
    RequestState.PENDING: frozenset({RequestState.ADMITTED}) | _ABORTS,
    RequestState.ADMITTED: frozenset({RequestState.PREFILL}) | _ABORTS,
    RequestState.PREFILL: frozenset({RequestState.DECODE}) | _ABORTS,
    RequestState.DECODE: frozenset({RequestState.FINISHED}) | _ABORTS,
    RequestState.FINISHED: frozenset(),
    RequestState.REJECTED: frozenset(),
    RequestState.CANCELLED: frozenset(),
    RequestState.DISCONNECTED: frozenset(),
    RequestState.FAILED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A move the transition table does not allow: always a bug in the caller, never user input."""

    def __init__(self, current: RequestState, new: RequestState) -> None:
        super().__init__(f"illegal request transition {current.name} -> {new.name}")
        self.current = current
        self.new = new


def advance(current: RequestState, new: RequestState) -> RequestState:
    """Return `new` if the table allows `current -> new`, else raise IllegalTransition."""
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(current, new)
    return new


class FinishReason(enum.Enum):
    """Why a FINISHED request stopped, in OpenAI's words."""
    STOP = "stop"
    LENGTH = "length"


class TerminalReason(enum.Enum):
    """The telemetry vocabulary for how a request ended (one per terminal state, two for FINISHED)."""
    COMPLETED_LENGTH = "completed_length"
    COMPLETED_STOP = "completed_stop"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    DISCONNECTED = "disconnected"
    FAILED = "failed"


_TERMINAL_REASONS: dict[RequestState, TerminalReason] = {
    RequestState.REJECTED: TerminalReason.REJECTED,
    RequestState.CANCELLED: TerminalReason.CANCELLED,
    RequestState.DISCONNECTED: TerminalReason.DISCONNECTED,
    RequestState.FAILED: TerminalReason.FAILED,
}

_COMPLETED: dict[FinishReason, TerminalReason] = {
    FinishReason.STOP: TerminalReason.COMPLETED_STOP,
    FinishReason.LENGTH: TerminalReason.COMPLETED_LENGTH,
}


def terminal_reason(state: RequestState, finish_reason: FinishReason | None) -> TerminalReason:
    """The telemetry reason for a terminal state; FINISHED needs its finish reason, others none."""
    if state is RequestState.FINISHED:
        if finish_reason is None:
            raise ValueError("a FINISHED request needs a finish reason")
        return _COMPLETED[finish_reason]
    if finish_reason is not None:
        raise ValueError(f"{state.name} takes no finish reason, got {finish_reason.value}")
    if state not in _TERMINAL_REASONS:
        raise ValueError(f"{state.name} is not a terminal state")
    return _TERMINAL_REASONS[state]
