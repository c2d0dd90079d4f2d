"""What a client is told about a request that did not finish: the HTTP status (for a JSON body) and
the OpenAI error, with a stable message and code, for each terminal state.

The server's own text never reaches a client: an engine failure's message is an exception's (gloo
source paths and peer ports, a rank's exit status, a tensor's shape). It stays in the request's
record (its span's `pegainfer.error`) and goes to the log as one structured line; the client gets
"the engine failed while running this request", or, when expert ranks failed, which ones (a client
and an operator both need that, and it is no secret). Cancellations carry the scheduler's and the
daemon's own words ("cancelled by API request", "server shutting down (...)"), which are safe.
"""
from __future__ import annotations

import re

from pegainfer.daemon.protocol import APIError
from pegainfer.engine.startup_log import log_event
from pegainfer.lifecycle.scheduler import SLOW_READER_CODE
from pegainfer.lifecycle.sink import SinkEnd
from pegainfer.lifecycle.states import RequestState

SERVER_SHUTDOWN = "server_shutdown"  # the code of a request the server's shutdown cancelled
ENGINE_FAILED_MESSAGE = "the engine failed while running this request"
LOAD_FAILED_MESSAGE = "the engine failed to load"

# state -> (HTTP status, error type, code) when the end carries no code of its own. A request cancelled
# through the API is a 499 (gRPC's CANCELLED in Google's HTTP mapping), not a 5xx: the OpenAI SDKs
# retry every 5xx, so a 503 made them send the cancelled request again and run it to the end
_BY_STATE = {
    RequestState.CANCELLED: (499, "cancelled", "request_cancelled"),
    RequestState.DISCONNECTED: (499, "disconnected", "client_disconnected"),
    RequestState.FAILED: (500, "server_error", "engine_failed"),
}
# an end's own code -> (HTTP status, error type)
_BY_CODE = {
    SERVER_SHUTDOWN: (503, "service_unavailable"),
    SLOW_READER_CODE: (503, "service_unavailable"),  # the scheduler's cancel (the reply fell 4,096 tokens behind)
}
# "expert rank 1 exited ...", "expert rank(s) 1, 2 did not complete ...", "expert ranks 1 and 3 ..."
_RANKS = re.compile(r"expert ranks?(?:\(s\))? (\d+(?:(?:,\s*|\s+and\s+)\d+)*)")


def end_error(request_id: str, end: SinkEnd) -> APIError:
    """The error for a request that ended in `end` (not FINISHED); an engine failure's details go to
    the log here, where the client's copy leaves them out."""
    status, kind, code = _BY_STATE[end.state]
    if end.code is not None:
        status, kind = _BY_CODE.get(end.code, (status, kind))
        code = end.code
    if end.state is RequestState.FAILED:
        log_event("request_failed", level="error", request_id=request_id, error=end.message)
        return APIError(status, engine_failure(end.message), kind, None, code)
    return APIError(status, end.message or end.reason.value, kind, None, code)


def engine_failure(detail: str | None) -> str:
    """The client's message for an engine failure whose server-side text is `detail`."""
    lost = failed_ranks(detail)
    return ENGINE_FAILED_MESSAGE if lost is None else f"{lost}; the engine stopped while running this request"


def unavailable_reason(detail: str | None) -> str:
    """Why a stopped engine refuses new work, for the client: which ranks failed, or that it failed."""
    return failed_ranks(detail) or "the engine failed"


def failed_ranks(detail: str | None) -> str | None:
    """"expert rank(s) N failed" for the ranks a failure's server-side text names; None if none."""
    ranks = sorted({int(n) for m in _RANKS.finditer(detail or "") for n in re.findall(r"\d+", m.group(1))})
    if not ranks:
        return None
    if len(ranks) == 1:
        return f"expert rank {ranks[0]} failed"
    return f"expert ranks {', '.join(map(str, ranks))} failed"
