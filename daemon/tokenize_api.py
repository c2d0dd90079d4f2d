"""vLLM's tokenizer routes: `POST /tokenize` (a prompt, or chat messages rendered by the checkpoint's
template, to the token ids the server would run: `{count, max_model_len, tokens, token_strs}`),
`POST /detokenize` (`{tokens}` to `{prompt}`, special tokens skipped as in replies) and `GET /version`.
They run no engine step; the text is tokenised through the same pool as a completion's prompt
(daemon.tokenize_pool), so a large one does not hold the loop. Bad bodies get the OpenAI error JSON."""
from __future__ import annotations

from importlib import metadata
from typing import Any

import orjson
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from pegainfer.daemon.chat import parse_messages, template_options
from pegainfer.daemon.completions import read_body, rejection_error
from pegainfer.daemon.protocol import APIError, bad_request
from pegainfer.daemon.runtime import Runtime
from pegainfer.engine.contract import INT64_MAX
from pegainfer.engine.tokenizer import Tokenizer
from pegainfer.lifecycle.rejection import NotReady

TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                             "continue_final_message", "chat_template_kwargs", "return_token_strs"})


def version() -> str:
    try:
        return metadata.version("pegainfer")
    except metadata.PackageNotFoundError:  # a source tree run without installing
        return "unknown"


async def tokenize(http: HTTPRequest, rt: Runtime) -> Response:
    body = await _body(http, rt)
    tok = rt.tokenizer
    if "messages" in body:
        messages = parse_messages(body.get("messages"))
        add_gen, cont, kwargs = template_options(body)
        size = sum(len(m["content"]) for m in messages)
        text = await rt.tokenize.call(size, rt.chat_template.render, messages, add_gen, cont, kwargs)
        add_special = _flag(body, "add_special_tokens", False)  # the template writes BOS itself (vLLM's default)
    else:
        text = body.get("prompt")
        if not isinstance(text, str):
            raise bad_request("'prompt' must be a string (or send 'messages')", "prompt")
        add_special = _flag(body, "add_special_tokens", True)
    strs = _flag(body, "return_token_strs", False)
    # off the loop: encoding, the pieces and the JSON of a megabyte prompt take half a second
    payload = await rt.tokenize.call(len(text), _tokenized, tok, text, add_special, strs,
                                     rt.engine.max_model_len if rt.engine else None)
    return Response(payload, media_type="application/json")


def _tokenized(tok: Tokenizer, text: str, add_special: bool, strs: bool, max_model_len: int | None) -> bytes:
    ids = tok.encode(text, add_special)
    return orjson.dumps({"count": len(ids), "max_model_len": max_model_len, "tokens": ids,
                         "token_strs": tok.pieces(ids) if strs else None})


async def detokenize(http: HTTPRequest, rt: Runtime) -> Response:
    body = await _body(http, rt)
    ids = body.get("tokens")
    if not isinstance(ids, list):
        raise bad_request("'tokens' must be a list of token ids", "tokens")
    vocab = rt.tokenizer.vocab_size
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= INT64_MAX:
            raise bad_request(f"'tokens' must hold token ids (integers in [0, 2^63)), got {str(t)[:40]}", "tokens")
        if t >= vocab:
            raise bad_request(f"token id {t} is outside the vocabulary (size {vocab})", "tokens")
    text = await rt.tokenize.call(len(ids), rt.tokenizer.decode, ids)
    return JSONResponse({"prompt": text})


async def _body(http: HTTPRequest, rt: Runtime) -> dict[str, Any]:
    """The JSON object posted, after the checks every route makes: its model is this server's, and the
    tokenizer is loaded."""
    s = rt.settings
    raw = await read_body(http, s.max_body_bytes, s.http_body_timeout)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != rt.model_name:
        raise APIError(404, f"the model {str(model)[:200]!r} does not exist; this server serves {rt.model_name!r}",
                       "not_found_error", "model", "model_not_found")
    if rt.tokenizer is None:
        raise rejection_error(NotReady(1.0))
    return body


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean", name)
    return value
