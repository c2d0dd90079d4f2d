"""Test doubles for the lifecycle package: a recording engine client, a hand-driven clock, an
observer that keeps every transition, and a request factory."""
from __future__ import annotations

import dataclasses

from lifecycle.params import GenerationParams
from lifecycle.request import Request
from lifecycle.sink import TokenSink
from lifecycle.states import RequestState


@dataclasses.dataclass(slots=True)
class FakeEngine:
    """Records the scheduler's commands and checks they make sense from the engine's side."""
    admitted: list[str] = dataclasses.field(default_factory=list)
    cancelled: list[str] = dataclasses.field(default_factory=list)

    def admit(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> None:
        assert request_id not in self.admitted, f"{request_id} admitted twice"
        self.admitted.append(request_id)

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
        request_id=request_id,
        prompt_ids=prompt if prompt is not None else [1, 2, 3],
        params=GenerationParams(max_tokens=max_tokens),
        model="deepseek-v2-lite",
        sink=TokenSink(max_buffered=max_buffered),
    )


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
        tokens.extend(item.token_ids)
        if item.end is not None:
            ends.append(item.end)
