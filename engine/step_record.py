"""The contract's StepRecord of one step, from what the batcher planned (engine/step_plan.py), what
the runner measured (its StepResult: device time, the EP backend's counters) and what the batcher
made of it (engine.batcher.StepOutcome: whom it served, its draws, the rows dropped)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pegainfer.engine.contract import StepRecord
from pegainfer.engine.step_plan import StepPlan, StepResult

if TYPE_CHECKING:
    from pegainfer.engine.batcher import StepOutcome


def step_record(plan: StepPlan, result: StepResult, outcome: StepOutcome, *, step: int, started_ns: int,
                cpu_s: float, kv_slots_used: int) -> StepRecord:
    """started_ns: wall clock at the step's start; cpu_s: its wall time on the GPU thread (a launched
    step: from its launch to its read-back); kv_slots_used: after the step's sequences moved on."""
    c = result.counters
    prefill = plan.prefill_tokens
    return StepRecord(
        step=step, phase="decode" if prefill == 0 else ("prefill" if plan.decode_rows == 0 else "mixed"),
        request_ids=list(dict.fromkeys([s.request_id for s in outcome.served])),
        rows=len(plan.rows), decode_rows=plan.decode_rows, prefill_tokens=prefill, positions_max=plan.positions_max,
        started_ns=started_ns, cpu_s=cpu_s, gpu_s=result.gpu_s,
        routes_per_rank=c.routes_per_rank if c else [], routes_per_expert=c.routes_per_expert if c else [],
        collective_calls=c.collective_calls if c else 0,
        collective_bytes=(c.bytes_sent + c.bytes_received) if c else 0, exchange_s=c.exchange_s if c else 0.0,
        kv_slots_used=kv_slots_used, draws=outcome.draws, sampled=result.sampled,
        overlapped=plan.feed is not None, dropped_rows=outcome.dropped,
    )
