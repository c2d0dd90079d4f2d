"""The OpenAI completions protocol: request parsing and validation into a typed CompletionRequest,
the response and SSE chunk shapes, and the error JSON every 4xx/5xx carries."""
from __future__ import annotations

import dataclasses
import time
from typing import Any


@dataclasses.dataclass(slots=True)
class APIError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] | None = None

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def unsupported(param: str, what: str) -> APIError:
    return APIError(400, f"{what} is not supported yet", "invalid_request_error", param, "unsupported_parameter")


@dataclasses.dataclass(slots=True)
class CompletionRequest:
    model: str | None
    prompt: str | None  # exactly one of prompt / prompt_ids
    prompt_ids: list[int] | None
    max_tokens: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    temperature: float | None
    raw: dict[str, Any]


def _typed(body: dict, name: str, kinds: tuple[type, ...], label: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in kinds:
        raise bad_request(f"'{name}' must be {label}, got {type(value).__name__}", name)
    if not isinstance(value, kinds):
        raise bad_request(f"'{name}' must be {label}, got {type(value).__name__}", name)
    return value


def parse_completion(body: Any, *, max_tokens_default: int) -> CompletionRequest:
    """Validate a /v1/completions body. Unknown fields are ignored, as vLLM does."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = _typed(body, "model", (str,), "a string")
    prompt = body.get("prompt")
    text, ids = None, None
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' is empty", "prompt")
        text = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, (str, list)) for t in prompt):
        raise unsupported("prompt", "a batch of several prompts in one request")
    elif prompt is None:
        raise bad_request("'prompt' is required", "prompt")
    elif isinstance(prompt, list) and not prompt:
        raise bad_request("'prompt' is empty", "prompt")
    else:
        raise bad_request("'prompt' must be a string or a list of token ids", "prompt")

    max_tokens = _typed(body, "max_tokens", (int,), "an integer")
    if max_tokens is None:
        max_tokens = max_tokens_default
    if max_tokens < 1:
        raise bad_request(f"'max_tokens' must be at least 1, got {max_tokens}", "max_tokens")
    stream = bool(_typed(body, "stream", (bool,), "a boolean") or False)
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad_request("'stream_options' must be an object", "stream_options")
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        include_usage = bool(opts.get("include_usage", False))
    ignore_eos = bool(_typed(body, "ignore_eos", (bool,), "a boolean") or False)

    temperature = _typed(body, "temperature", (int, float), "a number")
    if temperature is not None and temperature < 0:
        raise bad_request(f"'temperature' must be >= 0, got {temperature}", "temperature")
    if temperature:
        raise unsupported("temperature", "sampling (temperature > 0)")
    top_p = _typed(body, "top_p", (int, float), "a number")
    if top_p is not None and not 0 < top_p <= 1:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p}", "top_p")
    if top_p is not None and top_p < 1:
        raise unsupported("top_p", "nucleus sampling (top_p < 1)")
    n = _typed(body, "n", (int,), "an integer")
    if n is not None and n < 1:
        raise bad_request(f"'n' must be at least 1, got {n}", "n")
    if n is not None and n > 1:
        raise unsupported("n", "n > 1")
    best_of = _typed(body, "best_of", (int,), "an integer")
    if best_of is not None and best_of > 1:
        raise unsupported("best_of", "best_of > 1")
    if body.get("logprobs") is not None:
        _typed(body, "logprobs", (int,), "an integer")
        raise unsupported("logprobs", "logprobs")
    if _typed(body, "echo", (bool,), "a boolean"):
        raise unsupported("echo", "echo")
    if body.get("stop"):
        raise unsupported("stop", "stop sequences")
    for pen in ("presence_penalty", "frequency_penalty"):
        if _typed(body, pen, (int, float), "a number"):
            raise unsupported(pen, pen)
    return CompletionRequest(model, text, ids, max_tokens, stream, include_usage, ignore_eos, temperature, body)


def completion_id(n: int) -> str:
    return f"cmpl-{time.time_ns():x}{n:04x}"


def chunk(rid: str, created: int, model: str, text: str, finish_reason: str | None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def usage_chunk(rid: str, created: int, model: str, prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}


def completion(rid: str, created: int, model: str, text: str, finish_reason: str | None,
               prompt_tokens: int, completion_tokens: int) -> dict:
    return {**chunk(rid, created, model, text, finish_reason), "usage": usage(prompt_tokens, completion_tokens)}
