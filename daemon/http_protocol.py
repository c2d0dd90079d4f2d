"""uvicorn's httptools HTTP/1.1 protocol, plus what uvicorn lacks for a server facing the open
network: a header read deadline, the connection budget (daemon/connections.py), and OpenAI error
JSON wherever this layer answers on its own.

- A connection must send a request's complete headers within --http-header-timeout of opening
  (or of the first byte of a later request on a kept-alive one). Otherwise it is closed: with a
  408 JSON body when part of a request had arrived, silently when nothing had (an answer to a
  request never sent could be read as the answer to the client's next one). Between requests,
  uvicorn's keep-alive timeout applies.
- At the connection cap the connection that has waited longest without a request in progress is
  evicted to make room (never one opened less than connections.EVICT_GRACE_S ago); when there is
  none, the new connection's request is answered with a JSON 503 (code `too_many_connections`,
  Retry-After), counted through `on_refused` (the daemon records it as a refused request), and the
  connection is closed; past the descriptor ceiling a new connection is closed at once.
- Bytes that are not HTTP get a 400 with the error JSON (uvicorn's own is text/plain).
- A connection answered before its request arrived in full (this layer's 400 and 408; the app's
  408 or 413 while the body is still coming) is closed the way nginx does it, lingering: it stops
  writing, then discards what the client still sends for up to LINGER_S before closing. Closing
  with unread input makes the kernel answer with a reset, and the client would lose the response
  it has not read yet. (An evicted connection is closed at once: its descriptor is the point.)"""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from pegainfer.daemon.connections import Admission, ConnectionGuard
from pegainfer.daemon.protocol import APIError

# An over-cap connection is only kept to tell it why: it gets this long to send its headers.
REFUSE_HEADER_TIMEOUT_S = 1.0
LINGER_S = 2.0


Refused = Callable[[dict[str, Any], APIError], None]  # (the ASGI scope of the refused request, its answer)


def protocol_factory(guard: ConnectionGuard, header_timeout_s: float, on_refused: Refused | None = None):
    """What uvicorn.Config(http=...) takes: a callable with the protocol class's signature."""
    return functools.partial(GuardedHttpProtocol, guard=guard, header_timeout_s=header_timeout_s,
                             on_refused=on_refused)


class GuardedHttpProtocol(HttpToolsProtocol):
    def __init__(self, config, server_state, app_state, _loop=None, *, guard: ConnectionGuard,
                 header_timeout_s: float, on_refused: Refused | None = None):
        super().__init__(config, server_state, app_state, _loop)
        self.guard = guard
        self.on_refused = on_refused
        self.header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None
        self._partial = False  # some bytes of a request whose headers are not complete have arrived
        self._lingering = False  # answered and half-closed: input is discarded until the close

    # ---- connection -------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        verdict = self.guard.admit(self)
        if verdict is Admission.DROP:
            transport.close()
            return
        if verdict is Admission.REFUSE:
            self.app = _too_many_connections(self.guard.budget.max_connections, self.on_refused)
            self._arm(min(self.header_timeout_s, REFUSE_HEADER_TIMEOUT_S))
            return
        self._arm(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.release(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._lingering:
            super().data_received(data)

    def evict(self) -> None:
        """The guard needs this connection's descriptor for a new one: it has no request in progress."""
        self._disarm()
        # At once, not lingering: the point is to free its descriptor.
        self._close("the connection was closed to make room for others before its request headers arrived",
                    linger=False)

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
        cycle = self.cycle
        if cycle is not None:  # (None only for a WebSocket upgrade, which this server has no route for)
            cycle.transport = _CycleTransport(self.transport, functools.partial(self._cycle_closes, cycle))

    def _cycle_closes(self, cycle) -> None:
        """A request cycle closes the connection (its response said Connection: close, or the app failed)."""
        if cycle.more_body and not self.transport.is_closing():
            self._linger()
        else:
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing() or self.cycle is None or not self.cycle.response_complete:
            return
        if self.cycle.more_body:  # answered before its body arrived: the rest is not worth reading
            self._linger()
        else:
            self.guard.idle(self)

    # ---- answers of this layer --------------------------------------------------------------------
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

    def _close(self, why: str, linger: bool = True) -> None:
        if self.transport.is_closing():
            return
        if self._partial and not self._lingering and (self.cycle is None or self.cycle.response_complete):
            self._write_error(APIError(408, why, "invalid_request_error", None, "request_timeout"), linger)
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._write_error(APIError(400, msg, "invalid_request_error", None, "invalid_http_request"))

    def _write_error(self, e: APIError, linger: bool = True) -> None:
        """A whole response written straight to the socket (no request cycle exists), then close."""
        body = orjson.dumps(e.body())
        head = [STATUS_LINE[e.status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
                 b"\r\nconnection: close\r\n\r\n"]
        self.transport.write(b"".join(head) + body)
        if linger:
            self._linger()
        else:
            self.transport.close()

    def _linger(self) -> None:
        self._lingering = True
        self._disarm()
        self._unset_keepalive_if_required()
        self.guard.busy(self)
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client reads the answer, then EOF, and closes its side
        self.loop.call_later(LINGER_S, self.transport.close)


def _too_many_connections(limit: int, on_refused: Refused | None):
    error = APIError(503, f"the server is at its limit of {limit} open connections; retry shortly",
                     "service_unavailable", None, "too_many_connections")
    body = orjson.dumps(error.body())
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), (b"retry-after", b"1")]

    async def app(scope: dict[str, Any], receive, send) -> None:
        if on_refused is not None:
            on_refused(scope, error)
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


class _CycleTransport:
    """What one request cycle writes through: the connection's transport (its bound methods, so the
    streaming path pays nothing), except that closing lingers while the request body is still
    arriving."""

    __slots__ = ("write", "is_closing", "close")

    def __init__(self, transport: asyncio.Transport, close):
        self.write, self.is_closing, self.close = transport.write, transport.is_closing, close
