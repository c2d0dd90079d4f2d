"""The text/event-stream response for streamed completions: events the handler has already encoded
(bytes) go to the ASGI send one by one, as they are.

It keeps sse-starlette's contract (its headers, a comment ping every `ping` seconds, the client's
disconnect cancels the event generator so that its `finally` runs) without what that library adds
per event and per request: a task group of four tasks and a shutdown watcher per response, and an
anyio cancel scope around every send, which together cost about as much as the rest of a token's
path through the loop. Server shutdown needs nothing here: the daemon drains every request first
(or, on a forced stop, cancels them so that each stream writes its error chunk and [DONE]) and
waits for the responses to close (daemon.open_responses); uvicorn cancels whatever is still open
after its grace period, and the exit status then says so."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from datetime import datetime, timezone

from starlette.datastructures import MutableHeaders
from starlette.responses import Response
from starlette.types import Receive, Scope, Send


class EventStream(Response):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], *, headers: Mapping[str, str] | None = None,
                 ping_s: float = 15.0) -> None:
        self.events = events
        self.ping_s = ping_s
        self.status_code = 200
        self.background = None
        h = MutableHeaders()
        h.update(headers or {})
        h.setdefault("Cache-Control", "no-store")
        h["Connection"] = "keep-alive"
        h["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
        self.init_headers(h)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        me = asyncio.current_task()
        gone = False  # the client disconnected, and `me` was cancelled for it

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            me.cancel()

        helpers = [asyncio.ensure_future(watch())]
        if self.ping_s > 0:
            helpers.append(asyncio.ensure_future(self._ping(send)))
        try:
            async for event in self.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            me.uncancel()  # the client left: an ordinary end of this response
        finally:
            for task in helpers:
                task.cancel()
            await self.events.aclose()  # a generator stopped at a yield runs its `finally` now

    async def _ping(self, send: Send) -> None:
        while True:
            await asyncio.sleep(self.ping_s)
            comment = f": ping - {datetime.now(timezone.utc)}\n\n"  # sse-starlette's ping line
            await send({"type": "http.response.body", "body": comment.encode(), "more_body": True})
