"""The strict rules over requests: every request has exactly one terminal request span (a refused
one a `rejected` span with its HTTP status), spans carry the fields the artifact relies on, each
request ended with the terminal reason and the client outcome it expected, no request timed out
unexplained, and one request kind always gives one output (client text hash and server output
hash). Pure functions of observations and the span index, so tests can feed them crafted input."""
from __future__ import annotations

import re

from tools.reliakit import observation as o
from tools.reliakit.check import Check, skipped, verdict
from tools.reliakit.observation import RequestObservation
from tools.reliakit.server_spans import RootSpan, SpanIndex

NO_TRACE = "no trace-record file to read (give --trace-file with --url)"
HEX64 = re.compile(r"^[0-9a-f]{64}$")
ALWAYS = ("gen_ai.operation.name", "pegainfer.terminal_reason", "pegainfer.backend", "pegainfer.backend_maturity")
ACCEPTED = ("gen_ai.response.id", "pegainfer.output_hash", "gen_ai.usage.output_tokens",
            "pegainfer.active_set_size_max", "pegainfer.decode_batch_size_max", "pegainfer.pending_depth_at_admit")
REFUSED = ("http.response.status_code",)
ERROR_KEYS = {"message", "type", "param", "code"}


def terminal_spans(obs: RequestObservation, spans: SpanIndex) -> list[RootSpan]:
    return [s for s in spans.get(obs.trace_id, []) if s.reason is not None]


def refused(obs: RequestObservation) -> bool:
    """An error status that is a refusal (the request never ran), not an accepted request that ended
    in an error (a JSON request cancelled by a shutdown answers 503 too)."""
    return obs.status is not None and obs.status >= 400 and "rejected" in obs.resolved().server_reasons


def span_of(obs: RequestObservation, spans: SpanIndex | None) -> RootSpan | None:
    """The request's one terminal span (None when there is not exactly one)."""
    if spans is None:
        return None
    found = terminal_spans(obs, spans)
    return found[0] if len(found) == 1 else None


def trace_coverage(observations: list[RequestObservation], spans: SpanIndex | None) -> Check:
    if spans is None:
        return skipped("trace_coverage", NO_TRACE)
    sent = [x for x in observations if x.sent]
    problems, exactly_one = [], 0
    for x in sent:
        found = terminal_spans(x, spans)
        if not found:
            problems.append(f"{x.label}: no terminal request span (trace {x.trace_id})")
            continue
        if len(found) > 1:
            problems.append(f"{x.label}: {len(found)} terminal request spans")
            continue
        exactly_one += 1
        s = found[0]
        rid = s.attributes.get("gen_ai.response.id")
        if x.request_id and rid != x.request_id:
            problems.append(f"{x.label}: span is for {rid}, the client was told {x.request_id}")
        status = s.attributes.get("http.response.status_code")
        if refused(x) and (s.reason != "rejected" or status != x.status):
            problems.append(f"{x.label}: refused with {x.status} but the span says {s.reason} / "
                            f"http.response.status_code {status}")
    data = {"requests": len(sent), "exactly_one_span": exactly_one}
    return verdict("trace_coverage", problems, f"all {len(sent)} requests have exactly one terminal span", data)


def trace_fields(observations: list[RequestObservation], spans: SpanIndex | None,
                 backend: str | None = None, maturity: str | None = None) -> Check:
    if spans is None:
        return skipped("trace_fields", NO_TRACE)
    problems = []
    for x in observations:
        s = span_of(x, spans)
        if s is None:
            continue  # trace_coverage reports it
        a = s.attributes
        wanted = ALWAYS + (REFUSED if refused(x) else ACCEPTED if x.status is not None else ())
        missing = [k for k in wanted if a.get(k) is None]
        if missing:
            problems.append(f"{x.label}: span lacks {', '.join(missing)}")
        if s.reason is not None and s.reason not in o.REASONS:
            problems.append(f"{x.label}: unknown terminal reason {s.reason!r}")
        h = a.get("pegainfer.output_hash")
        if h is not None and not HEX64.match(str(h)):
            problems.append(f"{x.label}: output hash {h!r} is not sha256 hex")
        if backend is not None and a.get("pegainfer.backend") not in (None, backend):
            problems.append(f"{x.label}: span backend {a.get('pegainfer.backend')!r}, /v1/models says {backend!r}")
        if maturity is not None and a.get("pegainfer.backend_maturity") not in (None, maturity):
            problems.append(f"{x.label}: span maturity {a.get('pegainfer.backend_maturity')!r}, "
                            f"/v1/models says {maturity!r}")
    return verdict("trace_fields", problems, "every span carries the required attributes")


def terminal_reasons(observations: list[RequestObservation], spans: SpanIndex | None) -> Check:
    if spans is None:
        return skipped("terminal_reasons", NO_TRACE)
    problems = []
    for x in observations:
        if not x.sent:
            continue
        s = span_of(x, spans)
        want = x.resolved().server_reasons
        got = s.reason if s is not None else None
        if got not in want:
            problems.append(f"{x.label}: server terminal reason {got or 'missing'}, expected {'|'.join(want)}")
    return verdict("terminal_reasons", problems, "every request ended with the terminal reason it expected")


def error_shape_problem(body: object) -> str | None:
    """None when `body` is {"error": {"message": str, "type": str, "param": str|null, "code": str|null}}."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return f"error body is not {{'error': {{...}}}}: {str(body)[:80]}"
    e = body["error"]
    if set(e) != ERROR_KEYS:
        return f"error keys {sorted(e)}, want {sorted(ERROR_KEYS)}"
    if not isinstance(e["message"], str) or not e["message"] or not isinstance(e["type"], str):
        return "error message/type must be non-empty strings"
    if not all(e[k] is None or isinstance(e[k], str) for k in ("param", "code")):
        return "error param/code must be strings or null"
    return None


def client_outcomes(observations: list[RequestObservation]) -> Check:
    problems = []
    for x in observations:
        e = x.resolved()
        p = _outcome_problem(x, e)
        if p:
            problems.append(f"{x.label}: {p}")
    return verdict("client_outcomes", problems, f"all {len(observations)} requests ended as expected")


def _outcome_problem(x: RequestObservation, e: o.Expectation) -> str | None:
    if x.outcome != e.outcome:
        return f"outcome {x.outcome} ({x.note or x.error or ''}), expected {e.outcome}"
    if x.status != e.status:
        return f"HTTP {x.status}, expected {e.status}"
    if e.outcome == o.COMPLETED and e.tokens is not None and x.tokens != e.tokens:
        return f"{x.tokens} completion tokens, expected {e.tokens}"
    if e.outcome in (o.HTTP_ERROR, o.ERROR_CHUNK):
        shape = error_shape_problem(x.error_body)
        if shape:
            return shape
        if e.error_code is not None and x.error.get("code") != e.error_code:
            return f"error code {x.error.get('code')!r}, expected {e.error_code!r}"
    if e.outcome == o.ERROR_CHUNK and not x.done:
        return "no data: [DONE] after the error chunk"
    if e.retry_after and not (x.retry_after or "").isdigit():
        return f"Retry-After {x.retry_after!r}, expected whole seconds"
    return None


def timeouts(observations: list[RequestObservation]) -> Check:
    timed = [x for x in observations if x.outcome == o.TIMED_OUT and x.resolved().outcome != o.TIMED_OUT]
    problems = [f"{x.label}: {x.note}" for x in timed]
    return verdict("no_unexplained_timeouts", problems, "no request timed out")


def hash_groups(observations: list[RequestObservation], spans: SpanIndex | None) -> dict[str, dict]:
    """Per request kind, over requests that completed in full: the distinct client text hashes
    and server output hashes."""
    groups: dict[str, dict] = {}
    for x in observations:
        e = x.resolved()
        if x.kind is None or x.outcome != o.COMPLETED or (e.tokens is not None and x.tokens != e.tokens):
            continue
        g = groups.setdefault(x.kind, {"requests": 0, "text_sha256": [], "output_hash": []})
        g["requests"] += 1
        if x.text_sha256 not in g["text_sha256"]:
            g["text_sha256"].append(x.text_sha256)
        s = span_of(x, spans)
        h = s.attributes.get("pegainfer.output_hash") if s is not None else None
        if h is not None and h not in g["output_hash"]:
            g["output_hash"].append(h)
    return dict(sorted(groups.items()))


def hash_stability(observations: list[RequestObservation], spans: SpanIndex | None) -> Check:
    groups = hash_groups(observations, spans)
    problems = []
    for kind, g in groups.items():
        if len(g["text_sha256"]) > 1:
            problems.append(f"{kind}: {len(g['text_sha256'])} different streamed texts over {g['requests']} requests")
        if len(g["output_hash"]) > 1:
            problems.append(f"{kind}: {len(g['output_hash'])} different server output hashes")
    repeated = sum(1 for g in groups.values() if g["requests"] > 1)
    return verdict("output_hash_stability", problems,
                   f"{len(groups)} request kinds, {repeated} sent more than once, one output each", {"kinds": groups})
