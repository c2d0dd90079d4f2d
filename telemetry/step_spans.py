"""Engine step spans: `engine_step {phase}` for every Nth step the GPU thread reports, timed from
the step's own wall-clock start and duration, with the batch's shape, its MoE routing and
exchange counters, and an OTel link to the request span of every request in the batch (so a
viewer can show which requests shared a decode step). Each step is a root span of its own trace:
it belongs to many requests, not to one."""
from __future__ import annotations

from opentelemetry.trace import Link

from pegainfer.engine.contract import StepRecord
from pegainfer.telemetry.engine_info import EngineInfo
from pegainfer.telemetry.tracing import Tracing


class StepSpans:
    def __init__(self, tracing: Tracing, engine: EngineInfo, every: int = 1) -> None:
        if every < 0:
            raise ValueError(f"step_trace_every must be >= 0, got {every}")
        self._tracing = tracing
        self._engine = engine
        self.every = every

    def wanted(self, record: StepRecord) -> bool:
        return self.every > 0 and record.step % self.every == 0

    def record(self, record: StepRecord, links: list[Link]) -> None:
        """links: to the request spans of the batch (RequestSpans.links). The attribute values are
        built as the tracer would store them (sequences as tuples): the span skips its checks."""
        r = record
        start = r.started_ns
        end = start + max(0, round(r.cpu_s * 1e9))
        attributes = {
            "pegainfer.step.index": r.step,
            "pegainfer.step.phase": r.phase,
            "pegainfer.step.rows": r.rows,
            "pegainfer.step.decode_rows": r.decode_rows,
            "pegainfer.step.prefill_tokens": r.prefill_tokens,
            "pegainfer.step.positions_max": r.positions_max,
            "pegainfer.step.request_ids": tuple(r.request_ids),
            "pegainfer.step.routes_per_rank": tuple(r.routes_per_rank),
            "pegainfer.step.routes_per_expert": tuple(r.routes_per_expert),
            "pegainfer.step.collective_calls": r.collective_calls,
            "pegainfer.step.collective_bytes": r.collective_bytes,
            "pegainfer.step.exchange_s": r.exchange_s,
            "pegainfer.step.cpu_s": r.cpu_s,
            "pegainfer.step.kv_slots_used": r.kv_slots_used,
            "pegainfer.step.overlapped": r.overlapped,
            "pegainfer.step.dropped_rows": r.dropped_rows,
            **self._engine.attributes(),
        }
        if r.gpu_s is not None:
            attributes["pegainfer.step.gpu_s"] = r.gpu_s
        self._tracing.end_root_span(f"engine_step {r.phase}", start, end, attributes, links)
