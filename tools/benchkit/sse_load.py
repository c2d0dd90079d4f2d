"""A lean closed-loop load generator for streamed /v1/completions: raw HTTP/1.1 over keep-alive
asyncio connections, chunked bodies split into SSE events, JSON parsed only for the usage chunk.
It exists so that a host-path measurement on a small machine spends its cores on the server, not on
the client (httpx costs tens of µs per chunk); tools/benchkit/client.py stays the benchmark client.

    python -m tools.benchkit.sse_load --port P --concurrency N --num-requests M --max-tokens T
        [--prompt-words W] [--seed S] [--model NAME]

Prints one JSON object: requests, failed, completion_tokens, content_chunks, duration_s."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.benchkit.workload import PROFILES, make_prompts  # noqa: E402


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader, self.writer, self.host = reader, writer, host

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (path.encode(), self.host.encode(), len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await self.reader.readexactly(size + 2)
                if size == 0:
                    return status, b"".join(parts)
                parts.append(data[:-2])
        length = next((int(line.split(b":")[1]) for line in lower.split(b"\r\n") if line.startswith(b"content-length:")),
                      0)
        return status, await self.reader.readexactly(length)


def _count(body: bytes) -> tuple[int, int, bool]:
    """(content chunks, completion tokens from the usage chunk, saw [DONE] without an error)."""
    chunks, tokens, ok = 0, 0, False
    for event in body.split(b"\n\n"):
        event = event.strip()
        if not event.startswith(b"data:"):
            continue
        data = event[5:].strip()
        if data == b"[DONE]":
            ok = True
        elif b'"error"' in data[:12]:
            return chunks, tokens, False
        elif b'"usage"' in data:
            tokens = json.loads(data)["usage"]["completion_tokens"]
        else:
            chunks += 1
    return chunks, tokens, ok


async def run(host: str, port: int, concurrency: int, bodies: list[bytes]) -> dict:
    pending = iter(bodies)
    totals = {"requests": 0, "failed": 0, "completion_tokens": 0, "content_chunks": 0}

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        conn = _Conn(reader, writer, f"{host}:{port}")
        try:
            for body in pending:
                status, data = await conn.post("/v1/completions", body)
                chunks, tokens, ok = _count(data)
                totals["requests"] += 1
                totals["failed"] += not (ok and status == 200)
                totals["completion_tokens"] += tokens
                totals["content_chunks"] += chunks
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(bodies)))))
    return {**totals, "duration_s": time.perf_counter() - t0}


def bodies(model: str, n: int, max_tokens: int, words: int, seed: int, first_index: int = 0) -> list[bytes]:
    """Greedy, exactly max_tokens (ignore_eos), usage in the stream: bench_serving's request shape."""
    return [json.dumps({"model": model, "prompt": p.text, "max_tokens": max_tokens, "temperature": 0.0,
                        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}).encode()
            for p in make_prompts(PROFILES["short"], n, seed, words, first_index)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--num-requests", type=int, required=True)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first-index", type=int, default=0, help="index of the first prompt of the workload")
    a = p.parse_args(argv)
    work = bodies(a.model, a.num_requests, a.max_tokens, a.prompt_words, a.seed, a.first_index)
    try:
        import uvloop
        result = uvloop.run(run(a.host, a.port, a.concurrency, work))
    except ImportError:  # pragma: no cover
        result = asyncio.run(run(a.host, a.port, a.concurrency, work))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
