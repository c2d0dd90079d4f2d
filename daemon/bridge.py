"""The bridge between the asyncio side and the GPU thread: the scheduler's EngineClient (commands
into the thread's inbox) and the dispatcher that turns the thread's typed events, delivered on the
loop with call_soon_threadsafe, into scheduler calls and telemetry records. Token details the
scheduler does not carry (choice index, log-probs) go to `details` for the completion handler."""
from __future__ import annotations

import asyncio
from typing import Protocol

from daemon.token_details import TokenDetails
from engine.loop import GpuThread
from engine.contract import (
    Admit,
    Cancel,
    EngineDied,
    Event,
    PrefillStarted,
    SamplingSpec,
    StepEvents,
    StepRecord,
    StopChoice,
)
from lifecycle.params import GenerationParams
from lifecycle.scheduler import Scheduler


class StepObserver(Protocol):
    def on_step(self, record: StepRecord) -> None: ...

    def on_engine_died(self, message: str) -> None: ...


class EngineBridge:
    def __init__(self, loop: asyncio.AbstractEventLoop, observer: StepObserver):
        self.loop = loop
        self.observer = observer
        self.gpu: GpuThread | None = None
        self.scheduler: Scheduler | None = None
        self.died: str | None = None
        self.details = TokenDetails()

    def connect(self, gpu: GpuThread, scheduler: Scheduler) -> None:
        """The GPU thread needs the bridge's emit and the scheduler its EngineClient: wire both ways."""
        self.gpu, self.scheduler = gpu, scheduler

    # ---- EngineClient (called on the loop) ---------------------------------------------------------
    def admit(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> None:
        self.gpu.submit(Admit(request_id, prompt_ids, params.max_tokens, params.ignore_eos, sampling_spec(params),
                              params.n, params.stop_token_ids))

    def cancel(self, request_id: str) -> None:
        self.gpu.submit(Cancel(request_id))

    # ---- beyond the EngineClient: the completion handler found a stop string ----------------------
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
                for rid in event.request_ids:
                    s.on_prefill_started(rid)
            case StepEvents():
                batch = event.record.decode_rows if event.record else 0
                for p in event.prompt_logprobs:
                    self.details.add_prompt(p)
                for t in event.tokens:
                    self.details.add_token(t)  # before the sink wakes the handler for it
                    s.on_token(t.request_id, t.token_id, batch)
                for f in event.finished:
                    s.on_finished(f.request_id, f.reason)
                for f in event.failed:
                    s.on_failed(f.request_id, f.message)
                if event.record is not None:
                    self.observer.on_step(event.record)
            case EngineDied():
                self.died = event.message
                s.fail_all(f"engine failed: {event.message}")
                self.observer.on_engine_died(event.message)


def sampling_spec(p: GenerationParams) -> SamplingSpec:
    return SamplingSpec(temperature=float(p.temperature), top_p=float(p.top_p), top_k=p.top_k, min_p=float(p.min_p),
                        presence_penalty=float(p.presence_penalty), frequency_penalty=float(p.frequency_penalty),
                        repetition_penalty=float(p.repetition_penalty), seed=p.seed, logprobs=p.logprobs,
                        prompt_logprobs=p.prompt_logprobs, logit_bias=p.logit_bias)
