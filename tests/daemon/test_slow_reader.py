"""The HTTP path under a client that reads slower than tokens arrive, and one that goes away while
its body is being read, driven through the real app and a real tiny engine in this process (ASGI
calls, no socket): a slow reader gets fewer, fuller chunks carrying the same text (tokens wait in
the request's bounded sink, never as one queued chunk per token), and a body cut off is an ordinary
refusal with no traceback."""
from __future__ import annotations

import asyncio
import logging
import sys

import orjson
import pytest

from pegainfer.daemon.app import build_app
from pegainfer.daemon.runtime import Runtime
from pegainfer.daemon.settings import Settings
from pegainfer.daemon.telemetry_setup import telemetry_for

BODY = {"prompt": "the river tide", "max_tokens": 48, "stream": True, "ignore_eos": True,
        "stream_options": {"include_usage": True}}


@pytest.fixture
async def runtime(tiny_model_dir):
    interval = sys.getswitchinterval()
    settings = Settings(model=str(tiny_model_dir), served_model_name="tiny", max_active=2)
    rt = Runtime(settings, telemetry_for(settings))
    await rt.start(asyncio.get_running_loop())
    assert rt.engine is not None, rt.load_error
    yield rt
    rt.close()
    rt.tokenize.shutdown()
    sys.setswitchinterval(interval)


def scope(path: str = "/v1/completions", length: int | None = None) -> dict:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000)}


class Client:
    """An ASGI peer: sends `body` (in `parts`, then optionally goes away) and records what the app
    sends; each body send after the first waits `hold_s` (a reader that falls behind)."""

    def __init__(self, body: bytes, *, hold_s: float = 0.0, leave_after: int | None = None) -> None:
        self.parts = [body] if leave_after is None else [body[:leave_after]]
        self.leave = leave_after is not None
        self.hold_s = hold_s
        self.sent: list[dict] = []
        self.done = asyncio.Event()

    async def receive(self) -> dict:
        if self.parts:
            part = self.parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": self.leave or bool(self.parts)}
        if self.leave:
            return {"type": "http.disconnect"}
        await self.done.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and message.get("body") and self.hold_s:
            await asyncio.sleep(self.hold_s)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.done.set()

    def events(self) -> list[bytes]:
        data = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        return [e for e in data.split(b"\n\n") if e.startswith(b"data: ")]


def content(events: list[bytes]) -> tuple[str, int, int]:
    """(text, content chunks, usage.completion_tokens)."""
    text, chunks, usage = "", 0, -1
    for e in events:
        if e == b"data: [DONE]":
            continue
        obj = orjson.loads(e[6:])
        if obj.get("choices"):
            chunks += 1
            text += obj["choices"][0]["text"]
        if obj.get("usage"):
            usage = obj["usage"]["completion_tokens"]
    return text, chunks, usage


async def test_a_slow_reader_gets_fewer_fuller_chunks_with_the_same_text(runtime):
    app = build_app(runtime)
    body = orjson.dumps(BODY)
    fast = Client(body)
    await app(scope(length=len(body)), fast.receive, fast.send)
    text, fast_chunks, tokens = content(fast.events())
    assert tokens == 48 and fast_chunks >= 24 and fast.events()[-1] == b"data: [DONE]"

    slow = Client(body, hold_s=0.25)  # every write takes a quarter second to drain
    await app(scope(length=len(body)), slow.receive, slow.send)
    slow_text, slow_chunks, slow_tokens = content(slow.events())
    assert (slow_text, slow_tokens) == (text, 48)  # greedy: the same tokens, the same text
    assert slow_chunks < fast_chunks / 3  # tokens that arrived during a held write went out together
    assert runtime.scheduler.snapshot()["running"] == 0


async def test_a_client_gone_while_its_body_is_read_is_refused_quietly(runtime, caplog):
    app = build_app(runtime)
    body = orjson.dumps(BODY)
    before = runtime.scheduler.snapshot()
    client = Client(body, leave_after=7)
    with caplog.at_level(logging.DEBUG):
        await app(scope(length=len(body)), client.receive, client.send)  # nothing raises out of the app
    assert not any(r.exc_info for r in caplog.records), [r.getMessage() for r in caplog.records if r.exc_info]
    starts = [m for m in client.sent if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] in ([], [499])  # a response to nobody, at most
    after = runtime.scheduler.snapshot()
    assert after["running"] == after["waiting"] == 0 and after.get("submitted") == before.get("submitted")
    metrics = runtime.telemetry.render_metrics(after, None)[0].decode().splitlines()
    counted = [line for line in metrics if line.startswith("pegainfer:requests_terminal_total{")
               and 'terminal_reason="rejected"' in line]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) == 1.0  # counted once, as a refusal before admission
