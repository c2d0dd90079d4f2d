"""Request spans: one root span per request (`text_completion {model}`, kind SERVER, parented on
an incoming W3C traceparent), with queue, prefill and decode child spans and first_token and
terminal events, all timed from the request's own timestamps.

The root span starts at the request's first transition (its start time is `received_at`) so that
engine steps can link to it while it runs; children, events and most attributes are written at
the terminal transition, when every timestamp is known; the children go straight to the span
processors (Tracing.end_child_span), as the tracer would have ended them. A request gets exactly one root span:
the scheduler moves a request to a terminal state exactly once, and a front rejection never
reaches the scheduler. Requests are seen through telemetry.observed (nothing from lifecycle/)."""
from __future__ import annotations

import collections
import dataclasses
import hashlib
from types import MappingProxyType
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import Span
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from pegainfer.engine.contract import ENGINE_HELD, RequestState, TerminalReason
from pegainfer.telemetry.clock import EpochClock
from pegainfer.telemetry.engine_info import EngineInfo
from pegainfer.telemetry.observed import AnnouncedRequest, ObservedRequest
from pegainfer.telemetry.tracing import Tracing

OPERATION = "text_completion"
MAX_ANNOUNCED = 4096  # announced requests not yet seen by the scheduler (normally 0 or 1)

# A scheduler refusal's HTTP status, by the stable code the refused request records (lifecycle's
# Rejection.code; the daemon answers with the same statuses). A request the daemon rejected before
# admission (over the context, a token outside the vocabulary) has no code: it was a 400.
_REFUSAL_STATUS = {"queue_full": 429, "not_ready": 503, "draining": 503}
_INVALID = (400, "invalid_request")


def _refusal(code: str | None) -> tuple[int, str]:
    """(HTTP status, error.type) of a REJECTED request, by its code."""
    return (_REFUSAL_STATUS[code], code) if code in _REFUSAL_STATUS else _INVALID


@dataclasses.dataclass(slots=True)
class _Announced:
    parsed: AnnouncedRequest
    parent: Context | None


def output_hash(token_ids: list[int]) -> str:
    """sha256 of the output token ids as compact JSON (`[1,2,3]`)."""
    return hashlib.sha256(f"[{','.join(map(str, token_ids))}]".encode()).hexdigest()


class RequestSpans:
    def __init__(self, tracing: Tracing, clock: EpochClock, engine: EngineInfo) -> None:
        self._tracing = tracing
        self._tracer = tracing.tracer
        self._clock = clock
        self._engine = engine
        self._announced: collections.OrderedDict[str, _Announced] = collections.OrderedDict()
        self._live: dict[str, Span] = {}
        # every engine step links the requests it ran: one Link per request, made once, for the live
        # ones and for those ended since the last step
        self._links: dict[str, Link] = {}
        self._ended: dict[str, Link] = {}
        self._preemptions: dict[str, int] = {}  # live request id -> times one of its sequences was preempted

    # ---- what the hub calls ----------------------------------------------------------------------
    def announce(self, request_id: str, parsed: AnnouncedRequest, parent: Context | None) -> None:
        self._announced[request_id] = _Announced(parsed, parent)
        while len(self._announced) > MAX_ANNOUNCED:
            self._announced.popitem(last=False)

    def on_transition(self, request: ObservedRequest, old: RequestState, new: RequestState) -> None:
        if request.request_id not in self._live and old is RequestState.RECEIVED:
            self._start(request)
        if new.is_terminal:
            self._finish(request, linkable=old in ENGINE_HELD)

    def front_rejection(self, status: int, message: str, parent: Context | None) -> None:
        now = self._clock.now_ns()
        span = self._tracer.start_span(f"{OPERATION} {self._engine.model}", context=parent or Context(),
                                       kind=SpanKind.SERVER, start_time=now)
        span.set_attributes({
            "gen_ai.operation.name": OPERATION, "gen_ai.request.model": self._engine.model,
            "error.type": str(status), "http.response.status_code": status,
            "pegainfer.terminal_reason": TerminalReason.REJECTED.value, "pegainfer.error": message,
            "pegainfer.rejected_at": "front", **self._engine.attributes()})
        span.add_event("terminal", {"pegainfer.terminal_reason": TerminalReason.REJECTED.value,
                                    "pegainfer.state": RequestState.REJECTED.value}, timestamp=now)
        span.set_status(Status(StatusCode.ERROR, message))
        span.end(end_time=now)

    def links(self, request_ids: list[str]) -> list[Link]:
        """Links to the spans of these requests (live, or ended since the last engine step), each
        carrying its request id."""
        live, ended = self._links, self._ended
        out = []
        for rid in request_ids:
            link = live.get(rid) or ended.get(rid)
            if link is not None:
                out.append(link)
        return out

    def preempted(self, request_id: str, index: int) -> None:
        """A 'preempted' event on the request's live span (its pages were freed; it is recomputed with
        the same tokens), and the running count in pegainfer.preemptions."""
        span = self._live.get(request_id)
        if span is None:
            return
        count = self._preemptions.get(request_id, 0) + 1
        self._preemptions[request_id] = count
        span.add_event("preempted", {"pegainfer.choice": index, "pegainfer.preemptions": count},
                       timestamp=self._clock.now_ns())
        span.set_attribute("pegainfer.preemptions", count)

    def step_done(self) -> None:
        self._ended.clear()

    @property
    def live_count(self) -> int:
        return len(self._live)

    # ---- internals -------------------------------------------------------------------------------
    def _start(self, request: ObservedRequest) -> None:
        rid = request.request_id
        announced = self._announced.pop(rid, None)
        parsed = announced.parsed if announced else None
        received = request.received_at if request.received_at is not None else request.finished_at
        attributes = {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.request.model": (parsed.model if parsed and parsed.model else request.model),
            "gen_ai.request.max_tokens": request.command.max_tokens,
            "gen_ai.response.id": rid,
            "gen_ai.response.model": request.model,
            "gen_ai.usage.input_tokens": len(request.prompt_ids),
            "pegainfer.ignore_eos": request.command.ignore_eos,
            **self._engine.attributes(),
        }
        attributes.update(_sampling_attributes(request, parsed))
        parent = announced.parent if announced is not None and announced.parent is not None else Context()
        span = self._tracer.start_span(f"{OPERATION} {request.model}", context=parent, kind=SpanKind.SERVER,
                                       start_time=self._clock.ns(received), attributes=attributes)
        self._live[rid] = span
        self._links[rid] = Link(span.get_span_context(), MappingProxyType({"pegainfer.request_id": rid}))

    def _finish(self, request: ObservedRequest, linkable: bool) -> None:
        rid = request.request_id
        span = self._live.pop(rid, None)
        self._preemptions.pop(rid, None)
        link = self._links.pop(rid, None)
        if span is None:
            return
        ns = self._clock.ns
        end = ns(request.finished_at)
        reason = request.terminal_reason
        self._children(span, request)
        attributes: dict[str, Any] = {
            "gen_ai.usage.output_tokens": len(request.output_ids),
            "pegainfer.terminal_reason": reason.value,
            "pegainfer.active_set_size_max": request.active_set_size_max,
            "pegainfer.decode_batch_size_max": request.decode_batch_size_max,
            "pegainfer.pending_depth_at_admit": request.pending_depth_at_admit,
            "pegainfer.output_hash": output_hash(request.output_ids),
            **_durations(request),
        }
        if request.finish_reason is not None:
            attributes["gen_ai.response.finish_reasons"] = [request.finish_reason.value]
        if request.error:
            attributes["pegainfer.error"] = request.error
        if reason is TerminalReason.FAILED:
            attributes["error.type"] = "engine_failed"
        elif reason is TerminalReason.REJECTED:
            status, kind = _refusal(request.code)
            attributes["error.type"] = kind
            attributes["http.response.status_code"] = status
        span.set_attributes(attributes)
        if request.first_token_at is not None:
            ttft = {k: v for k, v in attributes.items() if k == "pegainfer.ttft_s"}
            span.add_event("first_token", ttft, timestamp=ns(request.first_token_at))
        span.add_event("terminal", {"pegainfer.terminal_reason": reason.value, "pegainfer.state": request.state.value,
                                    "gen_ai.usage.output_tokens": len(request.output_ids)}, timestamp=end)
        if reason in (TerminalReason.FAILED, TerminalReason.REJECTED):
            span.set_status(Status(StatusCode.ERROR, request.error or reason.value))
        span.end(end_time=max(end, span.start_time))
        if linkable and link is not None:  # the engine held it: its last step's record is still to come
            self._ended[rid] = link

    def _children(self, root: Span, request: ObservedRequest) -> None:
        """queue: PENDING -> ADMITTED; prefill: PREFILL -> first token; decode: first token -> end.
        A phase the request ended in is cut at its terminal time."""
        r, end = request, request.finished_at
        phases = []
        if r.pending_at is not None:
            phases.append(("queue", r.pending_at, r.admitted_at if r.admitted_at is not None else end))
        prefill_from = r.prefill_started_at if r.prefill_started_at is not None else r.admitted_at
        if prefill_from is not None and (r.prefill_started_at is not None or r.first_token_at is not None):
            phases.append(("prefill", prefill_from, r.first_token_at if r.first_token_at is not None else end))
        if r.first_token_at is not None:
            phases.append(("decode", r.first_token_at, end))
        parent = root.get_span_context()
        for name, start, stop in phases:
            start_ns, stop_ns = self._clock.ns(start), self._clock.ns(stop)
            self._tracing.end_child_span(name, parent, start_ns, max(start_ns, stop_ns),
                                         {"pegainfer.phase": name, "gen_ai.response.id": r.request_id})


def _sampling_attributes(request: ObservedRequest, parsed: AnnouncedRequest | None) -> dict[str, Any]:
    """The sampling request attributes (GenAI semantic conventions' names where they have one). The
    numbers come from the engine's parameters (defaults included); stop sequences, the choice count
    and best_of from the parsed API request, when the daemon announced one."""
    command = request.command
    p = command.sampling
    out: dict[str, Any] = {
        "gen_ai.request.temperature": float(p.temperature), "gen_ai.request.top_p": float(p.top_p),
        "gen_ai.request.presence_penalty": float(p.presence_penalty),
        "gen_ai.request.frequency_penalty": float(p.frequency_penalty),
        "pegainfer.request.min_p": float(p.min_p), "pegainfer.request.repetition_penalty": float(p.repetition_penalty),
    }
    if p.top_k > 0:
        out["gen_ai.request.top_k"] = p.top_k
    if p.seed is not None:
        out["gen_ai.request.seed"] = p.seed
    if p.logprobs is not None:
        out["pegainfer.request.logprobs"] = p.logprobs
    if command.stop_token_ids:
        out["pegainfer.request.stop_token_ids"] = list(command.stop_token_ids)
    if parsed is None:
        out["gen_ai.request.choice.count"] = command.n
        return out
    out["gen_ai.request.stream"] = parsed.stream
    out["gen_ai.request.choice.count"] = parsed.n
    if parsed.stop:
        out["gen_ai.request.stop_sequences"] = list(parsed.stop)
    if parsed.best_of is not None:
        out["pegainfer.request.best_of"] = parsed.best_of
    if parsed.echo:
        out["pegainfer.request.echo"] = True
    return out


def _durations(r: ObservedRequest) -> dict[str, float]:
    """The request's phase durations in seconds, for the phases it reached."""
    out = {}
    if r.first_token_at is not None and r.received_at is not None:
        out["pegainfer.ttft_s"] = r.first_token_at - r.received_at
    if r.admitted_at is not None and r.pending_at is not None:
        out["pegainfer.queue_s"] = r.admitted_at - r.pending_at
    prefill_from = r.prefill_started_at if r.prefill_started_at is not None else r.admitted_at
    if r.first_token_at is not None and prefill_from is not None:
        out["pegainfer.prefill_s"] = r.first_token_at - prefill_from
    if r.first_token_at is not None and r.finished_at is not None:
        out["pegainfer.decode_s"] = r.finished_at - r.first_token_at
    if r.received_at is not None and r.finished_at is not None:
        out["pegainfer.e2e_s"] = r.finished_at - r.received_at
    return out
