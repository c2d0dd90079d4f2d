"""A running request's response: its SSE stream or its JSON body, written from its engine requests'
token sinks. A request of one prompt is one engine request; one of several prompts is one per
prompt (daemon.completions), its choices numbered prompt_index * n + choice_index, its usage summed,
and it ends when all of them have: if one of them does not finish (cancelled, failed), the others
are cancelled and the response ends with that one's error.

The token sink is the one channel of each engine request's output: it wakes the handler and
carries the engine's token events (choice, log-probs, finish reason), the prompt's log-probs and
the end; daemon.choices turns them into text, stop strings and log-probs, daemon.shapes into the
completions or the chat shape. A choice that hits a stop string is finished through the scheduler.
A client that goes away becomes DISCONNECTED; an error after the stream started becomes an error
chunk and then [DONE]."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable

import orjson
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from pegainfer.daemon import protocol
from pegainfer.daemon.choices import Choices
from pegainfer.daemon.protocol import APIError
from pegainfer.daemon.request_end import end_error
from pegainfer.daemon.runtime import Runtime
from pegainfer.daemon.shapes import COMPLETION, Shape
from pegainfer.engine.startup_log import log_event
from pegainfer.lifecycle.request import Request
from pegainfer.lifecycle.sink import SinkItem
from pegainfer.lifecycle.states import RequestState

DONE = b"data: [DONE]\n\n"
SIBLING_ENDED = "another prompt of the same request did not finish"


@dataclasses.dataclass(slots=True)
class Part:
    """One engine request of a response: its choices are the response's offset, offset + 1, ..."""
    request: Request
    choices: Choices
    offset: int = 0


@dataclasses.dataclass(slots=True)
class Reply:
    """What a response is written from: its public id, when it was made, its shape and its parts."""
    rid: str
    created: int
    model: str
    parts: list[Part]
    shape: Shape = COMPLETION
    include_usage: bool = False
    on_end: Callable[[], None] | None = None  # called once the response is written (the id is free again)

    def usage(self) -> dict:
        return protocol.usage(sum(len(p.request.prompt_ids) for p in self.parts),
                              sum(p.choices.completion_tokens for p in self.parts),
                              sum(p.request.cached_tokens for p in self.parts))


def error_response(e: APIError, request_id: str | None = None) -> JSONResponse:
    """The OpenAI error body; a request refused after it got an id carries it in X-Request-Id, so
    the client can find its server records."""
    headers = {**(e.headers or {}), **({"X-Request-Id": request_id} if request_id else {})}
    return JSONResponse(e.body(), status_code=e.status, headers=headers or None)


def output_failed(rt: Runtime, request: Request, e: Exception) -> APIError:
    """Rendering one request's output raised (detokenising, a stop string, log-probs): that request
    fails alone (the engine drops it), the log gets one structured line without a traceback, and
    the client a stable message: the details stay in the log."""
    log_event("request_failed", level="error", request_id=request.request_id, stage="output",
              error=f"{type(e).__name__}: {e}")
    if rt.scheduler is not None:
        rt.scheduler.fail(request.request_id, f"output failed: {type(e).__name__}")
    return APIError(500, "the server could not produce this request's output; the request was stopped",
                    "server_error", None, "request_failed")


def _advance(rt: Runtime, part: Part, item: SinkItem) -> list:
    """Render what one read of a sink brought; choices that hit a stop string are finished through
    the scheduler (which tells the engine)."""
    deltas, stopped = part.choices.feed(item.tokens, item.prompt)
    for index in stopped:
        rt.scheduler.stop_choice(part.request.request_id, index)
    return deltas


def _cancel_siblings(rt: Runtime, out: Reply, part: Part) -> None:
    for other in out.parts:
        if other is not part and not other.request.is_terminal:
            rt.scheduler.cancel(other.request.request_id, SIBLING_ENDED)


async def _items(parts: list[Part]) -> AsyncIterator[tuple[Part, SinkItem]]:
    """(part, item) as the parts' sinks release them, until every part has ended."""
    if len(parts) == 1:
        part = parts[0]
        async for item in part.request.sink:
            yield part, item
        return
    reads = {asyncio.ensure_future(p.request.sink.next()): p for p in parts}
    try:
        while reads:
            done, _ = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
            for read in sorted(done, key=lambda r: reads[r].offset):
                part = reads.pop(read)
                item = read.result()
                if item.end is None:
                    reads[asyncio.ensure_future(part.request.sink.next())] = part
                yield part, item
    finally:
        for read in reads:
            read.cancel()


async def stream(rt: Runtime, out: Reply) -> AsyncIterator[bytes]:
    """The response's SSE events. What one wake-up releases goes out as one piece (a finished
    request's last chunk, usage and [DONE] together), so that each read costs one ASGI send."""
    write = _Writer(rt, out)
    try:
        opening = out.shape.opening(out.rid, out.created, out.model, sum(p.choices.n for p in out.parts))
        if opening:
            yield opening
        if len(out.parts) == 1:  # the common case: no merging generator, no offsets, the token path inline
            part, encode = out.parts[0], write.encode
            async for item in part.request.sink:
                if item.end is not None:
                    yield write(part, item)
                    return
                try:
                    deltas = _advance(rt, part, item)
                    if len(deltas) == 1:  # one choice moved
                        index, d = deltas[0]
                        chunk = encode(index, d)
                    elif deltas:
                        chunk = b"".join([encode(index, d) for index, d in deltas])
                    else:
                        continue
                except Exception as e:  # noqa: BLE001 - this request's own output failed: it alone ends
                    yield write.failed(part, e)
                    return
                yield chunk
        else:
            async with contextlib.aclosing(_items(out.parts)) as items:  # its pending reads end with it
                async for part, item in items:
                    if (chunk := write(part, item)) is not None:
                        yield chunk
                        if write.done:
                            return
    finally:
        # the client went away mid-stream (daemon.sse cancels this generator) or we are exiting
        if rt.scheduler is not None:
            for part in out.parts:
                if not part.request.is_terminal:
                    rt.scheduler.disconnect(part.request.request_id)
        if out.on_end is not None:
            out.on_end()


class _Writer:
    """One streamed response's bytes for each read of a part's sink; `done` once the response has
    written [DONE]."""

    __slots__ = ("rt", "out", "encode", "left", "done")

    def __init__(self, rt: Runtime, out: Reply) -> None:
        self.rt, self.out = rt, out
        self.encode = out.shape.encoder(out.rid, out.created, out.model, out.parts[0].choices.logprobs)
        self.left = len(out.parts)  # parts not ended yet
        self.done = False

    def __call__(self, part: Part, item: SinkItem) -> bytes | None:
        rt, out, encode = self.rt, self.out, self.encode
        try:
            deltas = _advance(rt, part, item)
            end, base = item.end, part.offset
            if end is None:
                if len(deltas) == 1:  # the common case: one choice moved
                    index, d = deltas[0]
                    return encode(base + index, d)
                return b"".join([encode(base + index, d) for index, d in deltas]) if deltas else None
            if end.state is RequestState.FINISHED:
                deltas += part.choices.finish(end.finish_reason.value)
            events = [encode(base + index, d) for index, d in deltas]
            self.left -= 1
            if end.state is not RequestState.FINISHED:
                _cancel_siblings(rt, out, part)
                events.append(_data(end_error(part.request.request_id, end).body()))
            elif self.left == 0 and out.include_usage:
                events.append(_data(out.shape.usage_chunk(out.rid, out.created, out.model, out.usage())))
            if end.state is not RequestState.FINISHED or self.left == 0:
                events.append(DONE)
                self.done = True
            return b"".join(events) or None  # a part that ended with nothing left to say, others running
        except Exception as e:  # noqa: BLE001 - this request's own output failed: it alone ends
            return self.failed(part, e)

    def failed(self, part: Part, e: Exception) -> bytes:
        """Rendering `part`'s output raised: it fails, its siblings are cancelled, the response ends."""
        error = output_failed(self.rt, part.request, e)
        _cancel_siblings(self.rt, self.out, part)
        self.done = True
        return _data(error.body()) + DONE


def _data(obj: dict) -> bytes:
    """One SSE event: a single `data:` line (orjson writes no newline) and the blank line."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def complete(http: HTTPRequest, rt: Runtime, out: Reply) -> Response:
    """Non-streaming: wait for every part's end, watching for the client going away meanwhile."""
    watcher = asyncio.create_task(_wait_disconnect(http))
    collect = asyncio.create_task(_collect(rt, out))
    try:
        done, _ = await asyncio.wait({collect, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if collect not in done:
            collect.cancel()
            for part in out.parts:
                if not part.request.is_terminal:
                    rt.scheduler.disconnect(part.request.request_id)
            return Response(status_code=499)
        error = collect.result()
        if error is not None:
            return error_response(error, out.rid)
        try:
            choices = [c for p in out.parts for c in p.choices.final(out.shape, p.offset)]
            body = out.shape.body(out.rid, out.created, out.model, choices, out.usage())
        except Exception as e:  # noqa: BLE001 - this request's own output failed: it alone ends
            return error_response(output_failed(rt, out.parts[0].request, e), out.rid)
        return JSONResponse(body, headers={"X-Request-Id": out.rid})
    finally:
        watcher.cancel()
        if out.on_end is not None:
            out.on_end()


async def _collect(rt: Runtime, out: Reply) -> APIError | None:
    """Read every part to its end; the error to answer with when one of them did not finish."""
    part = out.parts[0]
    try:
        async with contextlib.aclosing(_items(out.parts)) as items:  # its pending reads end with it
            async for part, item in items:
                _advance(rt, part, item)
                end = item.end
                if end is None:
                    continue
                if end.state is not RequestState.FINISHED:
                    _cancel_siblings(rt, out, part)
                    return end_error(part.request.request_id, end)
                part.choices.finish(end.finish_reason.value)
    except Exception as e:  # noqa: BLE001 - this request's own output failed: it alone ends
        error = output_failed(rt, part.request, e)
        _cancel_siblings(rt, out, part)
        return error
    return None


async def _wait_disconnect(http: HTTPRequest) -> None:
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return
