"""The streaming client for any OpenAI-compatible /v1/completions endpoint (pegainfer, vLLM,
SGLang): one request's timeline as vllm bench serve records it, and closed-loop concurrency
(N workers, each sending its next request as soon as its last one ends)."""
from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable

import httpx

from tools.benchkit.metrics import RequestRecord
from tools.benchkit.sampling import fields as sampling_fields
from tools.benchkit.workload import PromptSpec, closed_loop


class ServerError(RuntimeError):
    """The endpoint cannot be benchmarked at all (unreachable, no models)."""


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def list_models(base_url: str, api_key: str | None = None, timeout: float = 30.0) -> list[dict]:
    try:
        r = httpx.get(base_url.rstrip("/") + "/v1/models", headers=auth_headers(api_key), timeout=timeout)
        r.raise_for_status()
        data = r.json().get("data") or []
    except (httpx.HTTPError, ValueError) as e:
        raise ServerError(f"GET {base_url}/v1/models failed: {e}") from None
    if not data:
        raise ServerError(f"{base_url}/v1/models lists no model")
    return data


def request_body(model: str, prompt: str, max_tokens: int, sampling: dict | None = None) -> dict:
    """Exactly max_tokens tokens (ignore_eos), usage in the stream for the real token counts; greedy
    unless `sampling` gives the request's sampling fields (tools/benchkit/sampling.py)."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, **(sampling or {}),
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}


async def send(client: httpx.AsyncClient, url: str, body: dict, index: int, timeout: float,
               headers: dict[str, str] | None = None) -> RequestRecord:
    """One streamed request. Every way it can go wrong ends as ok=False with the reason."""
    rec = RequestRecord(index=index, start=time.perf_counter())
    done = False
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", url, json=body, headers=headers) as resp:
                rec.request_id = resp.headers.get("x-request-id")
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    rec.error = f"HTTP {resp.status_code}: {_error_message(text)}"
                    return rec
                async for line in sse_lines(resp):
                    now = time.perf_counter()
                    data = _sse_data(line)
                    if data is None:
                        continue
                    if data == "[DONE]":
                        done = True
                        break
                    _take_chunk(rec, data, now)
    except (TimeoutError, httpx.TimeoutException):
        rec.timed_out, rec.error = True, f"timed out after {timeout:g} s"
        return rec
    except httpx.HTTPError as e:
        rec.error = f"{type(e).__name__}: {e}"
        return rec
    return finish(rec, done)


def finish(rec: RequestRecord, done: bool) -> RequestRecord:
    """A stream read to its end (done: it sent data: [DONE]): what it lacked becomes its error; without
    a usage chunk, one token per content chunk (flagged in the report)."""
    if rec.error is None and not done:
        rec.error = "stream ended without data: [DONE]"
    if rec.error is None and not rec.chunk_times:
        rec.error = "no content chunk (nothing to time TTFT by)"
    if rec.error is None and not rec.usage_reported:
        rec.output_tokens = len(rec.chunk_times)
    rec.ok = rec.error is None
    return rec


_LINE_END = re.compile(r"\r\n|\n|\r")


async def sse_lines(resp: httpx.Response) -> AsyncIterator[str]:
    """The stream's lines as the SSE format ends them: CRLF, LF or CR. Not httpx's aiter_lines, which
    splits like str.splitlines, also at U+2028, U+0085, U+001C and the like: JSON carries those raw
    (orjson writes them unescaped), and a chunk cut there would not parse."""
    pending = ""
    async for text in resp.aiter_text():
        pending += text
        *lines, pending = _LINE_END.split(pending)
        for line in lines:
            yield line
    if pending:
        yield pending


def _sse_data(line: str) -> str | None:
    """The payload of an SSE `data:` line; None for blank lines, comments (pings) and other fields."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def _take_chunk(rec: RequestRecord, data: str, now: float) -> None:
    try:
        obj = json.loads(data)
    except ValueError:
        rec.error = rec.error or f"unparseable chunk: {data[:120]!r}"
        return
    if not isinstance(obj, dict):
        rec.error = rec.error or f"unexpected chunk: {data[:120]!r}"
        return
    if "error" in obj:
        err = obj["error"]
        rec.error = rec.error or f"error chunk: {err.get('message', err) if isinstance(err, dict) else err}"
        return
    rec.request_id = rec.request_id or obj.get("id")
    if obj.get("choices"):
        rec.chunk_times.append(now - rec.start)
    usage = obj.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        rec.usage_reported = True
        rec.output_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            rec.prompt_tokens = int(usage["prompt_tokens"])


def _error_message(text: str) -> str:
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    except (ValueError, AttributeError):
        pass
    return text[:200]


async def run_level(base_url: str, model: str, prompts: list[PromptSpec], concurrency: int, max_tokens: int,
                    timeout: float, api_key: str | None = None, *,
                    on_done: Callable[[RequestRecord], None] | None = None,
                    sampling: str = "greedy", window: list[int] | None = None,
                    transport: str = "httpx") -> tuple[list[RequestRecord], float]:
    """Closed loop: `concurrency` workers drain the prompt list. Returns the records (in workload
    order) and the benchmark duration (first send to last completion). sampling: the profile whose
    fields each request takes by its index (tools/benchkit/sampling.py). transport: "httpx" (one
    pooled client) or "raw" (tools/benchkit/raw_client.py: a plain connection per worker)."""
    if transport == "raw":
        return await _run_raw(base_url, model, prompts, concurrency, max_tokens, timeout, api_key,
                              on_done=on_done, sampling=sampling, window=window)
    url = base_url.rstrip("/") + "/v1/completions"
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        async def one(p: PromptSpec) -> RequestRecord:
            body = request_body(model, p.text, max_tokens, sampling_fields(sampling, p.index))
            return await send(client, url, body, p.index, timeout, auth_headers(api_key))
        return await closed_loop(prompts, concurrency, one, on_done, window)


async def _run_raw(base_url: str, model: str, prompts: list[PromptSpec], concurrency: int, max_tokens: int,
                   timeout: float, api_key: str | None, *, on_done: Callable[[RequestRecord], None] | None,
                   sampling: str, window: list[int] | None) -> tuple[list[RequestRecord], float]:
    """run_level over raw connections, one per worker (each sends one request at a time)."""
    from tools.benchkit.raw_client import RawConnection, send_raw
    idle: list[RawConnection] = [RawConnection(base_url) for _ in range(max(1, min(concurrency, len(prompts))))]
    opened = list(idle)

    async def one(p: PromptSpec) -> RequestRecord:
        body = request_body(model, p.text, max_tokens, sampling_fields(sampling, p.index))
        conn = idle.pop()  # a worker holds one request at a time: there is always a free connection
        try:
            return await send_raw(conn, "/v1/completions", body, p.index, timeout, auth_headers(api_key))
        finally:
            idle.append(conn)
    try:
        return await closed_loop(prompts, concurrency, one, on_done, window)
    finally:
        for conn in opened:
            conn.close()
