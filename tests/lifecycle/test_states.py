"""The transition table, checked exhaustively, and the terminal-reason vocabulary."""
from __future__ import annotations

import itertools

import pytest

from pegainfer.lifecycle.states import (
    ENGINE_HELD,
    TERMINAL,
    TRANSITIONS,
    FinishReason,
    IllegalTransition,
    RequestState,
    TerminalReason,
    advance,
    terminal_reason,
)

S = RequestState


def test_table_covers_every_state_and_terminals_have_no_exits() -> None:
    assert set(TRANSITIONS) == set(RequestState)
    for state in RequestState:
        assert (TRANSITIONS[state] == frozenset()) == (state in TERMINAL)
        assert state.is_terminal == (state in TERMINAL)
    assert TERMINAL == {S.FINISHED, S.REJECTED, S.CANCELLED, S.DISCONNECTED, S.FAILED}
    assert ENGINE_HELD == {S.ADMITTED, S.PREFILL, S.DECODE}


def test_table_matches_the_design_diagram() -> None:
    aborts = {S.CANCELLED, S.DISCONNECTED, S.FAILED}
    assert TRANSITIONS[S.RECEIVED] == {S.REJECTED, S.PENDING}
    assert TRANSITIONS[S.PENDING] == {S.ADMITTED} | aborts
    assert TRANSITIONS[S.ADMITTED] == {S.PREFILL} | aborts
    assert TRANSITIONS[S.PREFILL] == {S.DECODE} | aborts
    assert TRANSITIONS[S.DECODE] == {S.FINISHED} | aborts


@pytest.mark.parametrize(("current", "new"), list(itertools.product(RequestState, RequestState)))
def test_advance_is_legal_exactly_when_the_table_says_so(current: S, new: S) -> None:
    if new in TRANSITIONS[current]:
        assert advance(current, new) is new
    else:
        with pytest.raises(IllegalTransition) as info:
            advance(current, new)
        assert (info.value.current, info.value.new) == (current, new)
        assert current.name in str(info.value) and new.name in str(info.value)


def test_every_state_is_reachable_and_every_path_ends_terminal() -> None:
    seen = {S.RECEIVED}
    frontier = [S.RECEIVED]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(RequestState)
    # no cycles: a depth-first walk from RECEIVED never revisits a state on its own path
    def walk(state: S, path: tuple[S, ...]) -> None:
        assert state not in path
        for nxt in TRANSITIONS[state]:
            walk(nxt, (*path, state))
    walk(S.RECEIVED, ())


def test_terminal_reasons() -> None:
    assert terminal_reason(S.FINISHED, FinishReason.STOP) is TerminalReason.COMPLETED_STOP
    assert terminal_reason(S.FINISHED, FinishReason.LENGTH) is TerminalReason.COMPLETED_LENGTH
    assert terminal_reason(S.REJECTED, None) is TerminalReason.REJECTED
    assert terminal_reason(S.CANCELLED, None) is TerminalReason.CANCELLED
    assert terminal_reason(S.DISCONNECTED, None) is TerminalReason.DISCONNECTED
    assert terminal_reason(S.FAILED, None) is TerminalReason.FAILED
    assert {r.value for r in TerminalReason} == {
        "completed_length", "completed_stop", "rejected", "cancelled", "disconnected", "failed"}


@pytest.mark.parametrize(("state", "finish"), [
    (S.FINISHED, None), (S.CANCELLED, FinishReason.STOP), (S.DECODE, None), (S.RECEIVED, None)])
def test_terminal_reason_refuses_nonsense(state: S, finish: FinishReason | None) -> None:
    with pytest.raises(ValueError):
        terminal_reason(state, finish)
