"""Fuzz against a real daemon (tiny model, CPU): 2,000 hostile /v1/completions bodies and 300
/v1/chat/completions ones (tests/daemon/hostile_bodies.py, seeded) sent 16 at a time while a seeded,
sampled stream runs (restarted whenever it ends, so that
one always runs). No body gets a 5xx; every accepted one ends normally (a stream with its [DONE] and
no error chunk: what the API accepts, the engine runs); every neighbour stream completes with all
its tokens, the very text it has alone; the daemon is still ready afterwards, with idle counters,
and no Traceback in its log."""
from __future__ import annotations

import asyncio
import collections
import json

import httpx
import pytest

from tests.daemon.hostile_bodies import HostileBodies
from tests.daemon_process import DaemonProcess

pytestmark = pytest.mark.slow

BODIES = 2000
CHAT_BODIES = 300
CONCURRENCY = 16
NEIGHBOUR = {"model": "tiny", "prompt": "The weather in the mountains is", "max_tokens": 40, "temperature": 0.9,
             "top_k": 50, "top_p": 0.95, "seed": 1234, "stream": True, "ignore_eos": True,
             "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def daemon(tiny_model_dir):
    with DaemonProcess("--model", str(tiny_model_dir), "--served-model-name", "tiny", "--max-active", "4",
                       "--max-pending", "64", "--max-model-len", "512") as d:
        yield d


async def read_stream(client: httpx.AsyncClient, body: bytes, path: str = "/v1/completions") -> tuple[int, list]:
    """(status, the SSE data items: dicts and "[DONE]"; for a JSON answer, its body)."""
    async with client.stream("POST", path, content=body,
                             headers={"content-type": "application/json"}) as r:
        raw = await r.aread()
    if not r.headers.get("content-type", "").startswith("text/event-stream"):
        try:
            return r.status_code, [json.loads(raw)]
        except ValueError:
            return r.status_code, [raw.decode(errors="replace")]
    items = []
    for event in raw.decode().split("\n\n"):
        for line in event.split("\n"):
            if line.startswith("data: "):
                items.append("[DONE]" if line[6:] == "[DONE]" else json.loads(line[6:]))
    return r.status_code, items


def neighbour_text(items: list) -> tuple[str, int | None]:
    assert items and items[-1] == "[DONE]", items[-3:]
    assert not any(isinstance(i, dict) and "error" in i for i in items), items
    text = "".join(c["text"] for i in items[:-1] for c in i.get("choices", []))
    usage = next((i["usage"]["completion_tokens"] for i in items if isinstance(i, dict) and i.get("usage")), None)
    return text, usage


async def fuzz(url: str) -> tuple[tuple[str, int | None], list[tuple[str, int | None]], collections.Counter, list,
                                  collections.Counter]:
    async with httpx.AsyncClient(base_url=url, timeout=120,
                                 limits=httpx.Limits(max_connections=CONCURRENCY + 4)) as client:
        status, items = await read_stream(client, json.dumps(NEIGHBOUR).encode())
        assert status == 200
        alone = neighbour_text(items)
        done = asyncio.Event()
        neighbours: list = []

        async def keep_a_neighbour_running() -> None:
            while not done.is_set():
                s, got = await read_stream(client, json.dumps(NEIGHBOUR).encode())
                assert s == 200
                neighbours.append(neighbour_text(got))

        statuses: collections.Counter = collections.Counter()
        chat_statuses: collections.Counter = collections.Counter()
        problems: list = []
        gate = asyncio.Semaphore(CONCURRENCY)

        async def send(body: bytes, path: str = "/v1/completions") -> None:
            async with gate:
                s, got = await read_stream(client, body, path)
            statuses[s] += 1
            if path != "/v1/completions":
                chat_statuses[s] += 1
            if s >= 500:
                problems.append((s, body[:200], got[-2:]))
            elif s == 200 and got and got[-1] != "[DONE]" and not (isinstance(got[0], dict) and "choices" in got[0]):
                problems.append(("no [DONE]", body[:200], got[-2:]))
            elif s == 200 and any(isinstance(i, dict) and "error" in i for i in got):
                problems.append(("error chunk", body[:200], got[-2:]))

        runner = asyncio.create_task(keep_a_neighbour_running())
        await asyncio.sleep(0.2)  # the neighbour is streaming before the first hostile body
        chat = HostileBodies(33, 1024, "tiny", max_choices=2).chat_bodies(CHAT_BODIES)
        await asyncio.gather(*(send(b) for b in HostileBodies(32, 1024, "tiny", max_choices=2).bodies(BODIES)),
                             *(send(b, "/v1/chat/completions") for b in chat))
        done.set()
        await runner
    return alone, neighbours, statuses, problems, chat_statuses


def test_hostile_bodies_beside_a_sampled_stream(daemon):
    alone, neighbours, statuses, problems, chat_statuses = asyncio.run(fuzz(daemon.url))
    assert sum(statuses.values()) == BODIES + CHAT_BODIES
    assert not problems, problems[:5]
    assert set(statuses) <= {200, 400, 404, 429}, statuses
    assert statuses[200] >= 400, statuses  # a good share passed validation and ran in the engine
    assert chat_statuses[200] >= 50 and chat_statuses[400] >= 50, chat_statuses
    assert alone[1] == NEIGHBOUR["max_tokens"] and neighbours
    assert all(n == alone for n in neighbours), [n for n in neighbours if n != alone][:2]
    ready = httpx.get(daemon.url + "/ready", timeout=10)
    assert ready.status_code == 200
    body = ready.json()
    assert body["scheduler"]["running"] == body["scheduler"]["waiting"] == 0
    assert body["kv_slots_free"] == body["kv_slots_total"]
    assert daemon.proc.poll() is None and "Traceback" not in daemon.log()
