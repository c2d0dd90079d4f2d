"""Stopping a real daemon with requests in flight: a drain that lets every request finish exits 0;
a second SIGTERM (or SIGINT) forces the stop, and then every accepted request still ends in a way
its client can read (a server_shutdown error chunk and [DONE] on a stream, a 503 JSON error
otherwise) and the exit status is not 0, because accepted work was lost."""
from __future__ import annotations

import asyncio
import json
import signal

import httpx
import pytest

from tests.daemon_process import DaemonProcess

LONG = 4000  # tokens: far more than the tiny model makes on CPU in the seconds a test waits


def _start(tiny_model_dir, *extra: str) -> DaemonProcess:
    return DaemonProcess("--model", str(tiny_model_dir), "--max-model-len", "4096", "--drain-timeout", "60",
                         *extra).start()


async def _stream(client: httpx.AsyncClient, body: dict, first: asyncio.Event) -> list[str]:
    """Every `data:` line of one streamed completion; `first` is set at its first chunk."""
    lines = []
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                lines.append(line)
                first.set()
    first.set()
    return lines


async def _forced_stop(d: DaemonProcess, sig: int, streams: int) -> tuple[list[list[str]], httpx.Response]:
    """`streams` long streams (more than --max-active, so some are still queued) and one long JSON
    request; once the streams that run have a chunk, `sig`, a moment, and `sig` again."""
    body = {"prompt": [5, 6, 7], "max_tokens": LONG, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=d.url, timeout=60) as client:
        firsts = [asyncio.Event() for _ in range(streams)]
        tasks = [asyncio.create_task(_stream(client, body, e)) for e in firsts]
        plain = asyncio.create_task(client.post("/v1/completions", json=body))
        # --max-active requests run (which ones is the order of arrival: the JSON one may be among them)
        waits = [asyncio.ensure_future(e.wait()) for e in firsts]
        await asyncio.wait_for(_first_n(waits, 1), 30)
        for w in waits:
            w.cancel()
        d.signal(sig)
        await asyncio.sleep(0.5)  # the drain has begun: the streams carry on
        assert not any(t.done() for t in tasks), "a stream ended before the second signal"
        d.signal(sig)
        return await asyncio.gather(*tasks), await plain


async def _first_n(waits: list[asyncio.Future], n: int) -> None:
    """Return once `n` of `waits` are done."""
    pending = set(waits)
    while len(waits) - len(pending) < n:
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_second_signal_ends_every_request_with_server_shutdown_and_exits_nonzero(tiny_model_dir, sig):
    d = _start(tiny_model_dir, "--max-active", "2")
    try:
        streamed, plain = asyncio.run(_forced_stop(d, sig, streams=4))
        code = d.wait(60)
    finally:
        d.stop()
    for lines in streamed:
        assert lines[-1] == "data: [DONE]", lines[-3:]
        error = json.loads(lines[-2][6:])["error"]
        assert error["code"] == "server_shutdown" and error["type"] == "service_unavailable", error
        assert set(error) == {"message", "type", "param", "code"} and "shutting down" in error["message"]
        assert all("finish_reason\":\"length" not in line for line in lines)  # none had finished
    assert plain.status_code == 503, plain.text
    assert plain.json()["error"]["code"] == "server_shutdown"
    assert code not in (0, None), d.log()[-3000:]
    assert '"event":"forced_stop"' in d.log() and "Traceback" not in d.log()


def test_one_sigterm_lets_short_streams_finish_and_exits_zero(tiny_model_dir):
    d = _start(tiny_model_dir, "--max-active", "2")
    body = {"prompt": [5, 6, 7], "max_tokens": 48, "ignore_eos": True}

    async def run() -> list[list[str]]:
        async with httpx.AsyncClient(base_url=d.url, timeout=60) as client:
            firsts = [asyncio.Event() for _ in range(4)]
            tasks = [asyncio.create_task(_stream(client, body, e)) for e in firsts]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in firsts[:2])), 30)
            d.signal(signal.SIGTERM)
            return await asyncio.gather(*tasks)

    try:
        streamed = asyncio.run(run())
        code = d.wait(60)
    finally:
        d.stop()
    for lines in streamed:
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert code == 0, d.log()[-3000:]
