"""The completion responses still being written: a pure ASGI wrapper around the completions route
that counts them, so that a shutdown can give their last bytes (a final chunk, an error chunk,
[DONE], a 503 body) a bounded moment to go out before it stops the server, and can tell afterwards
whether any was cut off. A response task that ends in CancelledError was cut: the server stopped
under it (a client that goes away ends its response normally: daemon.sse absorbs that cancel).

Pure ASGI, not Starlette's BaseHTTPMiddleware, which would break the ContextVar propagation that
OpenTelemetry's context relies on."""
from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Receive, Scope, Send

POLL_S = 0.01


class OpenResponses:
    def __init__(self) -> None:
        self.open = 0  # responses being written now
        self.cut = 0  # responses whose task was cancelled before they were complete

    def wrap(self, app: ASGIApp) -> ASGIApp:
        return _Counted(self, app)

    async def wait_closed(self, timeout_s: float) -> bool:
        """Wait until no response is open, at most `timeout_s`; whether none is."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.open and loop.time() < deadline:
            await asyncio.sleep(POLL_S)
        return self.open == 0


class _Counted:
    """An object, not a function: Starlette's Route treats a plain function as a request handler,
    and anything else as an ASGI app."""

    def __init__(self, counter: OpenResponses, app: ASGIApp) -> None:
        self.counter, self.app = counter, app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        counter = self.counter
        counter.open += 1
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            counter.cut += 1
            raise
        finally:
            counter.open -= 1
