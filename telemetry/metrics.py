"""Prometheus metrics for /metrics, in a CollectorRegistry this instance owns (never the process
default). Names follow vLLM's (`vllm:` becomes `pegainfer:`): request gauges from the scheduler's
snapshot at scrape time, latency histograms from request timestamps and engine steps, token and
terminal counters, engine step durations, KV slot use (from step records and the GPU thread's
published snapshot, never its objects), dropped spans and a backend info gauge."""
from __future__ import annotations

import bisect
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from pegainfer.engine.contract import ENGINE_HELD, EngineSnapshot, RequestState, StepRecord, TerminalReason
from pegainfer.telemetry.observed import ObservedRequest

P = "pegainfer:"
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
               0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.0, 10.0)


class _StepHistogram(Histogram):
    """A histogram that takes n equal observations at once: an engine step gives every request in
    its batch the same inter-token latency (the previous step's end to this one's), so a step's
    observations are a few distinct values, each many times. Rendered exactly as a Histogram."""

    def observe_n(self, amount: float, n: int) -> None:
        self._raise_if_not_observable()
        self._sum.inc(amount * n)
        self._buckets[bisect.bisect_left(self._upper_bounds, amount)].inc(n)  # the first bound >= amount


class _DroppedSpans(Collector):
    """A counter whose value lives in the span processors: refreshed just before each scrape."""

    def __init__(self) -> None:
        self.by_exporter: dict[str, int] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(P + "dropped_spans", "Spans dropped because an exporter's queue was full",
                                     labels=["exporter"])
        for name, value in sorted(self.by_exporter.items()):
            family.add_metric([name], value)
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.running = Gauge(P + "num_requests_running", "Requests held by the engine (admitted, prefill, decode)",
                             registry=r)
        self.waiting = Gauge(P + "num_requests_waiting", "Requests queued for a KV slot", registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Time from receipt to the first output token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = _StepHistogram(P + "inter_token_latency_seconds",
                             "Time between consecutive engine steps that produced a token for the same request",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Time from receipt to the terminal state, for "
                             "requests the scheduler queued", buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram(P + "request_queue_time_seconds", "Time from PENDING to ADMITTED",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Output tokens generated (counted when a request "
                                         "ends)", registry=r)
        self.terminal = Counter(P + "requests_terminal", "Requests by terminal reason", ["terminal_reason"],
                                registry=r)
        for reason in TerminalReason:
            self.terminal.labels(reason.value)
        self.kv_used = Gauge(P + "kv_slots_used", "KV-cache slots in use", registry=r)
        self.kv_total = Gauge(P + "kv_slots_total", "KV-cache slots in all", registry=r)
        self.step_duration = Histogram(P + "engine_step_duration_seconds", "Wall time of one engine step",
                                       ["phase"], buckets=STEP_BUCKETS, registry=r)
        self.telemetry_errors = Counter(P + "telemetry_errors", "Exceptions inside telemetry (logged and swallowed)",
                                        registry=r)
        self.engine_deaths = Counter(P + "engine_deaths", "Times the GPU thread or an expert rank died", registry=r)
        self.backend_info = Gauge(P + "backend_info", "The serving backend (value 1)",
                                  ["backend", "maturity", "model", "batch_invariant"], registry=r)
        self._dropped = _DroppedSpans()
        r.register(self._dropped)
        self._last_token_ns: dict[str, int] = {}  # request id -> end of the last step that gave it a token
        self._ended: set[str] = set()

    def set_engine(self, backend: str, maturity: str, model: str, *, batch_invariant: bool | None = None) -> None:
        self.backend_info.clear()
        flag = "unknown" if batch_invariant is None else str(batch_invariant).lower()
        self.backend_info.labels(backend, maturity, model, flag).set(1)

    def on_transition(self, request: ObservedRequest, old: RequestState, new: RequestState) -> None:
        r = request
        if new is RequestState.ADMITTED and r.pending_at is not None:
            self.queue_time.observe(r.admitted_at - r.pending_at)
        elif new is RequestState.DECODE:
            self.prompt_tokens.inc(len(r.prompt_ids))
            if r.received_at is not None:
                self.ttft.observe(r.first_token_at - r.received_at)
        elif new.is_terminal:
            self.terminal.labels(r.terminal_reason.value).inc()
            self.generation_tokens.inc(len(r.output_ids))
            if r.pending_at is not None and r.received_at is not None:
                self.e2e.observe(r.finished_at - r.received_at)
            if old in ENGINE_HELD:  # only a request the engine held can still be in a step's events
                self._ended.add(r.request_id)

    def on_front_rejection(self) -> None:
        self.terminal.labels(TerminalReason.REJECTED.value).inc()

    def on_step(self, record: StepRecord) -> None:
        self.step_duration.labels(record.phase).observe(record.cpu_s)
        self.kv_used.set(record.kv_slots_used)
        end_ns = record.started_ns + round(record.cpu_s * 1e9)
        last = self._last_token_ns
        since: dict[int, int] = {}  # the end of a request's previous step -> how many requests
        for rid in record.request_ids:
            before = last.get(rid)
            if before is not None:
                since[before] = since.get(before, 0) + 1
            last[rid] = end_ns
        for before, n in since.items():
            self.itl.observe_n(max(0, end_ns - before) / 1e9, n)
        for rid in self._ended:  # the step events of a request's last step come before its end
            last.pop(rid, None)
        self._ended.clear()

    def on_engine_died(self) -> None:
        self.engine_deaths.inc()

    def render(self, scheduler: dict[str, int | bool] | None, engine: EngineSnapshot | None,
               dropped: dict[str, int]) -> tuple[bytes, str]:
        """Set the scrape-time gauges (the scheduler's queue sizes from its snapshot, KV slots from
        the engine's last published snapshot) and render the text format."""
        if scheduler is not None:
            self.running.set(scheduler["running"])
            self.waiting.set(scheduler["waiting"])
        if engine is not None:
            self.kv_total.set(engine.kv_slots_total)
            self.kv_used.set(engine.kv_slots_used)
        self._dropped.by_exporter = dict(dropped)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
