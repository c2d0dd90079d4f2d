"""The bridge moves request data only as the contract's objects, each once: the scheduler hands the
engine the very Admit the parse built; the engine's token and prompt log-prob events reach the
request's sink whole (the one channel to the handler: no side table); a stop string goes to the
engine through the scheduler; and the engine snapshot a step publishes is what the bridge keeps
for /ready and /metrics, in place before the step's requests end."""
from __future__ import annotations

import asyncio
import types

import pytest

from pegainfer.daemon.bridge import EngineBridge
from pegainfer.daemon.protocol import parse_completion
from pegainfer.engine.contract import (
    Admit,
    EngineDied,
    EngineSnapshot,
    Finished,
    FinishReason,
    PromptLogprobs,
    StepEvents,
    StopChoice,
    Token,
)
from pegainfer.lifecycle.request import Request
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.lifecycle.sink import TokenSink
from pegainfer.lifecycle.states import RequestState


def snapshot(running: int, free: int) -> EngineSnapshot:
    return EngineSnapshot(steps=1, decode_batch_max=1, running=running, waiting=0, overlapped_steps=0,
                          async_scheduling=True, kv_slots_free=free, kv_slots_total=4)


class EndWatcher:
    """A lifecycle observer that notes what the bridge knew of the engine when each request ended."""

    def __init__(self) -> None:
        self.bridge: EngineBridge | None = None
        self.at_end: list[EngineSnapshot | None] = []

    def on_transition(self, request, old, new) -> None:
        if new.is_terminal:
            self.at_end.append(self.bridge.snapshot)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def rig(loop, watcher: EndWatcher | None = None) -> tuple[EngineBridge, list, Scheduler]:
    sent: list = []
    bridge = EngineBridge(loop, types.SimpleNamespace(on_step=lambda r: None, on_engine_died=lambda m: None))
    gpu = types.SimpleNamespace(submit=sent.append, snapshot=lambda: snapshot(0, 4))
    scheduler = Scheduler(bridge, max_active=4, max_pending=4, observer=watcher)
    scheduler.set_ready(True)
    bridge.connect(gpu, scheduler)
    if watcher is not None:
        watcher.bridge = bridge
    return bridge, sent, scheduler


def submit(scheduler: Scheduler, rid: str, body: dict) -> Request:
    parsed = parse_completion({"prompt": [5, 6, 7], **body}, max_tokens_default=8)
    request = Request(parsed.admit(rid, [5, 6, 7]), "m", TokenSink(64))
    scheduler.submit(request)
    return request


def test_the_engine_gets_the_admit_the_parse_built_and_stop_strings_go_through_the_scheduler(loop):
    bridge, sent, scheduler = rig(loop)
    assert bridge.snapshot == snapshot(0, 4)  # taken before the thread starts
    request = submit(scheduler, "r", {"temperature": 0.5, "n": 2, "stop": ["x"]})
    assert sent == [request.command] and sent[0] is request.command and isinstance(sent[0], Admit)
    assert sent[0].sampling.temperature == 0.5 and sent[0].n == 2
    assert scheduler.stop_choice("r", 1)
    assert sent[-1] == StopChoice("r", 1)


def test_token_events_reach_the_sink_whole_and_the_snapshot_is_kept_before_the_end(loop):
    watcher = EndWatcher()
    bridge, _, scheduler = rig(loop, watcher)
    request = submit(scheduler, "e", {"echo": True, "logprobs": 1})
    prompt = PromptLogprobs("e", [None, (-1.0, ((6, -1.0),)), (-2.0, ((7, -2.0),))], 0)
    token = Token("e", 9, True, 0, -0.25, ((9, -0.25),), FinishReason.LENGTH)
    after = snapshot(0, 4)
    bridge.dispatch(StepEvents([token], [Finished("e", FinishReason.LENGTH)], [], [], None, [prompt], after))
    item = request.sink.read_nowait()
    assert item.tokens == [token] and item.tokens[0] is token and list(item.prompt) == [prompt]
    assert item.end is not None and item.end.state is RequestState.FINISHED
    assert watcher.at_end == [after] and bridge.snapshot is after  # known when the request ended


def test_the_engines_last_snapshot_comes_with_its_death(loop):
    bridge, _, scheduler = rig(loop)
    submit(scheduler, "d", {})
    dead = snapshot(0, 3)
    bridge.dispatch(EngineDied("boom", [], dead))
    assert bridge.died == "boom" and bridge.snapshot is dead and scheduler.num_running == 0
