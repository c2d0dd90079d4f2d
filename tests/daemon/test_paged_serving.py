"""The paged KV cache through a real daemon with a tiny cache (--kv-cache-tokens 384: 6 pages of 64):
/ready shows the pages, a request longer than the whole cache is a 400 with OpenAI's error JSON,
a repeated prefix is reported in usage.prompt_tokens_details.cached_tokens with the same output,
and concurrent streams that need several times the cache all complete with the tokens each gives
alone (preemptions counted in /metrics), while cancel and disconnect storms leave no page in use."""
from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from tests.daemon_process import DaemonProcess

PAGES = 6
PREFIX = [(i * 29) % 700 + 3 for i in range(150)]  # two full pages and 22 tokens


@pytest.fixture(scope="module")
def daemon(tiny_model_dir):
    with DaemonProcess("--model", str(tiny_model_dir), "--served-model-name", "tiny", "--max-active", "4",
                       "--max-pending", "32", "--max-model-len", "512", "--kv-cache-tokens", str(PAGES * 64)) as d:
        yield d


def ready(d) -> dict:
    return httpx.get(d.url + "/ready", timeout=10).json()


def metric(d, name: str) -> float:
    text = httpx.get(d.url + "/metrics", timeout=10).text
    found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert found, name
    return float(found.group(1))


def complete(d, body: dict) -> dict:
    r = httpx.post(d.url + "/v1/completions", json={"model": "tiny", "ignore_eos": True, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_ready_shows_the_pages(daemon):
    body = ready(daemon)
    assert body["kv_pages"] == {"free": PAGES, "in_use": 0, "total": PAGES, "page_size": 64, "preemptions": 0}
    assert body["kv_slots_total"] == 4


def test_a_request_longer_than_the_whole_cache_is_a_400(daemon):
    r = httpx.post(daemon.url + "/v1/completions", timeout=30,
                   json={"model": "tiny", "prompt": list(range(5, 305)), "max_tokens": 200})  # 500 <= 512, > 384
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == "context_length_exceeded"
    assert "--kv-cache-tokens" in err["message"] and "384" in err["message"]
    n = httpx.post(daemon.url + "/v1/completions", timeout=30,  # n choices count too
                   json={"model": "tiny", "prompt": list(range(5, 105)), "max_tokens": 100, "n": 3})
    assert n.status_code == 400 and n.json()["error"]["code"] == "context_length_exceeded"


def test_a_chat_without_max_tokens_gets_what_the_cache_holds(daemon):
    r = httpx.post(daemon.url + "/v1/chat/completions", timeout=120,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True})
    assert r.status_code == 200, r.text
    u = r.json()["usage"]  # the rest of the 512-token context would not fit in 384 tokens of cache
    assert u["prompt_tokens"] + u["completion_tokens"] == PAGES * 64
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_a_repeated_prefix_is_served_from_the_cache_with_the_same_output(daemon):
    hits = metric(daemon, "pegainfer:prefix_cache_hits_total")
    first = complete(daemon, {"prompt": PREFIX + [9, 9], "max_tokens": 10})
    again = complete(daemon, {"prompt": PREFIX + [9, 9], "max_tokens": 10})
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 128}
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    with httpx.stream("POST", daemon.url + "/v1/completions", timeout=60,
                      json={"model": "tiny", "prompt": PREFIX + [8], "max_tokens": 4, "stream": True,
                            "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 128}
    assert metric(daemon, "pegainfer:prefix_cache_hits_total") == hits + 256
    assert metric(daemon, "pegainfer:prefix_cache_queries_total") >= 3 * 151


async def _stream(client: httpx.AsyncClient, url: str, body: dict, stop_after: int | None = None) -> str:
    """The streamed text; stop_after: leave (disconnect) after that many chunks."""
    text, n = [], 0
    async with client.stream("POST", url + "/v1/completions", json={"model": "tiny", "ignore_eos": True,
                                                                    "stream": True, **body}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                text.append(json.loads(line[6:])["choices"][0]["text"])
                n += 1
                if stop_after is not None and n >= stop_after:
                    break
    return "".join(text)


def test_streams_beyond_the_cache_complete_exactly_and_storms_leak_no_page(daemon):
    bodies = [{"prompt": [(i * 13 + k) % 500 + 4 for k in range(40 + 7 * i)], "max_tokens": 90 + 5 * i}
              for i in range(8)]  # each needs 3 pages at its end; 4 at once need twice the cache
    alone = [complete(daemon, b)["choices"][0]["text"] for b in bodies]
    before = metric(daemon, "pegainfer:num_preemptions_total")

    async def storm() -> tuple[list[str], list[str]]:
        async with httpx.AsyncClient(timeout=120) as client:
            full = await asyncio.gather(*(_stream(client, daemon.url, b) for b in bodies))
            left = await asyncio.gather(*(_stream(client, daemon.url, b, stop_after=3 + i)
                                          for i, b in enumerate(bodies)))
        return list(full), list(left)

    full, _ = asyncio.run(storm())
    assert full == alone
    assert metric(daemon, "pegainfer:num_preemptions_total") > before
    async def cancel_storm() -> list[int]:  # long requests, each cancelled by id after its first chunk
        async with httpx.AsyncClient(timeout=60) as client:
            async def one(i: int) -> int:
                body = {"model": "tiny", "ignore_eos": True, "stream": True, "prompt": [7 + i] * 20, "max_tokens": 330}
                async with client.stream("POST", daemon.url + "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            rid = json.loads(line[6:])["id"]
                            return (await client.post(f"{daemon.url}/v1/completions/{rid}/cancel")).status_code
                return 0
            return list(await asyncio.gather(*(one(i) for i in range(6))))

    assert asyncio.run(cancel_storm()) == [200] * 6
    for _ in range(200):
        body = ready(daemon)
        if body["kv_pages"]["in_use"] == 0 and body["engine"]["running"] == 0:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert body["kv_pages"]["in_use"] == 0 and body["kv_slots_free"] == 4, body
    assert body["kv_pages"]["preemptions"] >= 1
    assert 0.0 <= metric(daemon, "pegainfer:kv_cache_usage_perc") <= 1.0
