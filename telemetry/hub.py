"""The telemetry hub the daemon wires in: it observes every lifecycle transition (it is the
scheduler's LifecycleObserver, seeing requests through telemetry.observed) and every engine step,
and fans them out to request spans, engine step spans and Prometheus metrics. Everything here runs
on the event loop and only records: spans are exported on the batch processors' worker threads, so
nothing here blocks on I/O. The HTTP routes that serve what it keeps (/metrics, /debug/traces) are
the daemon's; engine state reaches it only as the contract's step records and snapshots.

A telemetry bug must not fail a request: the observer callbacks run inside the scheduler's moves,
so an exception there is logged (the first few times), counted in
pegainfer:telemetry_errors_total, and swallowed."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from pegainfer.engine.contract import EngineSnapshot, RequestState, StepRecord
from pegainfer.telemetry.clock import EpochClock
from pegainfer.telemetry.engine_info import EngineInfo
from pegainfer.telemetry.metrics import UNKNOWN_MODEL, Metrics
from pegainfer.telemetry.observed import AnnouncedRequest, ObservedRequest
from pegainfer.telemetry.request_spans import RequestSpans
from pegainfer.telemetry.step_spans import StepSpans
from pegainfer.telemetry.tracing import Tracing

log = logging.getLogger("pegainfer.telemetry")
LOGGED_ERRORS = 10  # tracebacks logged before the rest are only counted


class Telemetry:
    def __init__(self, tracing: Tracing | None = None, *, step_trace_every: int = 1,
                 clock: EpochClock | None = None, model_name: str = UNKNOWN_MODEL) -> None:
        """`tracing` defaults to a pipeline with no exporter (spans are made, then dropped);
        `model_name` is the served name every metric series carries (set_model_name changes it)."""
        self.tracing = tracing if tracing is not None else Tracing()
        self.engine = EngineInfo()
        self.clock = clock if clock is not None else EpochClock()
        self.metrics = Metrics(model_name)
        self.requests = RequestSpans(self.tracing, self.clock, self.engine)
        self.steps = StepSpans(self.tracing, self.engine, step_trace_every)
        self.errors = 0

    @contextlib.contextmanager
    def _guard(self, where: str) -> Iterator[None]:
        try:
            yield
        except Exception:  # noqa: BLE001 - see the module docstring
            self.errors += 1
            self.metrics.telemetry_errors.inc()
            if self.errors <= LOGGED_ERRORS:
                log.exception("telemetry: %s failed (error %d)", where, self.errors)

    def set_model_name(self, name: str) -> None:
        """The served model name: the `model_name` label of every metric series (vLLM's)."""
        self.metrics.model_name = name

    def set_engine(self, backend: str, maturity: str, model: str, *, batch_invariant: bool | None = None,
                   max_model_len: int | None = None) -> None:
        self.engine.backend, self.engine.maturity, self.engine.model = backend, maturity, model
        self.engine.batch_invariant = batch_invariant
        self.metrics.set_engine(backend, maturity, model, batch_invariant=batch_invariant,
                                max_model_len=max_model_len)

    # ---- LifecycleObserver ------------------------------------------------------------------------
    def on_transition(self, request: ObservedRequest, old: RequestState, new: RequestState) -> None:
        with self._guard("on_transition"):
            self.requests.on_transition(request, old, new)
        with self._guard("on_transition metrics"):
            self.metrics.on_transition(request, old, new)

    # ---- StepObserver -----------------------------------------------------------------------------
    def on_step(self, record: StepRecord) -> None:
        with self._guard("on_step"):
            if self.steps.wanted(record):
                self.steps.record(record, self.requests.links(record.request_ids))
        with self._guard("on_step metrics"):
            self.metrics.on_step(record)
        self.requests.step_done()

    def on_preempted(self, request_id: str, index: int) -> None:
        """One of the request's sequences lost its KV pages, to be recomputed: an event on its span."""
        with self._guard("on_preempted"):
            self.requests.preempted(request_id, index)
        with self._guard("on_preempted metrics"):
            self.metrics.preemptions.inc()

    def on_engine_died(self, message: str) -> None:
        with self._guard("on_engine_died"):
            self.metrics.on_engine_died()

    # ---- the HTTP side ----------------------------------------------------------------------------
    def on_front_rejection(self, status: int, message: str, headers, code: str | None = None) -> None:
        """A request refused before it reached the scheduler (bad JSON, auth, validation); `code` is
        its error code (None: a plain 400, counted as invalid_request)."""
        with self._guard("on_front_rejection"):
            self.requests.front_rejection(status, message, self.tracing.extract(headers))
        with self._guard("on_front_rejection metrics"):
            self.metrics.on_front_rejection(code)

    def rejections(self) -> dict[str, int]:
        """Rejected requests by stage ("front", "scheduler"): the same counts as
        pegainfer:requests_rejected_total{stage}, for /ready."""
        return self.metrics.rejections()

    def token_totals(self) -> tuple[int, int]:
        """(prompt tokens prefilled, tokens generated) so far: the counters /metrics renders."""
        m = self.metrics
        return m.prompt_tokens.total(), m.generation_tokens.total()

    def on_request_start(self, request_id: str, parsed: AnnouncedRequest, headers) -> None:
        """The parsed OpenAI request and the HTTP headers (for an incoming traceparent), before the
        request is submitted or rejected."""
        with self._guard("on_request_start"):
            self.requests.announce(request_id, parsed, self.tracing.extract(headers))

    def render_metrics(self, scheduler: dict[str, int | bool] | None = None,
                       engine: EngineSnapshot | None = None) -> tuple[bytes, str]:
        """The text format: `scheduler` is the scheduler's snapshot and `engine` the GPU thread's
        last published one (None: not known yet)."""
        return self.metrics.render(scheduler, engine, self.tracing.dropped())

    def shutdown(self) -> None:
        """Flush every exporter (the trace file included) and close them; safe to call twice."""
        if self.requests.live_count:
            log.warning("telemetry shutdown with %d requests still open", self.requests.live_count)
        self.tracing.shutdown()
