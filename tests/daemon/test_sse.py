"""daemon.sse.EventStream: sse-starlette's headers and ping line, events sent as they are, and a
client disconnect that cancels the event generator (its `finally` runs) and ends the response
quietly."""
from __future__ import annotations

import asyncio

from pegainfer.daemon.sse import EventStream

SCOPE = {"type": "http", "method": "POST"}


class Client:
    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.left = asyncio.Event()

    async def receive(self) -> dict:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    @property
    def body(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


async def test_events_headers_and_end():
    async def events():
        yield b"data: 1\n\n"
        yield b"data: [DONE]\n\n"

    client = Client()
    await EventStream(events(), headers={"X-Request-Id": "cmpl-1"})(SCOPE, client.receive, client.send)
    start = client.sent[0]
    assert start["status"] == 200
    assert start["headers"] == [(b"x-request-id", b"cmpl-1"), (b"cache-control", b"no-store"),
                                (b"connection", b"keep-alive"), (b"x-accel-buffering", b"no"),
                                (b"content-type", b"text/event-stream; charset=utf-8")]
    assert client.body == [b"data: 1\n\n", b"data: [DONE]\n\n", b""]
    assert client.sent[-1]["more_body"] is False


async def test_disconnect_cancels_the_generator_and_runs_its_finally():
    state = []

    async def events():
        try:
            yield b"data: 1\n\n"
            await asyncio.sleep(3600)  # waiting for a token that never comes
            yield b"never"
        finally:
            state.append("closed")

    client = Client()
    call = asyncio.ensure_future(EventStream(events())(SCOPE, client.receive, client.send))
    await asyncio.sleep(0.01)
    client.left.set()
    await asyncio.wait_for(call, 5)  # returns normally: a disconnect is an ordinary end
    assert state == ["closed"]
    assert client.body == [b"data: 1\n\n"]
    assert not call.cancelled() and asyncio.current_task().cancelling() == 0


async def test_ping_comment_line():
    async def events():
        await asyncio.sleep(0.08)
        yield b"data: 1\n\n"

    client = Client()
    await EventStream(events(), ping_s=0.03)(SCOPE, client.receive, client.send)
    pings = [b for b in client.body if b.startswith(b": ping - ")]
    assert pings and all(b.endswith(b"+00:00\n\n") for b in pings)
    assert client.body[-2:] == [b"data: 1\n\n", b""]
