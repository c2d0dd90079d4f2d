"""The optional access log (`--access-log`, off by default): one JSON line per HTTP request on the
`pegainfer.access` logger, written when the response has been sent (a stream: when it ended), with
the method, the path (never the query string), the status, the duration, the request id the
response carried (X-Request-Id) and the client address. Headers are never logged, so the API key
never is. A pure ASGI middleware (Starlette's BaseHTTPMiddleware would break the ContextVar
propagation OpenTelemetry relies on); uvicorn's own access log stays off."""
from __future__ import annotations

import logging
import time

import orjson

log = logging.getLogger("pegainfer.access")
MAX_PATH = 200
REQUEST_ID = b"x-request-id"


class AccessLog:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        sent: dict[str, object] = {"status": None, "request_id": None}

        async def send_and_note(message) -> None:
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
                for name, value in message.get("headers", ()):
                    if name.lower() == REQUEST_ID:
                        sent["request_id"] = value.decode("latin-1")
            await send(message)

        failed = False
        try:
            await self.app(scope, receive, send_and_note)
        except BaseException:
            failed = True
            raise
        finally:
            status = sent["status"] if sent["status"] is not None or not failed else 500
            client = scope.get("client")
            log.info(orjson.dumps({
                "event": "http_request", "method": scope["method"], "path": scope["path"][:MAX_PATH],
                "status": status, "duration_ms": round((time.perf_counter() - started) * 1e3, 3),
                "request_id": sent["request_id"], "client": f"{client[0]}:{client[1]}" if client else None,
            }).decode())
