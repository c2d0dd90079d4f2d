"""GET /debug/traces[?limit=N]: the recent spans telemetry keeps (telemetry.recent), as the same
OTLP/JSON lines the trace file holds, so the viewer can be pointed at a live daemon. Served only
with --debug-traces, behind the API key (daemon.app)."""
from __future__ import annotations

import orjson
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pegainfer.telemetry.recent import RecentSpans

MEDIA_TYPE = "application/x-ndjson"


def traces_route(recent: RecentSpans) -> Route:
    async def traces(http: HTTPRequest) -> Response:
        raw = http.query_params.get("limit")
        if raw is not None and not (raw.isdigit() and int(raw) > 0):
            # the OpenAI error shape every other 4xx of the daemon has
            return JSONResponse({"error": {"message": f"limit must be a positive integer, got {raw[:50]!r}",
                                           "type": "invalid_request_error", "param": "limit", "code": None}},
                                status_code=400)
        return Response(recent.jsonl(int(raw) if raw else None, orjson.dumps), media_type=MEDIA_TYPE)

    return Route("/debug/traces", traces, methods=["GET"])
