"""POST /v1/completions and POST /v1/chat/completions: one pipeline from the HTTP body to lifecycle
Requests (each builds its engine command, the contract's Admit, once) and on to the response
(daemon.output), in the completions or the chat shape (daemon.shapes).

A chat body is parsed by daemon.chat into the completions' request plus its messages, which the
checkpoint's chat template (daemon.chat_template) renders into the one prompt; from there the two
are the same. A list of prompts runs as one engine request per prompt, each with the request's
parameters; every prompt is tokenised and checked before any is submitted, so a bad one refuses the
whole request with a 400 before anything runs. The request's id is the caller's X-Request-Id when
it is a sane one (daemon.request_ids)."""
from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from typing import Any

import orjson
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from pegainfer.daemon import protocol
from pegainfer.daemon.chat import CHAT_FIELDS, parse_chat
from pegainfer.daemon.choices import Choices
from pegainfer.daemon.output import Part, Reply, complete, error_response, output_failed, stream
from pegainfer.daemon.protocol import COMPLETION_FIELDS, APIError, CompletionRequest
from pegainfer.daemon.request_end import unavailable_reason
from pegainfer.daemon.request_ids import caller_id
from pegainfer.daemon.runtime import Runtime
from pegainfer.daemon.shapes import CHAT, COMPLETION, Shape
from pegainfer.daemon.sse import EventStream
from pegainfer.daemon.tokenize_pool import INLINE_MAX_CHARS
from pegainfer.engine.kv_capacity import max_new_tokens, request_pages
from pegainfer.lifecycle.rejection import Draining, NotReady, QueueFull, Rejection
from pegainfer.lifecycle.request import Request
from pegainfer.lifecycle.sink import TokenSink


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
    return await _serve(http, rt, owner, COMPLETION)


async def create_chat_completion(http: HTTPRequest, rt: Runtime, owner: str | None = None) -> Response:
    return await _serve(http, rt, owner, CHAT)


async def _serve(http: HTTPRequest, rt: Runtime, owner: str | None, shape: Shape) -> Response:
    try:
        req = await _parse(http, rt, shape)
    except APIError as e:
        rt.telemetry.on_front_rejection(e.status, e.message, http.headers, e.code)
        return error_response(e)
    scheduler = rt.scheduler
    rid, engine_ids = rt.request_ids.claim(caller_id(http.headers), shape.id_prefix, len(req.prompts),
                                           lambda x: scheduler.get(x) is not None)
    streaming = False
    try:
        response = await _run(http, rt, req, shape, (rid, engine_ids, owner))
        streaming = isinstance(response, EventStream)  # the stream frees the id when it ends
        return response
    finally:
        if not streaming:
            rt.request_ids.release(rid)


async def read_json(http: HTTPRequest, rt: Runtime) -> Any:
    """The request body read within the settings' size and time limits and parsed as JSON (a 400 if
    it is not)."""
    s = rt.settings
    raw = await read_body(http, s.max_body_bytes, s.http_body_timeout)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise protocol.bad_request(f"the request body is not valid JSON: {e}") from None


def check_model(rt: Runtime, model: Any) -> None:
    """A 404 unless `model` (the body's, None when left out) is the one this server serves."""
    if model is not None and model != rt.model_name:
        raise APIError(404, f"the model {str(model)[:200]!r} does not exist; this server serves {rt.model_name!r}",
                       "not_found_error", "model", "model_not_found")


async def _parse(http: HTTPRequest, rt: Runtime, shape: Shape) -> CompletionRequest:
    """The body, read, parsed and checked as far as it can be before tokenising; a chat's messages
    rendered into its prompt. Raises the APIError to answer with."""
    s = rt.settings
    body = await read_json(http, rt)
    rt.unknown_fields.note(shape.route, body, CHAT_FIELDS if shape is CHAT else COMPLETION_FIELDS)
    chat = None
    if shape is CHAT:
        chat = parse_chat(body)
        req = chat.completion
    else:
        req = protocol.parse_completion(body, max_tokens_default=s.max_tokens_default)
    check_model(rt, req.model)
    if rt.scheduler is None or rt.tokenizer is None:
        raise rejection_error(NotReady(1.0))
    if chat is not None:
        size = sum(len(m["content"]) for m in chat.messages)
        text = await rt.tokenize.call(size, rt.chat_template.render, chat.messages, chat.add_generation_prompt,
                                      chat.continue_final, chat.template_kwargs)
        if not text:
            raise protocol.bad_request("the chat template rendered these messages as an empty prompt", "messages")
        req.prompt, req.prompts = text, [text]
    _check_prompts(rt, req, shape)
    return req


def _check_prompts(rt: Runtime, req: CompletionRequest, shape: Shape) -> None:
    """What the prompts' number and length alone show, before any is tokenised."""
    count = len(req.prompts)
    snap = rt.scheduler.snapshot() if count > 1 else {"max_active": 1, "max_pending": 0}
    room = int(snap["max_active"]) + int(snap["max_pending"])
    if count > room:
        raise protocol.bad_request(f"'prompt' holds {count} prompts, each of which runs as a request; this server "
                                   f"holds at most {room} at once (--max-active + --max-pending)", "prompt")
    for i, p in enumerate(req.prompts):
        if isinstance(p, str) and (too_long := _prompt_too_long(rt, req, p, shape)) is not None:
            if count > 1:
                too_long.message = f"prompt {i}: {too_long.message}"
            raise too_long


def _prompt_too_long(rt: Runtime, req: CompletionRequest, prompt: str, shape: Shape) -> APIError | None:
    """Refuse, before tokenising it, a long prompt whose length in characters alone shows it cannot
    fit: it has at least tokenizer.min_tokens(characters) tokens (engine/token_bound.py). A short
    one costs less to tokenise than the hop off the loop, and gets the exact count's refusal, with
    its request id and scheduler record."""
    limit, chars = rt.engine.max_model_len, len(prompt)
    if chars < INLINE_MAX_CHARS:
        return None
    at_least = rt.tokenizer.min_tokens(chars, add_bos=req.add_bos)
    max_tokens = req.max_tokens or 1
    if at_least + max_tokens <= limit:
        return None
    return protocol.bad_request(
        f"this model's maximum context length is {limit} tokens; the prompt is too long: its {chars} characters "
        f"make at least {at_least} tokens, and max_tokens is {max_tokens}", shape.prompt_param,
        "context_length_exceeded")


async def _run(http: HTTPRequest, rt: Runtime, req: CompletionRequest, shape: Shape,
               who: tuple[str, list[str], str | None]) -> Response:
    """Tokenise and check every prompt, make and submit their requests, and answer. `who`: the
    public id, the engine requests' ids, the caller's identity."""
    rid, engine_ids, owner = who
    s = rt.settings
    parts, requests, problem = [], [], None
    for i, (eid, prompt) in enumerate(zip(engine_ids, req.prompts, strict=True)):
        part = req.part(prompt)
        ids = prompt if not isinstance(prompt, str) else await rt.tokenize.encode(rt.tokenizer, prompt, req.add_bos)
        found = context_problem(rt, ids, part, shape)
        if found is None and part.max_tokens is None:  # chat without a limit: the rest of the context
            cache = rt.engine.cache  # ... or of what the whole KV cache holds for its choices
            part.max_tokens = min(rt.engine.max_model_len - len(ids),
                                  max_new_tokens(len(ids), part.candidates, cache.num_pages, cache.page_size))
        admitted = part if part.max_tokens is not None else dataclasses.replace(part, max_tokens=1)  # refused anyway
        request = Request(admitted.admit(eid, ids), rt.model_name, TokenSink(s.sink_max_buffered), owner=owner)
        rt.telemetry.on_request_start(eid, part, http.headers)
        parts.append(part)
        requests.append(request)
        if found is not None:  # the whole request is refused: the prompts after this one are not read
            problem = found
            if len(req.prompts) > 1:
                problem.message = f"prompt {i}: {problem.message}"
            break
    rt.request_ids.bind(rid, requests)
    if problem is not None:
        for request in requests:
            rt.scheduler.reject(request, problem.message, problem.code)
        return error_response(problem, rid)
    for k, request in enumerate(requests):
        try:
            rt.scheduler.submit(request)
        except Rejection as r:
            for earlier in requests[:k]:
                rt.scheduler.cancel(earlier.request_id, "another prompt of the same request was refused")
            for later in requests[k + 1:]:
                rt.scheduler.reject(later, r.message, r.code)
            return error_response(rejection_error(r), rid)
    out = Reply(rid, int(time.time()), rt.model_name, [], shape, req.include_usage,
                on_end=lambda: rt.request_ids.release(rid))
    for k, (part, request) in enumerate(zip(parts, requests)):
        try:
            out.parts.append(Part(request, Choices(part, rt.tokenizer, request.prompt_ids), k * req.n))
        except Exception as e:  # noqa: BLE001 - this request's own output failed: it alone ends
            error = output_failed(rt, request, e)
            for other in requests:
                if other is not request:
                    rt.scheduler.cancel(other.request_id, "another prompt of the same request failed")
            return error_response(error, rid)
    if req.stream:
        return EventStream(stream(rt, out), ping_s=15, headers={"X-Request-Id": rid})
    return await complete(http, rt, out)


def context_problem(rt: Runtime, ids: list[int], req: CompletionRequest, shape: Shape) -> APIError | None:
    """What refuses one tokenised prompt before it runs: a token id outside the vocabulary, the
    context limit, more KV cache than the whole cache holds, more candidates than KV slots (tools/benchkit/replay.py applies it too)."""
    limit, max_tokens = rt.engine.max_model_len, req.max_tokens
    problem = protocol.vocabulary_problem(req, ids, rt.engine.cfg.vocab_size, tokenized=req.prompt_ids is None)
    if problem is not None:
        return problem
    if max_tokens is None and len(ids) >= limit:
        return protocol.bad_request(
            f"this model's maximum context length is {limit} tokens; the prompt has {len(ids)} tokens, which leaves "
            f"no room for a reply", shape.prompt_param, "context_length_exceeded")
    if max_tokens is not None and len(ids) + max_tokens > limit:
        if req.echo_only:
            return protocol.bad_request(
                f"this model's maximum context length is {limit} tokens; the prompt has {len(ids)} tokens, and "
                f"scoring it (echo with max_tokens 0) runs one more position: at most {limit - 1} prompt tokens",
                shape.prompt_param, "context_length_exceeded")
        return protocol.bad_request(
            f"this model's maximum context length is {limit} tokens; the prompt has {len(ids)} tokens and "
            f"max_tokens is {max_tokens} ({len(ids) + max_tokens} in all)", shape.prompt_param,
            "context_length_exceeded")
    cache = rt.engine.cache
    need = request_pages(len(ids), max_tokens or 1, req.candidates, cache.page_size)
    if need > cache.num_pages:
        return protocol.bad_request(
            f"this request needs up to {need * cache.page_size} tokens of KV cache ({len(ids)} prompt tokens, "
            f"max_tokens {max_tokens or 1}, {req.candidates} choice(s)); the whole cache of this server holds "
            f"{cache.capacity_tokens} (--kv-cache-tokens)", shape.prompt_param, "context_length_exceeded")
    slots = cache.num_slots
    if req.candidates > slots:
        param = "best_of" if req.best_of is not None and req.best_of > req.n else "n"
        return protocol.bad_request(f"{param} = {req.candidates} needs {req.candidates} KV slots at once; this "
                                    f"server has {slots} (--max-active)", param)
    return None
