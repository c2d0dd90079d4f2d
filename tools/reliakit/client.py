"""The runner's HTTP client: streamed /v1/completions with every way to end one on purpose (read
to the end, close after the first token, close the raw connection after the first response bytes),
plain posts of bodies the server must refuse, the cancel endpoint, and /ready snapshots. Each
request carries a W3C traceparent whose trace id is the observation's, so that the server's
request span can be found for every request, refused ones included."""
from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx

from tools.benchkit.client import sse_lines
from tools.reliakit import observation as o
from tools.reliakit.observation import RequestObservation

Clock = Callable[[], float]
EARLY_BYTES_TIMEOUT_S = 10.0
# The bearer header every request of the run carries (tools/reliability.py --api-key, for --url
# against a server started with --api-key); empty: none. Never written into the artifact.
AUTH: dict[str, str] = {}


def use_key(key: str | None) -> None:
    AUTH.clear()
    if key:
        AUTH["authorization"] = f"Bearer {key}"


def _headers(obs: RequestObservation) -> dict[str, str]:
    return {"traceparent": obs.traceparent(), "content-type": "application/json"}


def _payload(obs: RequestObservation) -> bytes:
    return obs.body if isinstance(obs.body, bytes) else json.dumps(obs.body).encode()


def _error_of(raw: bytes) -> tuple[object, object]:
    """(the whole JSON error body, its "error" member); (text, None) when it is not JSON."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:300], None
    return body, body.get("error") if isinstance(body, dict) else None


def _finish(obs: RequestObservation, now: Clock) -> None:
    obs.end_s = now()
    obs.text_sha256 = hashlib.sha256(obs.text.encode()).hexdigest()


async def stream(client: httpx.AsyncClient, obs: RequestObservation, now: Clock, *, timeout: float,
                 close_after_first_token: bool = False, first_token: asyncio.Event | None = None,
                 chunk_times: list[float] | None = None) -> None:
    """Send obs.body and read the SSE stream; the outcome and everything seen land on `obs` (and the
    arrival time of every event on `chunk_times`, when given)."""
    obs.start_s = now()
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", "/v1/completions", content=_payload(obs), headers=_headers(obs)) as r:
                obs.status = r.status_code
                obs.request_id = r.headers.get("x-request-id")
                obs.retry_after = r.headers.get("retry-after")
                if r.status_code != 200:
                    obs.error_body, obs.error = _error_of(await r.aread())
                    obs.outcome = o.HTTP_ERROR
                    return
                async for line in sse_lines(r):  # CR/LF line ends only: JSON may carry U+2028 raw
                    if not line.startswith("data:"):
                        continue
                    if chunk_times is not None:
                        chunk_times.append(now())
                    data = line[5:].strip()
                    if data == "[DONE]":
                        obs.done = True
                        break
                    if _take(obs, data, now) and close_after_first_token:
                        obs.outcome = o.CLOSED
                        break
                    if obs.first_token_s is not None and first_token is not None:
                        first_token.set()
    except (TimeoutError, httpx.TimeoutException):
        obs.outcome, obs.note = o.TIMED_OUT, f"no end within {timeout:g} s"
    except httpx.HTTPError as e:
        obs.outcome, obs.note = o.CONNECTION_ERROR, f"{type(e).__name__}: {e}"
    finally:
        if first_token is not None:
            first_token.set()  # never leave a waiter hanging on a request that ended early
        _finish(obs, now)
    if obs.outcome == o.NOT_SENT:
        if obs.error_body is not None:
            obs.outcome = o.ERROR_CHUNK
        elif obs.done and obs.finish_reason is not None:
            obs.outcome = o.COMPLETED
        else:
            obs.outcome = o.INCOMPLETE


def _take(obs: RequestObservation, data: str, now: Clock) -> bool:
    """One chunk; True when it carried the first text."""
    try:
        chunk = json.loads(data)
    except ValueError:
        obs.note = obs.note or f"unparseable chunk {data[:80]!r}"
        return False
    if not isinstance(chunk, dict):
        return False
    if "error" in chunk:
        obs.error_body, obs.error = chunk, chunk["error"]
        return False
    obs.request_id = obs.request_id or chunk.get("id")
    first = False
    for choice in chunk.get("choices") or []:
        if choice.get("text"):
            first = obs.first_token_s is None
            if first:
                obs.first_token_s = now()
            obs.text += choice["text"]
        if choice.get("finish_reason"):
            obs.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        obs.tokens = int(usage["completion_tokens"])
    return first


async def close_after_early_bytes(base_url: str, obs: RequestObservation, now: Clock) -> None:
    """Raw socket: send the request, read until the response head has arrived, close the
    connection. The server has a live request and a client that is gone."""
    u = urlsplit(base_url)
    payload = _payload(obs)
    auth = "".join(f"{name}: {value}\r\n" for name, value in AUTH.items())
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\ncontent-type: application/json\r\n"
            f"traceparent: {obs.traceparent()}\r\n{auth}content-length: {len(payload)}\r\n\r\n").encode()
    obs.start_s = now()
    writer = None
    try:
        async with asyncio.timeout(EARLY_BYTES_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(u.hostname, u.port)
            writer.write(head + payload)
            await writer.drain()
            seen = b""
            while b"\r\n\r\n" not in seen:
                part = await reader.read(4096)
                if not part:
                    break
                seen += part
        lines = seen.split(b"\r\n\r\n", 1)[0].decode(errors="replace").split("\r\n")
        obs.status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "x-request-id":
                obs.request_id = value.strip()
        obs.outcome = o.CLOSED
        obs.note = f"closed after {len(seen)} response bytes"
    except TimeoutError:
        obs.outcome, obs.note = o.TIMED_OUT, f"no response head within {EARLY_BYTES_TIMEOUT_S:g} s"
    except OSError as e:
        obs.outcome, obs.note = o.CONNECTION_ERROR, f"{type(e).__name__}: {e}"
    finally:
        if writer is not None:
            writer.close()
        _finish(obs, now)


async def post(client: httpx.AsyncClient, obs: RequestObservation, now: Clock, *, timeout: float) -> None:
    """A request that the server is expected to refuse: read the whole answer."""
    obs.start_s = now()
    try:
        r = await client.post("/v1/completions", content=_payload(obs), headers=_headers(obs), timeout=timeout)
    except (TimeoutError, httpx.TimeoutException):
        obs.outcome, obs.note = o.TIMED_OUT, f"no answer within {timeout:g} s"
        _finish(obs, now)
        return
    except httpx.HTTPError as e:
        obs.outcome, obs.note = o.CONNECTION_ERROR, f"{type(e).__name__}: {e}"
        _finish(obs, now)
        return
    obs.status = r.status_code
    obs.request_id = r.headers.get("x-request-id")
    obs.retry_after = r.headers.get("retry-after")
    if r.status_code >= 400:
        obs.error_body, obs.error = _error_of(r.content)
        obs.outcome = o.HTTP_ERROR
    else:  # accepted although it should not have been: keep what came back for the report
        obs.outcome = o.INCOMPLETE
        obs.note = f"accepted with {r.status_code}: {r.text[:120]!r}"
    _finish(obs, now)


async def cancel(client: httpx.AsyncClient, request_id: str | None) -> int | None:
    if not request_id:
        return None
    try:
        r = await client.post(f"/v1/completions/{request_id}/cancel", timeout=10)
    except httpx.HTTPError:
        return None
    return r.status_code


async def ready(client: httpx.AsyncClient, timeout: float = 5.0) -> tuple[int | None, dict]:
    """(status, body) of GET /ready; (None, {}) when the server does not answer."""
    try:
        r = await client.get("/ready", timeout=timeout)
    except httpx.HTTPError:
        return None, {}
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, {}
