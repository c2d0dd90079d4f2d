"""The strict rules over the server as a whole: the scheduler evidence a scenario requires (active
set at its cap, a pending queue, multi-row decode batches) from the trace and from /ready, the
clean follow-up reproducing the baseline output, and the idle baseline (no leaked slot)."""
from __future__ import annotations

from tools.reliakit import observation as o
from tools.reliakit.check import Check, skipped, verdict
from tools.reliakit.observation import RequestObservation
from tools.reliakit.ready_probe import idle_problems, idle_summary
from tools.reliakit.request_checks import span_of
from tools.reliakit.server_spans import SpanIndex

EVIDENCE = ("active_set", "pending_queue", "decode_batch")


def maxima(observations: list[RequestObservation], spans: SpanIndex | None, probe: dict) -> dict:
    """Largest active set, pending depth and decode batch, as the trace and as /ready saw them."""
    def biggest(attr: str) -> int | None:
        values = [s.attributes.get(attr) for x in observations if (s := span_of(x, spans)) is not None]
        values = [v for v in values if isinstance(v, (int, float))]
        return max(values) if values else None

    queued = None
    if spans is not None:
        queued = sum(1 for x in observations if (s := span_of(x, spans)) is not None
                     and (s.attributes.get("pegainfer.queue_s") or 0) > 0.001)
    return {
        "active_set": {"trace": biggest("pegainfer.active_set_size_max"), "ready": probe.get("running_max")},
        "pending_queue": {"trace": biggest("pegainfer.pending_depth_at_admit"), "ready": probe.get("waiting_max"),
                          "trace_requests_queued": queued},
        "decode_batch": {"trace": biggest("pegainfer.decode_batch_size_max"), "ready": probe.get("decode_batch_max")},
    }


def evidence(kind: str, seen: dict, *, at_least: int, at_most: int | None = None) -> Check:
    """`kind` evidence passes when the trace or /ready shows at least `at_least` (and neither shows
    more than `at_most`, the configured cap)."""
    name = f"{kind}_evidence"
    values = {k: v for k, v in seen.items() if k in ("trace", "ready") and v is not None}
    problems = []
    if not values or max(values.values()) < at_least:
        problems.append(f"{kind}: trace {seen.get('trace')}, /ready {seen.get('ready')}; needed at least {at_least}")
    if at_most is not None and values and max(values.values()) > at_most:
        problems.append(f"{kind}: {max(values.values())} exceeds the configured cap {at_most}")
    shown = ", ".join(f"{k} {v}" for k, v in values.items())
    return verdict(name, problems, f"{kind} reached {max(values.values()) if values else '-'} ({shown})",
                   {"seen": seen, "at_least": at_least, "at_most": at_most})


def follow_up(baseline: RequestObservation | None, obs: RequestObservation | None, spans: SpanIndex | None) -> Check:
    if obs is None:
        return skipped("follow_up", "no server to send it to")
    problems = []
    e = obs.resolved()
    if obs.outcome != o.COMPLETED or obs.tokens != e.tokens:
        problems.append(f"follow-up {obs.outcome} with {obs.tokens} tokens ({obs.note or obs.error or ''})")
    if baseline is None or baseline.outcome != o.COMPLETED:
        problems.append("no baseline output to compare with")
    elif obs.outcome == o.COMPLETED and obs.text_sha256 != baseline.text_sha256:
        problems.append(f"streamed text hash {obs.text_sha256[:12]} differs from the baseline's "
                        f"{baseline.text_sha256[:12]}")
    server = None
    if spans is not None and baseline is not None:
        a, b = span_of(obs, spans), span_of(baseline, spans)
        mine = a.attributes.get("pegainfer.output_hash") if a else None
        base = b.attributes.get("pegainfer.output_hash") if b else None
        server = {"output_hash": mine, "baseline_output_hash": base}
        if mine is None or base is None:
            problems.append(f"server output hash missing (follow-up {mine}, baseline {base})")
        elif mine != base:
            problems.append(f"server output hash {mine[:12]} differs from the baseline's {base[:12]}")
    data = {"text_sha256": obs.text_sha256, "baseline_text_sha256": baseline.text_sha256 if baseline else None,
            "server": server}
    return verdict("follow_up", problems, "the clean follow-up reproduced the baseline output", data)


def idle(name: str, status: int | None, body: dict) -> Check:
    """The leaked-slot rule: after the traffic the server is back at its idle baseline."""
    return verdict(name, idle_problems(status, body), "running 0, waiting 0, every KV slot and page free",
                   {"ready": idle_summary(status, body)})
