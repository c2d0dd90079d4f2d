"""A fake OpenAI-compatible SSE server for the serving benchmark's tests (tests/tools/test_bench_serving.py,
tests/tools/test_raw_client.py): models that fail every third request (each failure mode once: HTTP 500,
an error chunk, a stream without [DONE]), never answer in time, send no usage, carry raw Unicode line
separators or want a bearer key; every request body it was sent kept in BODIES; `bench` runs
bench_serving against it."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.daemon_process import free_port
from tools import bench_serving

FAIL_DELAY_S = 0.4  # failing requests are slow: if one leaked into an average, the p99s would show it
CHUNK_GAP_S = 0.01
TOKENS = 4
KEY = "sk-test-9f8e7d6c5b4a"


BODIES: list[dict] = []  # every completions request the fake server was sent


def fake_app() -> Starlette:
    counters: dict[str, int] = {}

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": "flaky", "backend": "fake", "maturity": "candidate", "gpu": "Fake GPU 80GB"},
            {"id": "steady"}, {"id": "slow"}, {"id": "nousage"}, {"id": "unicode"}, {"id": "secured"}]})

    async def completions(http: Request) -> Response:
        body = await http.json()
        BODIES.append(body)
        model = body["model"]
        if model == "secured" and http.headers.get("authorization") != f"Bearer {KEY}":
            return JSONResponse({"error": {"message": "invalid api key"}}, status_code=401)
        assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["ignore_eos"]
        n = counters[model] = counters.get(model, 0) + 1
        rid = f"{model}-{n}"
        words = len(body["prompt"].split())
        if model == "slow":
            await asyncio.sleep(30)
        failing = model == "flaky" and n % 3 == 0
        mode = (n // 3) % 3

        if failing and mode == 0:
            await asyncio.sleep(FAIL_DELAY_S)
            return JSONResponse({"error": {"message": "engine fell over"}}, status_code=500)

        def event(obj) -> str:  # "unicode": raw U+2028, U+0085 and U+001C in the JSON, as orjson writes them
            return "data: " + json.dumps(obj, ensure_ascii=model != "unicode") + "\n\n"

        async def stream():
            yield ": ping\n\n"
            for i in range(TOKENS):
                await asyncio.sleep(CHUNK_GAP_S)
                text = f" t{i}\u2028\x85\x1c" if model == "unicode" else f" t{i}"
                yield event({"id": rid, "choices": [{"index": 0, "text": text,
                                                     "finish_reason": "length" if i == TOKENS - 1 else None}]})
            if failing:
                await asyncio.sleep(FAIL_DELAY_S)
                if mode == 1:
                    yield event({"error": {"message": "rank 1 failed"}})
                    yield event({"id": rid, "choices": [], "usage": {"prompt_tokens": words, "completion_tokens": 99}})
                    yield "data: [DONE]\n\n"
                else:  # usage, then the stream just ends
                    yield event({"id": rid, "choices": [], "usage": {"prompt_tokens": words, "completion_tokens": 99}})
                return
            if model != "nousage":
                yield event({"id": rid, "choices": [], "usage": {"prompt_tokens": words, "completion_tokens": TOKENS}})
            yield "data: [DONE]\n\n"

        headers = {"X-Request-Id": rid} if model != "steady" else {}  # steady: ids from the chunks
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])])


@pytest.fixture(scope="module")
def fake_server():
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(fake_app(), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "fake server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "report.json"
    assert bench_serving.main([*args, "--out", str(out)]) == 0
    assert out.with_suffix(".md").is_file()
    return json.loads(out.read_text())
