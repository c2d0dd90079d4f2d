"""The scheduler: admission, FCFS deferral and every request's walk to exactly one terminal state.

Lives on the asyncio loop thread only. Requests come in through `submit`; engine events arrive as method calls
with the contract's events (the daemon dispatches the GPU thread's StepEvents); the API side cancels, reports
disconnects, or ends a choice on a stop string (the one finish the daemon finds in the text). Every
terminal path goes through `_end`: it frees the active slot at most once, closes the sink with its one terminal
item, and admits the head of the queue, so a slot is never idle while a request waits. Admission is FCFS:
admitted at once only if a slot is free and nobody is queued, else PENDING if the queue has room, else QueueFull.

Engine events for unknown or already-terminal ids are the normal race between a cancel and tokens
in flight: counted in `late_events`, otherwise ignored. An event the request's state cannot take
(a finish before the first token, a token for a request the engine was never given) is a
protocol error: counted, and the request FAILS rather than hold its slot forever.
"""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable

from pegainfer.engine.contract import PromptLogprobs, Token
from pegainfer.lifecycle.counters import SchedulerCounters
from pegainfer.lifecycle.engine_client import EngineClient
from pegainfer.lifecycle.observer import LifecycleObserver, NullObserver
from pegainfer.lifecycle.rejection import Draining, NotReady, QueueFull, Rejection
from pegainfer.lifecycle.request import Request
from pegainfer.lifecycle.service_rate import ServiceRate
from pegainfer.lifecycle.states import ENGINE_HELD, FinishReason, RequestState

SLOW_READER = "client too slow to read"
SLOW_READER_CODE = "slow_reader"  # the server's cancel, not the caller's: a 503 for a JSON request


class Scheduler:
    def __init__(self, engine: EngineClient, *, max_active: int, max_pending: int,
                 clock: Callable[[], float] = time.monotonic, observer: LifecycleObserver | None = None,
                 retry_after_s: float = 1.0) -> None:  # retry_after_s: the hint until a service rate is known
        if max_active < 1:
            raise ValueError(f"max_active must be >= 1, got {max_active}")
        if max_pending < 0:
            raise ValueError(f"max_pending must be >= 0, got {max_pending}")
        self._engine = engine
        self._max_active = max_active
        self._max_pending = max_pending
        self._clock = clock
        self._observer: LifecycleObserver = observer if observer is not None else NullObserver()
        self._retry_after_s = retry_after_s
        self._rate = ServiceRate(clock)
        self._running: dict[str, Request] = {}  # engine-held: ADMITTED, PREFILL, DECODE
        self._pending: OrderedDict[str, Request] = OrderedDict()  # PENDING, in arrival order
        self._ready = False
        self._not_ready_reason: str | None = None  # why the engine stopped taking work (fail_all)
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()
        self.counters = SchedulerCounters()  # read it; only the scheduler writes it

    # ---- readiness and draining ------------------------------------------------------------------
    def set_ready(self, ready: bool) -> None:
        self._ready, self._not_ready_reason = ready, None  # a reason comes only with fail_all

    def start_drain(self) -> None:
        """From now on every submit is refused with Draining; queued and running work carries on."""
        self._draining = True

    async def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no request is running or pending; False if `timeout` seconds passed first."""
        if self._idle.is_set():  # wait_for(timeout=0) would time out even when already idle
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # ---- the request side ------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        """Admit, queue or refuse a RECEIVED request. A refusal moves it to REJECTED, closes its
        sink, and raises the Rejection (QueueFull, NotReady or Draining) for the daemon to map."""
        rid = request.request_id
        if rid in self._running or rid in self._pending:
            raise ValueError(f"request id {rid!r} is already live")
        if request.received_at is None:
            request.received_at = self._clock()
        self.counters.submitted += 1
        if self._draining:
            raise self._refused(request, Draining())
        if not self._ready:
            raise self._refused(request, NotReady(self._retry_after_s, self._not_ready_reason))
        slot_free = not self._pending and len(self._running) < self._max_active
        if not slot_free and len(self._pending) >= self._max_pending:
            raise self._refused(request, QueueFull(self._rate.retry_after_s(len(self._pending), self._retry_after_s)))
        self._move(request, RequestState.PENDING)
        self._pending[rid] = request
        self._idle.clear()
        self._admit_pending()

    def reject(self, request: Request, message: str, code: str | None = None) -> None:
        """Refuse a RECEIVED request the daemon found invalid (bad input, over the context); `code`
        is the error's stable code (context_length_exceeded...), recorded on the request."""
        if request.received_at is None:
            request.received_at = self._clock()
        self._end(request, RequestState.REJECTED, error=message, code=code)

    def cancel(self, request_id: str, message: str = "cancelled", code: str | None = None) -> bool:
        """The server or an API call ends a request: CANCELLED, `code` its cause. False if not live."""
        return self._abort_live(request_id, RequestState.CANCELLED, message, code)

    def disconnect(self, request_id: str, message: str = "client disconnected") -> bool:
        """The client closed its stream: DISCONNECTED. False if the request was not live."""
        return self._abort_live(request_id, RequestState.DISCONNECTED, message)

    def fail(self, request_id: str, message: str) -> bool:
        """The daemon could not serve a live request (its output failed to render): FAILED, and the
        engine drops it. False if it was not live."""
        return self._abort_live(request_id, RequestState.FAILED, message)

    def stop_choice(self, request_id: str, index: int) -> bool:
        """The daemon found a stop string in choice `index`'s text: the choice is finished ("stop"),
        and the engine is asked to end its sequence (the request finishes once every choice has).
        False if the engine does not hold the request (it ended meanwhile, or never got it)."""
        request = self._running.get(request_id)
        if request is None or index in request.stopped_choices:
            return False
        request.stopped_choices.append(index)
        self._engine.stop_choice(request_id, index)
        return True

    def cancel_all(self, message: str, code: str | None = None) -> int:
        """Cancel every live request (shutdown), the queue first so that freed slots admit nothing."""
        victims = [*self._pending.values(), *self._running.values()]
        for request in victims:
            self._abort(request, RequestState.CANCELLED, message, code)
        return len(victims)

    # ---- the engine side -------------------------------------------------------------------------
    def on_prefill_started(self, request_id: str, cached_tokens: int = 0) -> None:
        """The request's prefill begins; cached_tokens of its prompt came from the prefix cache."""
        request = self._held(request_id, "prefill start")
        if request is None:
            return
        request.cached_tokens = cached_tokens
        if request.state is not RequestState.ADMITTED:
            self._protocol_error(request, f"prefill start in state {request.state.name}")
            return
        self._move(request, RequestState.PREFILL)

    def on_prompt_logprobs(self, event: PromptLogprobs) -> None:
        """One prompt chunk's log-probs, for the request's sink (they go out with its first token).
        Like the token it precedes, it may arrive after the request ended: then it is dropped (the
        token's event is the one that counts as late)."""
        request = self._running.get(event.request_id)
        if request is not None:
            request.sink.push_prompt(event)

    def on_token(self, token: Token, batch_size: int) -> None:
        """One sampled token, handed whole to the request's sink. The first one (from the prefill)
        moves the request to DECODE; the engine may skip the prefill-start event, so ADMITTED
        passes through PREFILL here."""
        request = self._running.get(token.request_id)  # the common case, without _held's call
        if request is None and (request := self._held(token.request_id, "token")) is None:
            return
        request.output_ids.append(token.token_id)
        if request.state is RequestState.ADMITTED:
            self._move(request, RequestState.PREFILL)
        if request.state is RequestState.PREFILL:
            self._move(request, RequestState.DECODE)
        else:  # a decode step's token: the batch size is a decode batch size
            request.decode_batch_size_max = max(request.decode_batch_size_max, batch_size)
        sink = request.sink
        sink.push(token)
        if sink.overflowed:
            self._abort(request, RequestState.CANCELLED, SLOW_READER, SLOW_READER_CODE)

    def on_finished(self, request_id: str, reason: FinishReason | str) -> None:
        finish_reason = FinishReason(reason)
        request = self._held(request_id, "finish")
        if request is None:
            return
        if request.state is not RequestState.DECODE:
            self._protocol_error(request, f"finish in state {request.state.name}, before any token")
            return
        self._end(request, RequestState.FINISHED, finish_reason=finish_reason)

    def on_failed(self, request_id: str, message: str) -> None:
        """The engine failed one request; it has already dropped it, so no cancel goes back."""
        request = self._live(request_id)
        if request is None:
            self.counters.late_events += 1
            return
        self._end(request, RequestState.FAILED, error=message)

    def fail_all(self, message: str) -> int:
        """The GPU thread or an expert rank died: every live request FAILS, and the scheduler stops
        being ready (the daemon calls set_ready(True) once a new engine is up). Returns how many."""
        self._ready = False
        self._not_ready_reason = message  # told to every request refused from now on
        victims = [*self._pending.values(), *self._running.values()]
        for request in victims:
            self._end(request, RequestState.FAILED, error=message)
        return len(victims)

    # ---- what /health and the tests read ---------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._pending)

    @property
    def late_events(self) -> int:
        return self.counters.late_events

    def get(self, request_id: str) -> Request | None:
        """The live (non-terminal, submitted) request with this id, if any."""
        return self._live(request_id)

    def snapshot(self) -> dict[str, int | bool]:
        """Gauges and counters for /health, metrics and tests, as one flat dict."""
        return {
            "ready": self._ready,
            "draining": self._draining,
            "running": len(self._running),
            "waiting": len(self._pending),
            "max_active": self._max_active,
            "max_pending": self._max_pending,
            **self.counters.as_dict(),
        }

    # ---- internals -------------------------------------------------------------------------------
    def _live(self, request_id: str) -> Request | None:
        request = self._running.get(request_id)
        return request if request is not None else self._pending.get(request_id)

    def _held(self, request_id: str, event: str) -> Request | None:
        """The engine-held request an engine event is about, or None if the event is to be ignored."""
        request = self._running.get(request_id)
        if request is not None:
            return request
        queued = self._pending.get(request_id)
        if queued is not None:
            self._protocol_error(queued, f"{event} for a request the engine was never given")
        else:
            self.counters.late_events += 1
        return None

    def _protocol_error(self, request: Request, detail: str) -> None:
        self.counters.protocol_errors += 1
        self._abort(request, RequestState.FAILED, f"engine protocol error: {detail}")

    def _refused(self, request: Request, rejection: Rejection) -> Rejection:
        """End a refused request as REJECTED and hand back the rejection for the caller to raise."""
        self._end(request, RequestState.REJECTED, error=rejection.message, code=rejection.code)
        return rejection

    def _admit_pending(self) -> None:
        while self._pending and len(self._running) < self._max_active:
            request = next(iter(self._pending.values()))
            rid = request.request_id
            self._rate.observe(busy=True)
            self._engine.admit(request.command)
            del self._pending[rid]
            self._running[rid] = request
            request.pending_depth_at_admit = len(self._pending)
            active = len(self._running)
            for held in self._running.values():
                held.active_set_size_max = max(held.active_set_size_max, active)
            self._move(request, RequestState.ADMITTED)

    def _move(self, request: Request, new: RequestState) -> None:
        old = request.state
        request.move(new, self._clock())
        self._observer.on_transition(request, old, new)

    def _abort_live(self, request_id: str, new: RequestState, message: str, code: str | None = None) -> bool:
        request = self._live(request_id)
        if request is not None:
            self._abort(request, new, message, code)
        return request is not None

    def _abort(self, request: Request, new: RequestState, message: str, code: str | None = None) -> None:
        """End a live request early; if the engine holds it, tell the engine to drop it."""
        if request.state in ENGINE_HELD:
            self._engine.cancel(request.request_id)
        self._end(request, new, error=message, code=code)

    def _end(self, request: Request, new: RequestState, *, finish_reason: FinishReason | None = None,
             error: str | None = None, code: str | None = None) -> None:
        """The one way to a terminal state: release the slot once, notify, close the sink, refill."""
        old = request.state
        end = request.end(new, self._clock(), finish_reason=finish_reason, error=error, code=code)
        rid = request.request_id
        freed = self._running.get(rid) is request  # identity: a rejected duplicate id frees nothing
        if freed:
            del self._running[rid]
            self._rate.departed(busy=bool(self._running))
        elif self._pending.get(rid) is request:
            del self._pending[rid]
        self.counters.terminal[end.reason] += 1
        self._observer.on_transition(request, old, new)
        request.sink.close(end)
        if freed:
            self._admit_pending()
        if not self._running and not self._pending:
            self._idle.set()
