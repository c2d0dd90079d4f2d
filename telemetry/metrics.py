"""Prometheus metrics for /metrics, in a CollectorRegistry this instance owns (never the process
default). Every series carries `model_name` (the served model's name, as vLLM's do: added to every
sample by prom_collectors.WithModelName). Where vLLM exports a family of the same meaning, the name
is vLLM's with `vllm:` become `pegainfer:`, with vLLM's type, labels and bucket bounds
(telemetry/buckets.py); docs/metrics.md is the map. Request gauges come from the scheduler's
snapshot at scrape time, KV use from the GPU thread's published snapshot (never its objects),
token counters from engine step records as the steps happen, request histograms from each
request's timestamps when it ends."""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest

from pegainfer.engine.contract import ENGINE_HELD, EngineSnapshot, RequestState, StepRecord, TerminalReason
from pegainfer.telemetry import buckets
from pegainfer.telemetry.observed import ObservedRequest
from pegainfer.telemetry.prom_collectors import BatchedHistogram, DroppedSpans, Tally, WithModelName

P = "pegainfer:"
DEFAULT_MAX_MODEL_LEN = 4096  # token-count buckets before the engine says its context limit
UNKNOWN_MODEL = "unknown"

# vLLM's finished_reason values: FINISHED's own reason, "abort" for a request the server or the
# client ended, "error" for a failed one. A REJECTED request never reached the engine: not counted.
FINISHED_REASONS = ("stop", "length", "abort", "error")
_ABORTED = {RequestState.CANCELLED: "abort", RequestState.DISCONNECTED: "abort", RequestState.FAILED: "error"}

# Rejections: "front" = refused by the HTTP layer before the scheduler saw the request (auth,
# media type, body, JSON, validation, unknown model); "scheduler" = refused by the scheduler or
# by the context check on the tokenised prompt (queue full, not ready, draining, too long).
FRONT, SCHEDULER = "front", "scheduler"
INVALID = "invalid_request"  # the code of a 400 that names no more specific one


class Metrics:
    def __init__(self, model_name: str = UNKNOWN_MODEL) -> None:
        self.model_name = model_name
        self.inner = CollectorRegistry(auto_describe=True)  # the families, without model_name
        self.registry = CollectorRegistry(auto_describe=False)  # what /metrics renders
        self.registry.register(WithModelName(self.inner, lambda: self.model_name))
        r = self.inner

        def tally(name: str, doc: str, labels=(), always=()) -> Tally:
            t = Tally(P + name, doc, labels, always)
            r.register(t)
            return t

        def histogram(name: str, doc: str, bounds, labels=()) -> Histogram:
            return Histogram(P + name, doc, list(labels), buckets=bounds, registry=r)

        # ---- vLLM's families -------------------------------------------------------------------------
        self.running = Gauge(P + "num_requests_running", "Requests held by the engine (admitted, prefill, decode)",
                             registry=r)
        self.waiting = Gauge(P + "num_requests_waiting", "Requests queued for a KV slot", registry=r)
        self.kv_usage = Gauge(P + "kv_cache_usage_perc", "KV-cache usage, 1 = 100%: KV pages referenced by a "
                              "sequence / KV pages (cached prefix pages nobody references count as free)", registry=r)
        self.prompt_tokens = tally("prompt_tokens", "Prompt tokens prefilled, counted per engine step")
        self.generation_tokens = tally("generation_tokens", "Output tokens generated, counted per engine step "
                                       "as they are produced")
        self.preemptions = tally("num_preemptions", "Sequences preempted when the KV pages ran out (each is "
                                 "recomputed later with the same tokens)")
        self.prefix_queries = tally("prefix_cache_queries", "Prompt tokens looked up in the prefix cache")
        self.prefix_hits = tally("prefix_cache_hits", "Prompt tokens found in the prefix cache (not recomputed)")
        self._prefix_seen = (0, 0)  # the engine snapshot's (queries, hits) counted so far
        self.success = tally("request_success", "Requests the scheduler accepted, by how they finished",
                             ["finished_reason"], [(f,) for f in FINISHED_REASONS])
        self.ttft = histogram("time_to_first_token_seconds", "Time from receipt to the first output token",
                              buckets.TTFT)
        self.itl = BatchedHistogram(P + "inter_token_latency_seconds", "Time between consecutive engine steps that "
                                    "produced a token for the same request", buckets.ITL)
        r.register(self.itl)
        self.tpot = histogram("request_time_per_output_token_seconds", "A request's decode time over its output "
                              "tokens after the first", buckets.ITL)
        self.e2e = histogram("e2e_request_latency_seconds", "Time from receipt to the end, for requests the "
                             "scheduler accepted", buckets.REQUEST_LATENCY)
        self.queue_time = histogram("request_queue_time_seconds", "Time from PENDING to ADMITTED",
                                    buckets.REQUEST_LATENCY)
        self.inference_time = histogram("request_inference_time_seconds", "Time from ADMITTED to the end",
                                        buckets.REQUEST_LATENCY)
        self.prefill_time = histogram("request_prefill_time_seconds", "Time from the prefill's start to the "
                                      "first token", buckets.REQUEST_LATENCY)
        self.decode_time = histogram("request_decode_time_seconds", "Time from the first token to the end",
                                     buckets.REQUEST_LATENCY)
        self.iteration_tokens = histogram("iteration_tokens_total", "Tokens per engine step (prompt + generated)",
                                          buckets.VLLM_ITERATION_TOKENS)
        self.params_n = histogram("request_params_n", "The n request parameter", buckets.VLLM_PARAMS_N)
        self._token_histograms: tuple[Histogram, Histogram, Histogram] | None = None  # at set_engine

        # ---- pegainfer's own -------------------------------------------------------------------------
        self.kv_used = Gauge(P + "kv_slots_used", "KV-cache slots in use", registry=r)
        self.kv_total = Gauge(P + "kv_slots_total", "KV-cache slots in all", registry=r)
        self.terminal = tally("requests_terminal", "Requests by terminal reason (front rejections included)",
                              ["terminal_reason"], [(t.value,) for t in TerminalReason])
        self.rejected = tally("requests_rejected", "Rejected requests by stage (front: before the scheduler; "
                              "scheduler: by it) and error code", ["stage", "code"])
        self.step_duration = histogram("engine_step_duration_seconds", "Wall time of one engine step",
                                       buckets.STEP, ["phase"])
        self.telemetry_errors = tally("telemetry_errors", "Exceptions inside telemetry (logged and swallowed)")
        self.engine_deaths = tally("engine_deaths", "Times the GPU thread or an expert rank died")
        self.backend_info = Gauge(P + "backend_info", "The serving backend (value 1)",
                                  ["backend", "maturity", "model", "batch_invariant"], registry=r)
        self._dropped = DroppedSpans(P + "dropped_spans")
        r.register(self._dropped)
        self._last_token_ns: dict[str, int] = {}  # request id -> end of the last step that gave it a token
        self._ended: set[str] = set()

    def set_engine(self, backend: str, maturity: str, model: str, *, batch_invariant: bool | None = None,
                   max_model_len: int | None = None) -> None:
        self.backend_info.clear()
        flag = "unknown" if batch_invariant is None else str(batch_invariant).lower()
        self.backend_info.labels(backend, maturity, model, flag).set(1)
        if max_model_len is not None:
            self.token_histograms(max_model_len)

    def token_histograms(self, max_model_len: int | None = None) -> tuple[Histogram, Histogram, Histogram]:
        """(prompt tokens, generation tokens, max_tokens) per request, with vLLM's 1-2-5 bounds up to
        the context limit: made once, by the first caller (set_engine, or the first request to end)."""
        if self._token_histograms is None:
            bounds = buckets.one_two_five(max_model_len or DEFAULT_MAX_MODEL_LEN)
            self._token_histograms = (
                Histogram(P + "request_prompt_tokens", "Prompt tokens per request", buckets=bounds,
                          registry=self.inner),
                Histogram(P + "request_generation_tokens", "Output tokens per request (every choice)",
                          buckets=bounds, registry=self.inner),
                Histogram(P + "request_params_max_tokens", "The max_tokens request parameter", buckets=bounds,
                          registry=self.inner))
        return self._token_histograms

    def on_transition(self, request: ObservedRequest, old: RequestState, new: RequestState) -> None:
        r = request
        if new is RequestState.ADMITTED and r.pending_at is not None:
            self.queue_time.observe(r.admitted_at - r.pending_at)
        elif new is RequestState.DECODE:
            if r.received_at is not None:
                self.ttft.observe(r.first_token_at - r.received_at)
        elif new.is_terminal:
            self.terminal.inc(r.terminal_reason.value)
            if new is RequestState.REJECTED:
                self.rejected.inc(SCHEDULER, r.code or INVALID)
            elif r.pending_at is not None:  # the scheduler accepted it
                self._ended_request(r)
            if old in ENGINE_HELD:  # only a request the engine held can still be in a step's events
                self._ended.add(r.request_id)

    def _ended_request(self, r: ObservedRequest) -> None:
        """vLLM's per-request families, for a request the scheduler accepted, at its end."""
        reason = r.finish_reason.value if r.state is RequestState.FINISHED else _ABORTED[r.state]
        self.success.inc(reason)
        end = r.finished_at
        if r.received_at is not None:
            self.e2e.observe(end - r.received_at)
        started = r.prefill_started_at if r.prefill_started_at is not None else r.admitted_at
        if started is not None:
            self.inference_time.observe(end - started)
            self.prefill_time.observe((r.first_token_at if r.first_token_at is not None else end) - started)
        decode = end - r.first_token_at if r.first_token_at is not None else 0.0
        self.decode_time.observe(decode)
        if len(r.output_ids) > 1:
            self.tpot.observe(decode / (len(r.output_ids) - 1))
        prompt, generated, max_tokens = self.token_histograms()
        prompt.observe(len(r.prompt_ids))
        generated.observe(len(r.output_ids))
        max_tokens.observe(r.command.max_tokens)
        self.params_n.observe(r.command.n)

    def on_front_rejection(self, code: str | None = None) -> None:
        self.terminal.inc(TerminalReason.REJECTED.value)
        self.rejected.inc(FRONT, code or INVALID)

    def rejections(self) -> dict[str, int]:
        """Rejected requests by stage: what /ready reports beside requests_rejected_total."""
        return {FRONT: self.rejected.total(stage=FRONT), SCHEDULER: self.rejected.total(stage=SCHEDULER)}

    def on_step(self, record: StepRecord) -> None:
        self.step_duration.labels(record.phase).observe(record.cpu_s)
        self.kv_used.set(record.kv_slots_used)
        self.prompt_tokens.inc(n=record.prefill_tokens)
        self.generation_tokens.inc(n=record.draws)
        self.iteration_tokens.observe(record.prefill_tokens + record.draws)
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
            self.kv_usage.set(kv_usage(engine))
            q, h = engine.prefix_cache_queries, engine.prefix_cache_hits
            seen_q, seen_h = self._prefix_seen
            if q >= seen_q and h >= seen_h:  # a new engine starts from zero: nothing to add then
                self.prefix_queries.inc(n=q - seen_q)
                self.prefix_hits.inc(n=h - seen_h)
            self._prefix_seen = (q, h)
        self._dropped.by_exporter = dict(dropped)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def families(self) -> Iterator[str]:
        """The names of the families this instance renders (docs and tests compare them)."""
        for family in self.registry.collect():
            yield family.name


def kv_usage(engine: EngineSnapshot) -> float:
    """KV pages in use / KV pages (vLLM's kv_cache_usage_perc, a fraction despite the name); a
    snapshot without pages: slots in use / slots."""
    if engine.kv_pages_total:
        return engine.kv_pages_used / engine.kv_pages_total
    return engine.kv_slots_used / engine.kv_slots_total if engine.kv_slots_total else 0.0

