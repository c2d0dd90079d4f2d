"""POST /v1/completions: from the HTTP body to a lifecycle Request (whose engine command, the
contract's Admit, the parsed request builds once), then its output rendered as OpenAI SSE chunks
(or one JSON body). The token sink is the one channel of the output: it wakes the handler and
carries the engine's whole token events (choice, log-probs, finish reason), the prompt's log-probs
and the end; daemon.choices turns them into text, stop strings and log-probs. A choice that hits a
stop string is finished through the scheduler. A client that goes away becomes DISCONNECTED; an
error after the stream started becomes an error chunk and then [DONE]."""
from __future__ import annotations

import asyncio
import math
import time

import orjson
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from pegainfer.daemon import protocol
from pegainfer.daemon.choices import Choices
from pegainfer.daemon.chunk_encoder import ChunkEncoder
from pegainfer.daemon.protocol import APIError, CompletionRequest
from pegainfer.daemon.request_end import end_error, unavailable_reason
from pegainfer.daemon.runtime import Runtime
from pegainfer.daemon.sse import EventStream
from pegainfer.daemon.tokenize_pool import INLINE_MAX_CHARS
from pegainfer.engine.startup_log import log_event
from pegainfer.lifecycle.rejection import Draining, NotReady, QueueFull, Rejection
from pegainfer.lifecycle.request import Request
from pegainfer.lifecycle.sink import SinkEnd, SinkItem, TokenSink
from pegainfer.lifecycle.states import RequestState


def error_response(e: APIError, request_id: str | None = None) -> JSONResponse:
    """The OpenAI error body; a request refused after it got an id carries it in X-Request-Id, so
    the client can find its server records."""
    headers = {**(e.headers or {}), **({"X-Request-Id": request_id} if request_id else {})}
    return JSONResponse(e.body(), status_code=e.status, headers=headers or None)


def rejection_error(r: Rejection) -> APIError:
    if isinstance(r, QueueFull):
        retry = str(max(1, math.ceil(r.retry_after_s or 1)))
        return APIError(429, r.message, "rate_limit_error", None, "queue_full", {"Retry-After": retry})
    if isinstance(r, NotReady):  # an engine failure's reason is server text: the client gets the stable form
        message = "server not ready" if r.reason is None else f"server not ready: {unavailable_reason(r.reason)}"
        return APIError(503, message, "service_unavailable", None, "not_ready", {"Retry-After": "1"})
    if isinstance(r, Draining):
        return APIError(503, r.message, "service_unavailable", None, "draining", {"Retry-After": "1"})
    return APIError(503, r.message, "service_unavailable")


async def read_body(http: HTTPRequest, limit: int, timeout_s: float) -> bytes:
    """The whole body, at most `limit` bytes, within `timeout_s` seconds in all (a client trickling
    its body must not hold the connection: 408, and the connection is closed)."""
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes",
                       "invalid_request_error", None, "request_too_large")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for part in http.stream():
                size += len(part)
                if size > limit:
                    raise APIError(413, f"request body exceeds the limit of {limit} bytes", "invalid_request_error",
                                   None, "request_too_large")
                chunks.append(part)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s ({size} bytes came)",
                       "invalid_request_error", None, "request_timeout", {"Connection": "close"}) from None
    except ClientDisconnect:
        raise APIError(499, "the client closed the connection before its request body arrived",
                       "invalid_request_error", None, "client_disconnected") from None
    return b"".join(chunks)


async def create_completion(http: HTTPRequest, rt: Runtime, owner: str | None = None) -> Response:
    """`owner`: the caller's identity (daemon.access), recorded so that only it may cancel."""
    s = rt.settings
    try:
        raw = await read_body(http, s.max_body_bytes, s.http_body_timeout)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise protocol.bad_request(f"the request body is not valid JSON: {e}") from None
        req = protocol.parse_completion(body, max_tokens_default=s.max_tokens_default)
        if req.model is not None and req.model != rt.model_name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {rt.model_name!r}",
                           "not_found_error", "model", "model_not_found")
        if rt.scheduler is None or rt.tokenizer is None:
            raise rejection_error(NotReady(1.0))
        if req.prompt is not None and (too_long := _prompt_too_long(rt, req)) is not None:
            raise too_long
    except APIError as e:
        rt.telemetry.on_front_rejection(e.status, e.message, http.headers, e.code)
        return error_response(e)

    ids = req.prompt_ids if req.prompt_ids is not None else await rt.tokenize.encode(rt.tokenizer, req.prompt)
    rid = protocol.completion_id()
    request = Request(req.admit(rid, ids), rt.model_name, TokenSink(s.sink_max_buffered), owner=owner)
    rt.telemetry.on_request_start(rid, req, http.headers)
    problem = _context_problem(rt, ids, req)
    if problem is not None:
        rt.scheduler.reject(request, problem.message, problem.code)
        return error_response(problem, rid)
    try:
        rt.scheduler.submit(request)
    except Rejection as r:
        return error_response(rejection_error(r), rid)
    created = int(time.time())
    try:
        choices = Choices(req, rt.tokenizer, ids)
    except Exception as e:  # noqa: BLE001 - this request's own output failed: it alone ends
        return error_response(_output_failed(rt, request, e), rid)
    if req.stream:
        return EventStream(_stream(rt, request, choices, created, req.include_usage), ping_s=15,
                           headers={"X-Request-Id": rid})
    return await _complete(http, rt, request, choices, created)


def _prompt_too_long(rt: Runtime, req: CompletionRequest) -> APIError | None:
    """Refuse, before tokenising it, a long prompt whose length in characters alone shows it cannot
    fit: it has at least tokenizer.min_tokens(characters) tokens (engine/token_bound.py). A short
    one costs less to tokenise than the hop off the loop, and gets the exact count's refusal, with
    its request id and scheduler record."""
    limit, chars = rt.engine.max_model_len, len(req.prompt)
    if chars < INLINE_MAX_CHARS:
        return None
    at_least = rt.tokenizer.min_tokens(chars)
    if at_least + req.max_tokens <= limit:
        return None
    return protocol.bad_request(
        f"this model's maximum context length is {limit} tokens; the prompt is too long: its {chars} characters "
        f"make at least {at_least} tokens, and max_tokens is {req.max_tokens}", "prompt", "context_length_exceeded")


def _context_problem(rt: Runtime, ids: list[int], req: CompletionRequest) -> APIError | None:
    limit, max_tokens = rt.engine.max_model_len, req.max_tokens
    problem = protocol.vocabulary_problem(req, ids, rt.engine.cfg.vocab_size, tokenized=req.prompt_ids is None)
    if problem is not None:
        return problem
    if len(ids) + max_tokens > limit:
        return protocol.bad_request(
            f"this model's maximum context length is {limit} tokens; the prompt has {len(ids)} tokens and "
            f"max_tokens is {max_tokens} ({len(ids) + max_tokens} in all)", "prompt", "context_length_exceeded")
    slots = rt.engine.cache.num_slots
    if req.candidates > slots:
        param = "best_of" if req.best_of is not None and req.best_of > req.n else "n"
        return protocol.bad_request(f"{param} = {req.candidates} needs {req.candidates} KV slots at once; this "
                                    f"server has {slots} (--max-active)", param)
    return None


def _advance(rt: Runtime, request: Request, choices: Choices, item: SinkItem) -> list:
    """Render what one read of the sink brought; choices that hit a stop string are finished through
    the scheduler (which tells the engine)."""
    deltas, stopped = choices.feed(item.tokens, item.prompt)
    for index in stopped:
        rt.scheduler.stop_choice(request.request_id, index)
    return deltas


async def _stream(rt: Runtime, request: Request, choices: Choices, created: int, include_usage: bool):
    """The response's SSE events. What one wake-up releases goes out as one piece (a finished
    request's last chunk, usage and [DONE] together), so that each read costs one ASGI send."""
    rid, model = request.request_id, request.model
    encode = ChunkEncoder(rid, created, model, choices.logprobs).chunk
    try:
        async for item in request.sink:
            try:
                deltas = _advance(rt, request, choices, item)
                end = item.end
                if end is None:
                    if len(deltas) == 1:  # the common case: one choice moved
                        index, d = deltas[0]
                        out = encode(index, d)
                    elif deltas:
                        out = b"".join([encode(index, d) for index, d in deltas])
                    else:
                        continue
                else:
                    if end.state is RequestState.FINISHED:
                        deltas += choices.finish(end.finish_reason.value)
                    events = [encode(index, d) for index, d in deltas]
                    if end.state is not RequestState.FINISHED:
                        events.append(_data(end_error(rid, end).body()))
                    if include_usage:
                        events.append(_data(protocol.usage_chunk(rid, created, model, len(request.prompt_ids),
                                                                 choices.completion_tokens)))
                    events.append(DONE)
                    out = b"".join(events)
            except Exception as e:  # noqa: BLE001 - this request's own output failed: it alone ends
                yield _data(_output_failed(rt, request, e).body()) + DONE
                return
            yield out
    finally:
        # the client went away mid-stream (daemon.sse cancels this generator) or we are exiting
        if not request.is_terminal and rt.scheduler is not None:
            rt.scheduler.disconnect(rid)


def _output_failed(rt: Runtime, request: Request, e: Exception) -> APIError:
    """Rendering one request's output raised (detokenising, a stop string, log-probs): that request
    fails alone (the engine drops it), the log gets one structured line without a traceback, and
    the client a stable message: the details stay in the log."""
    log_event("request_failed", request_id=request.request_id, stage="output", error=f"{type(e).__name__}: {e}")
    if rt.scheduler is not None:
        rt.scheduler.fail(request.request_id, f"output failed: {type(e).__name__}")
    return APIError(500, "the server could not produce this request's output; the request was stopped",
                    "server_error", None, "request_failed")


def _data(obj: dict) -> bytes:
    """One SSE event: a single `data:` line (orjson writes no newline) and the blank line."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def _complete(http: HTTPRequest, rt: Runtime, request: Request, choices: Choices, created: int) -> Response:
    """Non-streaming: wait for the end, watching for the client going away meanwhile."""
    watcher = asyncio.create_task(_wait_disconnect(http))
    end: SinkEnd | None = None
    try:
        while end is None:
            read = asyncio.create_task(request.sink.next())
            done, _ = await asyncio.wait({read, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if read not in done:
                read.cancel()
                rt.scheduler.disconnect(request.request_id)
                return Response(status_code=499)
            item = read.result()
            end = item.end
            _advance(rt, request, choices, item)
        if end.state is not RequestState.FINISHED:
            return error_response(end_error(request.request_id, end), request.request_id)
        choices.finish(end.finish_reason.value)
        return JSONResponse(protocol.completion(request.request_id, created, request.model, choices.final(),
                                                len(request.prompt_ids), choices.completion_tokens),
                            headers={"X-Request-Id": request.request_id})
    except Exception as e:  # noqa: BLE001 - this request's own output failed: it alone ends
        return error_response(_output_failed(rt, request, e), request.request_id)
    finally:
        watcher.cancel()


async def _wait_disconnect(http: HTTPRequest) -> None:
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return
