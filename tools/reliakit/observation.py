"""One client request as the runner saw it: what it sent, what it expected (client outcome, HTTP
status, token count, error code, the server's terminal reasons), what came back, and the
traceparent trace id that ties it to exactly one request span in the server's trace records."""
from __future__ import annotations

import dataclasses
import secrets
from typing import Any

# Client outcomes: how a request ended as the client saw it.
COMPLETED = "completed"  # 200, a finish_reason chunk, then data: [DONE]
HTTP_ERROR = "http_error"  # a 4xx/5xx status with an OpenAI error body
ERROR_CHUNK = "error_chunk"  # 200, then an error chunk (then data: [DONE])
CLOSED = "closed_by_client"  # the runner closed the stream or the connection on purpose
INCOMPLETE = "incomplete"  # the stream ended without a finish_reason or without [DONE]
TIMED_OUT = "timed_out"  # no end within the request's time limit
CONNECTION_ERROR = "connection_error"  # refused or reset before an end
NOT_SENT = "not_sent"
OUTCOMES = (COMPLETED, HTTP_ERROR, ERROR_CHUNK, CLOSED, INCOMPLETE, TIMED_OUT, CONNECTION_ERROR, NOT_SENT)

# Server terminal reasons (pegainfer.terminal_reason).
FINISHED = ("completed_length", "completed_stop")
REASONS = (*FINISHED, "rejected", "cancelled", "disconnected", "failed")


@dataclasses.dataclass(slots=True)
class Expectation:
    outcome: str
    server_reasons: tuple[str, ...]
    status: int = 200
    tokens: int | None = None  # completion tokens a completed request must report (usage)
    error_code: str | None = None  # error.code in the body or the error chunk
    retry_after: bool = False  # a Retry-After header is required
    either: Expectation | None = None  # an alternative, chosen by HTTP status (200 or 429 in a burst)

    def to_dict(self) -> dict[str, Any]:
        out = {"outcome": self.outcome, "status": self.status, "server_reasons": list(self.server_reasons),
               "tokens": self.tokens, "error_code": self.error_code, "retry_after": self.retry_after}
        out["either"] = self.either.to_dict() if self.either is not None else None
        return out


def completes(tokens: int) -> Expectation:
    """A greedy ignore_eos stream that must finish with exactly `tokens` tokens."""
    return Expectation(COMPLETED, ("completed_length",), 200, tokens)


def refused(status: int, code: str | None = None, retry_after: bool = False) -> Expectation:
    return Expectation(HTTP_ERROR, ("rejected",), status, None, code, retry_after)


@dataclasses.dataclass(slots=True)
class RequestObservation:
    label: str
    kind: str | None  # same prompt and parameters -> same kind -> the same output hash, always
    expect: Expectation
    body: Any  # the JSON body sent (dict), or raw bytes for a malformed one
    max_tokens: int | None = None
    trace_id: str = dataclasses.field(default_factory=lambda: secrets.token_hex(16))
    request_id: str | None = None
    status: int | None = None
    outcome: str = NOT_SENT
    text: str = ""
    text_sha256: str | None = None
    tokens: int | None = None  # usage.completion_tokens
    finish_reason: str | None = None
    error: Any = None  # the "error" member of the body or the error chunk, as sent
    error_body: Any = None  # the whole error body or chunk (its shape is checked)
    retry_after: str | None = None
    done: bool = False  # saw data: [DONE]
    start_s: float | None = None  # seconds since the run started
    first_token_s: float | None = None
    end_s: float | None = None
    note: str | None = None

    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.trace_id[:16]}-01"

    def resolved(self) -> Expectation:
        """The expectation that applies: the first of the chain (expect, expect.either, its either...)
        whose status the response has; the first when none has it."""
        e = self.expect
        alt = e
        while alt is not None and self.status is not None:
            if self.status == alt.status:
                return alt
            alt = alt.either
        return e

    @property
    def sent(self) -> bool:
        return self.outcome != NOT_SENT

    def to_dict(self, server: dict | None) -> dict[str, Any]:
        body = self.body if isinstance(self.body, (bytes, str)) else _json(self.body)
        if isinstance(body, bytes):
            body = body.decode(errors="replace")
        return {
            "label": self.label, "kind": self.kind, "trace_id": self.trace_id, "request_id": self.request_id,
            "body": body[:300], "max_tokens": self.max_tokens, "status": self.status, "outcome": self.outcome,
            "tokens": self.tokens, "finish_reason": self.finish_reason, "text_sha256": self.text_sha256,
            "error": self.error, "retry_after": self.retry_after, "done": self.done,
            "start_s": _ms(self.start_s), "first_token_s": _ms(self.first_token_s), "end_s": _ms(self.end_s),
            "note": self.note, "expected": self.resolved().to_dict(), "server": server,
        }


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _json(obj: Any) -> str:
    import json
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
