"""The trace as Chrome trace-event JSON ({"traceEvents": [...]}) for ui.perfetto.dev and
chrome://tracing: one process, an engine track (tid 1) with a complete ("X") event per step, and
one track per request (tid 2, 3, ...) with the request, its queue/prefill/decode phases nested
inside it, and first-token and terminal instant events. A flow arrow runs from each request to
every engine step it was in: a flow start ("s") on the request's track inside its slice and a flow
end ("f", binding to the enclosing slice) inside the step's slice, one id per pair, so that
selecting a request in the viewer lists and follows the steps it shared. Times are microseconds
from the first span, so that large epoch values keep their precision in the viewer's doubles."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from tools.traceview.reader import PHASES, RequestView, StepView

PID = 1
ENGINE_TID = 1
FLOW = "request to engine step"


def _args(attributes: dict) -> dict:
    return {k: v for k, v in attributes.items() if not isinstance(v, list) or len(v) <= 64}


def _flows(r: RequestView, tid: int, steps: list[StepView], us: Callable[[int], float],
           ids: Iterator[int]) -> list[dict]:
    """One flow per step the request was in: from the request's slice (at the step's middle, held
    inside the request's own span) to the middle of the step's slice on the engine track."""
    out = []
    lo, hi = us(r.start_ns), us(r.end_ns)
    for s in steps:
        mid = (us(s.start_ns) + us(s.end_ns)) / 2
        fid = next(ids)
        args = {"request_id": r.request_id, "step": s.index}
        out += [{"ph": "s", "id": fid, "pid": PID, "tid": tid, "ts": min(max(mid, lo), hi), "name": FLOW,
                 "cat": "flow", "args": args},
                {"ph": "f", "bp": "e", "id": fid, "pid": PID, "tid": ENGINE_TID, "ts": mid, "name": FLOW,
                 "cat": "flow", "args": args}]
    return out


def render(requests: list[RequestView], steps: list[StepView]) -> dict:
    t0 = min([r.start_ns for r in requests] + [s.start_ns for s in steps], default=0)

    def us(ns: int) -> float:
        return (ns - t0) / 1e3

    events: list[dict] = [
        {"ph": "M", "pid": PID, "tid": 0, "name": "process_name", "args": {"name": "pegainfer"}},
        {"ph": "M", "pid": PID, "tid": ENGINE_TID, "name": "thread_name", "args": {"name": "engine steps"}},
        {"ph": "M", "pid": PID, "tid": ENGINE_TID, "name": "thread_sort_index", "args": {"sort_index": 0}},
    ]
    by_index = {s.index: s for s in steps}
    flow_ids = itertools.count(1)  # one id per (request, step) pair, unique in the file
    for s in steps:
        events.append({"ph": "X", "pid": PID, "tid": ENGINE_TID, "name": f"step {s.index} {s.phase}",
                       "cat": "engine_step", "ts": us(s.start_ns), "dur": max(0.0, us(s.end_ns) - us(s.start_ns)),
                       "args": {"request_ids": s.request_ids, **_args(s.attributes)}})
    for n, r in enumerate(requests):
        tid = ENGINE_TID + 1 + n
        events += [
            {"ph": "M", "pid": PID, "tid": tid, "name": "thread_name",
             "args": {"name": f"{r.request_id} [{r.terminal_reason}]"}},
            {"ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}},
            {"ph": "X", "pid": PID, "tid": tid, "name": f"request {r.terminal_reason}", "cat": "request",
             "ts": us(r.start_ns), "dur": max(0.0, us(r.end_ns) - us(r.start_ns)),
             "args": {"request_id": r.request_id, "trace_id": r.trace_id, "span_id": r.span_id,
                      "steps": len(r.steps), **_args(r.attributes)}},
        ]
        for name in PHASES:
            if name in r.phases:
                start, end = r.phases[name]
                events.append({"ph": "X", "pid": PID, "tid": tid, "name": name, "cat": "phase", "ts": us(start),
                               "dur": max(0.0, us(end) - us(start)), "args": {"request_id": r.request_id}})
        if r.first_token_ns is not None:
            events.append({"ph": "i", "s": "t", "pid": PID, "tid": tid, "name": "first_token", "cat": "event",
                           "ts": us(r.first_token_ns)})
        events.append({"ph": "i", "s": "t", "pid": PID, "tid": tid, "name": f"terminal {r.terminal_reason}",
                       "cat": "event", "ts": us(r.end_ns)})
        events += _flows(r, tid, [by_index[i] for i in r.steps if i in by_index], us, flow_ids)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "pegainfer", "t0_unix_ns": str(t0)}}
