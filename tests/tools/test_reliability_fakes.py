"""Crafted client observations and server request spans for the reliability runner's rule tests: what
a correct server produces, which each test then breaks in one way (no tests here; the test_ name
keeps it beside the tests that use it)."""
from __future__ import annotations

import hashlib

from tools.reliakit import observation as o
from tools.reliakit.observation import (
    Expectation,
    RequestObservation,
    completes,
    refused,
)
from tools.reliakit.server_spans import RootSpan, SpanIndex

BACKEND, MATURITY = "local", "production"


def done(label: str, expect: Expectation, *, kind: str | None = None, text: str = "", rid: str | None = None,
         status: int | None = None, outcome: str | None = None, tokens: int | None = None,
         code: str | None = None, retry_after: str | None = None) -> RequestObservation:
    """An observation that met `expect` (unless overridden)."""
    x = RequestObservation(label, kind, expect, {"prompt": label})
    x.trace_id = hashlib.sha256(label.encode()).hexdigest()[:32]
    x.status = expect.status if status is None else status
    x.outcome = expect.outcome if outcome is None else outcome
    x.tokens = expect.tokens if tokens is None else tokens
    x.request_id = rid if rid is not None else (f"cmpl-{label}" if x.status == 200 else None)
    x.text = text or f"text of {kind or label}"
    x.text_sha256 = hashlib.sha256(x.text.encode()).hexdigest()
    x.done = x.outcome in (o.COMPLETED, o.ERROR_CHUNK)
    x.finish_reason = "length" if x.outcome == o.COMPLETED else None
    x.start_s, x.end_s = 0.0, 1.0
    if x.outcome in (o.HTTP_ERROR, o.ERROR_CHUNK):
        x.error = {"message": "refused", "type": "invalid_request_error", "param": None,
                   "code": expect.error_code if code is None else code}
        x.error_body = {"error": x.error}
    x.retry_after = retry_after if retry_after is not None else ("1" if expect.retry_after else None)
    return x


def span(x: RequestObservation, reason: str | None = None, *, drop: tuple[str, ...] = (), **extra) -> RootSpan:
    """The request span a correct server writes for `x` (reason: its first expected one)."""
    a = {"gen_ai.operation.name": "text_completion", "pegainfer.backend": BACKEND,
         "pegainfer.backend_maturity": MATURITY,
         "pegainfer.terminal_reason": reason or x.resolved().server_reasons[0]}
    if x.status == 200:
        a.update({"gen_ai.response.id": x.request_id, "gen_ai.usage.output_tokens": x.tokens or 1,
                  "pegainfer.output_hash": hashlib.sha256(f"ids {x.kind or x.label}".encode()).hexdigest(),
                  "pegainfer.active_set_size_max": 2, "pegainfer.decode_batch_size_max": 2,
                  "pegainfer.pending_depth_at_admit": 0})
    else:
        a["http.response.status_code"] = x.status
    a.update(extra)
    for key in drop:
        a.pop(key, None)
    return RootSpan(x.trace_id, x.trace_id[:16], "text_completion tiny", a)


def index(*spans: RootSpan) -> SpanIndex:
    out: SpanIndex = {}
    for s in spans:
        out.setdefault(s.trace_id, []).append(s)
    return out


def good_mix() -> list[RequestObservation]:
    """One of each ending a correct server produces: completed twice (one kind), closed by the
    client, cancelled with an error chunk, refused with 400 and with 429."""
    return [
        done("a", completes(8), kind="k8", text="same"),
        done("b", completes(8), kind="k8", text="same"),
        done("closed", Expectation(o.CLOSED, ("disconnected",))),
        done("cancelled", Expectation(o.ERROR_CHUNK, ("cancelled",), error_code="request_cancelled")),
        done("bad_json", refused(400)),
        done("busy", refused(429, "queue_full", retry_after=True)),
    ]
