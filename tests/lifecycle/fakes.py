"""Test doubles for the lifecycle package: a recording engine client, a hand-driven clock, an
observer that keeps every transition, a request factory and a token-event factory."""
from __future__ import annotations

import dataclasses

from pegainfer.engine.contract import Admit, Token
from pegainfer.lifecycle.request import Request
from pegainfer.lifecycle.sink import TokenSink
from pegainfer.lifecycle.states import RequestState


@dataclasses.dataclass(slots=True)
class FakeEngine:
    """Records the scheduler's commands and checks they make sense from the engine's side."""
    admitted: list[str] = dataclasses.field(default_factory=list)
    cancelled: list[str] = dataclasses.field(default_factory=list)
    stopped: list[tuple[str, int]] = dataclasses.field(default_factory=list)

    def admit(self, command: Admit) -> None:
        assert isinstance(command, Admit)
        assert command.request_id not in self.admitted, f"{command.request_id} admitted twice"
        self.admitted.append(command.request_id)

    def stop_choice(self, request_id: str, index: int) -> None:
        assert request_id in self.admitted and request_id not in self.cancelled, f"stop for {request_id}"
        self.stopped.append((request_id, index))

    def cancel(self, request_id: str) -> None:
        assert request_id in self.admitted, f"cancel for {request_id}, never admitted"
        assert request_id not in self.cancelled, f"{request_id} cancelled twice"
        self.cancelled.append(request_id)


@dataclasses.dataclass(slots=True)
class FakeClock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds


@dataclasses.dataclass(slots=True)
class RecordingObserver:
    moves: list[tuple[str, RequestState, RequestState]] = dataclasses.field(default_factory=list)

    def on_transition(self, request: Request, old: RequestState, new: RequestState) -> None:
        assert request.state is new, "observer called before the request moved"
        self.moves.append((request.request_id, old, new))

    def path(self, request_id: str) -> list[RequestState]:
        """The states the request went through, starting with RECEIVED."""
        steps = [(old, new) for rid, old, new in self.moves if rid == request_id]
        return [steps[0][0], *(new for _, new in steps)] if steps else []


def make_request(
    request_id: str, *, max_tokens: int = 4, max_buffered: int = 64, prompt: list[int] | None = None
) -> Request:
    return Request(
        command=Admit(request_id, prompt if prompt is not None else [1, 2, 3], max_tokens),
        model="deepseek-v2-lite",
        sink=TokenSink(max_buffered=max_buffered),
    )


def tok(request_id: str, token_id: int, index: int = 0) -> Token:
    """A token event as the engine sends it (only what the scheduler reads is set)."""
    return Token(request_id, token_id, False, index)


def drain_sink(request: Request) -> tuple[list[int], list[object]]:
    """Read everything a sink has ready without awaiting: (tokens, terminal ends seen)."""
    tokens: list[int] = []
    ends: list[object] = []
    while True:
        try:
            item = request.sink.read_nowait()
        except StopAsyncIteration:
            return tokens, ends
        if item is None:
            return tokens, ends
        tokens.extend(t.token_id for t in item.tokens)
        if item.end is not None:
            ends.append(item.end)
