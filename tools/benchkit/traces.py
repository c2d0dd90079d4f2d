"""Joins a benchmark's requests with the server's trace records (pegainfer's --trace-file: JSONL,
one OTLP/JSON TracesData object per line): per concurrency level, how many of the client's
request ids have a terminal request span, which are missing, and what the server saw (largest
active set and decode batch). Reads the file, and the files the daemon rotated it into, with the
standard library only."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from tools.traceview.reader import whole_lines

ROOT_PREFIX = "text_completion"  # request root spans: `text_completion {model}`
MISSING_LISTED = 10
START_KEY = "_span_start_unix_ns"  # the root span's start, kept beside its attributes by request_spans


def _value(v: dict) -> Any:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def request_spans(path: Path) -> dict[str, dict[str, Any]]:
    """gen_ai.response.id -> attributes of its terminal request root span (one with a terminal reason)."""
    out: dict[str, dict[str, Any]] = {}
    for raw in whole_lines(path):  # the file and the files it was rotated into under load
        try:
            data = json.loads(raw)
        except ValueError:
            continue
        for rs in data.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    if not s.get("name", "").startswith(ROOT_PREFIX):
                        continue
                    attrs = {kv["key"]: _value(kv.get("value", {})) for kv in s.get("attributes", [])}
                    attrs[START_KEY] = int(s.get("startTimeUnixNano") or 0)  # when the server had the request
                    rid = attrs.get("gen_ai.response.id")
                    if rid and attrs.get("pegainfer.terminal_reason") is not None:
                        out[rid] = attrs
    return out


def arrival_lags(run: dict[str, Any], spans: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """How long a run's requests took from the client's send (the run's window start + the record's
    sent_ms, both on this host's wall clock) to the server's receipt (its request span's start):
    client and network time, and the server's own time before it reads the request. Median, p99 and
    largest in ms over the requests the trace holds; None when none can be placed."""
    start = (run.get("window_ns") or [None])[0]
    lags = []
    for rec in run.get("requests") or []:
        span = spans.get(rec.get("request_id") or "")
        if start is None or span is None or rec.get("sent_ms") is None or not span.get(START_KEY):
            continue
        lags.append((span[START_KEY] - start) / 1e6 - rec["sent_ms"])
    if not lags:
        return None
    lags.sort()
    return {"requests": len(lags), "median_ms": round(statistics.median(lags), 3),
            "p99_ms": round(lags[min(len(lags) - 1, int(0.99 * len(lags)))], 3), "max_ms": round(lags[-1], 3)}


def read_until_covered(path: Path, ids: set[str], wait_s: float) -> dict[str, dict[str, Any]]:
    """The server exports in batches (about half a second behind): re-read until every id is there
    or wait_s has passed."""
    deadline = time.monotonic() + wait_s
    while True:
        spans = request_spans(path)
        if ids <= spans.keys() or time.monotonic() >= deadline:
            return spans
        time.sleep(1.0)  # each read parses the whole file


def join_level(ids: list[str | None], spans: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One level's join. Coverage is over the requests the client learned an id for (header or chunk);
    requests that never got one (refused before any response) are counted apart as `without_id`."""
    known = [i for i in ids if i]
    found = [spans[i] for i in known if i in spans]
    missing = [i for i in known if i not in spans]

    def biggest(key: str) -> int | None:
        values = [a[key] for a in found if isinstance(a.get(key), (int, float))]
        return max(values) if values else None

    def median(key: str) -> float | None:
        values = [a[key] for a in found if isinstance(a.get(key), (int, float))]
        return statistics.median(values) if values else None

    reasons: dict[str, int] = {}
    for a in found:
        reasons[str(a["pegainfer.terminal_reason"])] = reasons.get(str(a["pegainfer.terminal_reason"]), 0) + 1
    return {
        "client_requests": len(ids),
        "client_ids": len(known),
        "traced": len(found),
        "without_id": len(ids) - len(known),
        "coverage": len(found) / len(known) if known else None,
        "missing": len(missing),
        "missing_ids": missing[:MISSING_LISTED],
        "active_set_size_max": biggest("pegainfer.active_set_size_max"),
        "decode_batch_size_max": biggest("pegainfer.decode_batch_size_max"),
        "server_queue_s_median": median("pegainfer.queue_s"),
        "server_ttft_s_median": median("pegainfer.ttft_s"),
        "terminal_reasons": reasons,
        "backend": next((a.get("pegainfer.backend") for a in found if a.get("pegainfer.backend")), None),
        "backend_maturity": next((a.get("pegainfer.backend_maturity") for a in found
                                  if a.get("pegainfer.backend_maturity")), None),
    }
