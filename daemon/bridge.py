"""The bridge between the asyncio side and the GPU thread: the scheduler's EngineClient (the
contract's commands into the thread's inbox) and the dispatcher that turns the thread's typed
events, delivered on the loop with call_soon_threadsafe, into scheduler calls and telemetry
records. Token and prompt log-prob events go to the scheduler whole, which hands them to the
request's sink; the engine snapshot each StepEvents carries is kept here for /ready and /metrics."""
from __future__ import annotations

import asyncio
from typing import Protocol

from pegainfer.engine.contract import (
    Admit,
    Cancel,
    EngineDied,
    EngineSnapshot,
    Event,
    PrefillStarted,
    StepEvents,
    StepRecord,
    StopChoice,
)
from pegainfer.engine.loop import GpuThread
from pegainfer.lifecycle.scheduler import Scheduler


class StepObserver(Protocol):
    def on_step(self, record: StepRecord) -> None: ...

    def on_engine_died(self, message: str) -> None: ...

    def on_preempted(self, request_id: str, index: int) -> None: ...


class EngineBridge:
    def __init__(self, loop: asyncio.AbstractEventLoop, observer: StepObserver):
        self.loop = loop
        self.observer = observer
        self.gpu: GpuThread | None = None
        self.scheduler: Scheduler | None = None
        self.died: str | None = None
        self.snapshot: EngineSnapshot | None = None  # the engine's state as last published

    def connect(self, gpu: GpuThread, scheduler: Scheduler) -> None:
        """The GPU thread needs the bridge's emit and the scheduler its EngineClient: wire both ways.
        The thread's first snapshot is taken here, before it starts."""
        self.gpu, self.scheduler = gpu, scheduler
        self.snapshot = gpu.snapshot()

    # ---- EngineClient (called on the loop) ---------------------------------------------------------
    def admit(self, command: Admit) -> None:
        self.gpu.submit(command)

    def cancel(self, request_id: str) -> None:
        self.gpu.submit(Cancel(request_id))

    def stop_choice(self, request_id: str, index: int) -> None:
        self.gpu.submit(StopChoice(request_id, index))

    # ---- events (emit runs on the GPU thread; dispatch on the loop) ---------------------------------
    def emit(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.dispatch, event)
        except RuntimeError:  # the loop is closed: the process is exiting
            pass

    def dispatch(self, event: Event) -> None:
        s = self.scheduler
        match event:
            case PrefillStarted():
                cached = event.cached_tokens or [0] * len(event.request_ids)
                for rid, n in zip(event.request_ids, cached):
                    s.on_prefill_started(rid, n)
            case StepEvents():
                if event.snapshot is not None:
                    self.snapshot = event.snapshot
                batch = event.record.decode_rows if event.record else 0
                for p in event.prompt_logprobs:
                    s.on_prompt_logprobs(p)
                for t in event.tokens:
                    s.on_token(t, batch)
                for f in event.finished:
                    s.on_finished(f.request_id, f.reason)
                for f in event.failed:
                    s.on_failed(f.request_id, f.message)
                for rid, index in event.preempted:
                    self.observer.on_preempted(rid, index)
                if event.record is not None:
                    self.observer.on_step(event.record)
            case EngineDied():
                self.died = event.message
                if event.snapshot is not None:
                    self.snapshot = event.snapshot
                s.fail_all(f"engine failed: {event.message}")
                self.observer.on_engine_died(event.message)
