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
from pegainfer.daemon.completions import check_model, read_json, rejection_error
from pegainfer.daemon.protocol import bad_request, token_ids
from pegainfer.daemon.runtime import Runtime
from pegainfer.engine.tokenizer import Tokenizer
from pegainfer.lifecycle.rejection import NotReady

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
    ids = token_ids(body.get("tokens"), "tokens")
    vocab = rt.tokenizer.vocab_size
    outside = next((t for t in ids if t >= vocab), None)
    if outside is not None:
        raise bad_request(f"token id {outside} is outside the vocabulary (size {vocab})", "tokens")
    text = await rt.tokenize.call(len(ids), rt.tokenizer.decode, ids)
    return JSONResponse({"prompt": text})


async def _body(http: HTTPRequest, rt: Runtime) -> dict[str, Any]:
    """The JSON object posted, after the checks every route makes: its model is this server's, and the
    tokenizer is loaded."""
    body = await read_json(http, rt)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    check_model(rt, body.get("model"))
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
