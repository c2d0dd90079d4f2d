"""Request moves and their timestamps; a request carries its engine command."""
from __future__ import annotations

import pytest

from pegainfer.engine.contract import Admit, SamplingParams
from pegainfer.lifecycle.sink import SinkEnd
from pegainfer.lifecycle.states import FinishReason, IllegalTransition, RequestState, TerminalReason

from tests.lifecycle.fakes import make_request

S = RequestState


def test_moves_record_their_times() -> None:
    request = make_request("r")
    for t, state in enumerate([S.PENDING, S.ADMITTED, S.PREFILL, S.DECODE], start=1):
        request.move(state, float(t))
    end = request.end(S.FINISHED, 5.0, finish_reason=FinishReason.LENGTH)
    assert (request.pending_at, request.admitted_at, request.prefill_started_at,
            request.first_token_at, request.finished_at) == (1.0, 2.0, 3.0, 4.0, 5.0)
    assert request.state is S.FINISHED and request.is_terminal
    assert request.terminal_reason is TerminalReason.COMPLETED_LENGTH
    assert end == SinkEnd(S.FINISHED, TerminalReason.COMPLETED_LENGTH, FinishReason.LENGTH, None)


def test_illegal_move_raises_and_changes_nothing() -> None:
    request = make_request("r")
    with pytest.raises(IllegalTransition):
        request.move(S.DECODE, 1.0)
    with pytest.raises(IllegalTransition):
        request.end(S.FINISHED, 1.0, finish_reason=FinishReason.STOP)
    assert request.state is S.RECEIVED
    assert request.finished_at is None and request.terminal_reason is None


def test_terminal_states_go_through_end_only() -> None:
    request = make_request("r")
    request.move(S.PENDING, 1.0)
    with pytest.raises(ValueError):
        request.move(S.CANCELLED, 2.0)
    with pytest.raises(ValueError):
        request.end(S.ADMITTED, 2.0)
    end = request.end(S.DISCONNECTED, 2.0, error="client disconnected")
    assert end.message == "client disconnected" and request.error == "client disconnected"
    with pytest.raises(IllegalTransition):
        request.end(S.CANCELLED, 3.0)


def test_a_request_carries_the_engine_command_it_was_parsed_into() -> None:
    command = Admit("r", [1, 2], 8, True, SamplingParams(temperature=0.5), 2, (7,))
    request = make_request("r")
    request.command = command
    assert request.request_id == "r" and request.prompt_ids is command.prompt_ids
    assert request.command.sampling.temperature == 0.5 and request.command.n == 2
