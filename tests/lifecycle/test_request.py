"""Request moves and their timestamps; generation-parameter validation."""
from __future__ import annotations

import pytest

from lifecycle.params import GenerationParams
from lifecycle.sink import SinkEnd
from lifecycle.states import FinishReason, IllegalTransition, RequestState, TerminalReason

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


def test_generation_params_validate() -> None:
    assert GenerationParams(max_tokens=1).ignore_eos is False
    with pytest.raises(ValueError):
        GenerationParams(max_tokens=0)
    with pytest.raises(TypeError):
        GenerationParams(max_tokens=True)
    with pytest.raises(TypeError):
        GenerationParams(max_tokens=2.0)  # type: ignore[arg-type]


def test_generation_params_default_to_greedy_and_validate_sampling() -> None:
    p = GenerationParams(max_tokens=4)
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.n, p.logprobs, p.seed) == (0.0, 1.0, -1, 0.0, 1, None, None)
    ok = GenerationParams(4, temperature=2, top_p=0.1, top_k=1, min_p=1, seed=-(2**63), presence_penalty=-2,
                          frequency_penalty=2, repetition_penalty=0.5, logprobs=5, prompt_logprobs=0,
                          stop_token_ids=(0, 7), n=16)
    assert ok.n == 16
    for bad in ({"temperature": 2.5}, {"temperature": -0.1}, {"top_p": 0}, {"top_p": 1.01}, {"top_k": 0},
                {"top_k": -2}, {"min_p": 1.5}, {"presence_penalty": 2.1}, {"frequency_penalty": -2.1},
                {"repetition_penalty": 0}, {"logprobs": 6}, {"prompt_logprobs": -1}, {"n": 0}, {"n": 17},
                {"seed": 2**63}, {"temperature": float("nan")}, {"stop_token_ids": (-1,)}, {"stop_token_ids": [1]}):
        with pytest.raises(ValueError):
            GenerationParams(4, **bad)
    for bad in ({"temperature": "hot"}, {"seed": 1.5}, {"n": True}, {"logprobs": 2.0}):
        with pytest.raises(TypeError):
            GenerationParams(4, **bad)
