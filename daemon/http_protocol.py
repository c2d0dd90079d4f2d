"""uvicorn's httptools HTTP/1.1 protocol, plus what uvicorn lacks for a server facing the open
network: a header read deadline, the connection budget (daemon/connections.py), and OpenAI error
JSON wherever this layer answers on its own.

- A connection must send a request's complete headers within --http-header-timeout of opening
  (or of the first byte of a later request on a kept-alive one). Otherwise it is closed: with a
  408 JSON body when part of a request had arrived, silently when nothing had (an answer to a
  request never sent could be read as the answer to the client's next one). Between requests,
  uvicorn's keep-alive timeout applies.
- At the connection cap the connection that has waited longest without a request in progress is
  evicted to make room; when there is none, the new connection's request is answered with a JSON
  503 (code `too_many_connections`, Retry-After) and the connection is closed; past the descriptor
  ceiling a new connection is closed at once.
- Bytes that are not HTTP get a 400 with the error JSON (uvicorn's own is text/plain)."""
from __future__ import annotations

import asyncio
import functools
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from daemon.connections import Admission, ConnectionGuard
from daemon.protocol import APIError

# An over-cap connection is only kept to tell it why: it gets this long to send its headers.
REFUSE_HEADER_TIMEOUT_S = 1.0


def protocol_factory(guard: ConnectionGuard, header_timeout_s: float):
    """What uvicorn.Config(http=...) takes: a callable with the protocol class's signature."""
    return functools.partial(GuardedHttpProtocol, guard=guard, header_timeout_s=header_timeout_s)


class GuardedHttpProtocol(HttpToolsProtocol):
    def __init__(self, config, server_state, app_state, _loop=None, *, guard: ConnectionGuard,
                 header_timeout_s: float):
        super().__init__(config, server_state, app_state, _loop)
        self.guard = guard
        self.header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None
        self._partial = False  # some bytes of a request whose headers are not complete have arrived

    # ---- connection -------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        verdict = self.guard.admit(self)
        if verdict is Admission.DROP:
            transport.close()
            return
        if verdict is Admission.REFUSE:
            self.app = _too_many_connections(self.guard.budget.max_connections)
            self._arm(min(self.header_timeout_s, REFUSE_HEADER_TIMEOUT_S))
            return
        self.guard.idle(self)
        self._arm(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.release(self)
        super().connection_lost(exc)

    def evict(self) -> None:
        """The guard needs this connection's descriptor for a new one: it has no request in progress."""
        self._disarm()
        self._close("the connection was closed to make room for others before its request headers arrived")

    # ---- request boundaries -----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._partial = True
        if self._header_timer is None:  # a later request on a kept-alive connection: its own deadline
            self._arm(self.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._partial = False
        self.guard.busy(self)
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.cycle is not None and self.cycle.response_complete:
            self.guard.idle(self)

    # ---- answers of this layer --------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        self._write_error(APIError(400, msg, "invalid_request_error", None, "invalid_http_request"))

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(seconds, self._header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request stalled behind a response still streaming: finish that, then close.
            self.cycle.keep_alive = False
            return
        self._close(f"the request headers did not arrive within {self.header_timeout_s:g} s")

    def _close(self, why: str) -> None:
        if self.transport.is_closing():
            return
        if self._partial and (self.cycle is None or self.cycle.response_complete):
            self._write_error(APIError(408, why, "invalid_request_error", None, "request_timeout"))
        else:
            self.transport.close()

    def _write_error(self, e: APIError) -> None:
        """A whole response written straight to the socket (no request cycle exists), then close."""
        body = orjson.dumps(e.body())
        head = [STATUS_LINE[e.status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
                 b"\r\nconnection: close\r\n\r\n"]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


def _too_many_connections(limit: int):
    body = orjson.dumps(APIError(503, f"the server is at its limit of {limit} open connections; retry shortly",
                                 "service_unavailable", None, "too_many_connections").body())
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), (b"retry-after", b"1")]

    async def app(scope: dict[str, Any], receive, send) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app
