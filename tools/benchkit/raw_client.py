"""bench_serving's lean transport (`--client raw`): streamed /v1/completions over plain HTTP/1.1 on
one kept-alive asyncio connection per worker, with the same records, metric definitions and error
handling as the httpx client (tools/benchkit/client.py), each content chunk timed as its bytes are
read. httpx spends tens of µs a chunk and more a request: at high concurrency the benchmark's own
process can become what turns a wave of requests around, so the server's HTTP cost is best measured
with a client that costs little (vllm bench serve uses aiohttp). http:// only."""
from __future__ import annotations

import asyncio
import codecs
import json
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from tools.benchkit.client import _LINE_END, _error_message, _sse_data, _take_chunk, finish
from tools.benchkit.metrics import RequestRecord


class RawConnection:
    """One HTTP/1.1 keep-alive connection, opened on first use and again after the server closes it."""

    def __init__(self, base_url: str):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"--client raw takes an http:// base URL, got {base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._answered = 0  # responses read on the open connection

    async def _open(self) -> None:
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            self._answered = 0

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        """Send the request and read the response head: (status, lower-cased headers). A kept-alive
        connection the server closed while it was idle is opened again and the request sent once more
        (nothing of it was answered), as httpx's pool does."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body
        for attempt in (0, 1):
            await self._open()
            reused = self._answered > 0
            try:
                self._writer.write(request)
                raw = await self._reader.readuntil(b"\r\n\r\n")
                break
            except (asyncio.IncompleteReadError, ConnectionError) as e:
                self.close()
                if not reused or attempt or (isinstance(e, asyncio.IncompleteReadError) and e.partial):
                    raise
        self._answered += 1
        head = raw.decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        fields = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name:
                fields[name.strip().lower()] = value.strip()
        return status, fields

    async def body(self, fields: dict[str, str]) -> AsyncIterator[bytes]:
        """The response body as it arrives: each chunk of a chunked body, or the whole of a sized one.
        The connection is closed afterwards if the server said so."""
        if fields.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await self._reader.readexactly(size + 2)
                if size == 0:
                    break
                yield data[:-2]
        else:
            yield await self._reader.readexactly(int(fields.get("content-length", "0")))
        if fields.get("connection", "").lower() == "close":
            self.close()


async def send_raw(conn: RawConnection, path: str, body: dict, index: int, timeout: float,
                   headers: dict[str, str] | None = None) -> RequestRecord:
    """One streamed request, as tools/benchkit/client.send records it."""
    rec = RequestRecord(index=index, start=time.perf_counter())
    done = False
    try:
        async with asyncio.timeout(timeout):
            status, fields = await conn.post(path, json.dumps(body).encode(), headers or {})
            rec.request_id = fields.get("x-request-id")
            if status != 200:
                text = b"".join([part async for part in conn.body(fields)]).decode(errors="replace")
                rec.error = f"HTTP {status}: {_error_message(text)}"
                return rec
            pending, text = "", codecs.getincrementaldecoder("utf-8")(errors="replace")
            async for part in conn.body(fields):
                now = time.perf_counter()
                pending += text.decode(part)  # a character cut between two chunks waits for the rest
                *lines, pending = _LINE_END.split(pending)
                for line in lines:
                    data = _sse_data(line)
                    if data is None:
                        continue
                    if data == "[DONE]":
                        done = True
                    elif not done:
                        _take_chunk(rec, data, now)
    except TimeoutError:
        conn.close()  # a response left half read: the connection cannot carry the next request
        rec.timed_out, rec.error = True, f"timed out after {timeout:g} s"
        return rec
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as e:
        conn.close()
        rec.error = f"{type(e).__name__}: {e}"
        return rec
    return finish(rec, done)
