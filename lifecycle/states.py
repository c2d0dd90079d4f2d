"""The transition table between request states, and the one function that applies it. The states,
the terminal and engine-held sets, and the finish and terminal reasons are the contract's
(engine/contract.py), so that telemetry and the daemon speak the same vocabulary without importing
lifecycle/; they are re-exported here.

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

from pegainfer.engine.contract import ENGINE_HELD, TERMINAL, FinishReason, RequestState, TerminalReason

__all__ = ["ENGINE_HELD", "TERMINAL", "TRANSITIONS", "FinishReason", "IllegalTransition", "RequestState",
           "TerminalReason", "advance", "terminal_reason"]

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
