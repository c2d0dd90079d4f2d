"""The OpenAI completions protocol: request parsing and validation into a typed CompletionRequest,
the response and SSE chunk shapes, and the error JSON every 4xx/5xx carries."""
from __future__ import annotations

import dataclasses
import math
import secrets
from typing import Any

from lifecycle.params import MAX_CHOICES, MAX_LOGPROBS

MAX_TEMPERATURE = 2.0
MAX_STOP = 4  # stop sequences per request, as OpenAI allows


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
    temperature: float | None  # as sent; None (absent) means greedy, as 0 does
    raw: dict[str, Any]
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    echo: bool = False
    stop: list[str] = dataclasses.field(default_factory=list)
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)
    n: int = 1
    best_of: int | None = None

    @property
    def candidates(self) -> int:
        """How many sequences the engine generates: best_of when given, else n."""
        return self.best_of if self.best_of is not None else self.n


def _typed(body: dict, name: str, kinds: tuple[type, ...], label: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in kinds:
        raise bad_request(f"'{name}' must be {label}, got {type(value).__name__}", name)
    if not isinstance(value, kinds):
        raise bad_request(f"'{name}' must be {label}, got {type(value).__name__}", name)
    return value


def _number(body: dict, name: str, default: float, low: float, high: float, *, open_low: bool = False) -> float:
    value = _typed(body, name, (int, float), "a number")
    if value is None:
        return default
    if value < low or value > high or (open_low and value == low):
        span = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        raise bad_request(f"'{name}' must be in {span}, got {value}", name)
    return float(value)


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP:
        raise bad_request(f"'stop' may hold at most {MAX_STOP} sequences, got {len(stops)}", "stop")
    if any(not s for s in stops):
        raise bad_request("'stop' sequences must not be empty", "stop")
    return list(dict.fromkeys(stops))


def _sampling(body: dict, req: CompletionRequest) -> None:
    """The sampling, log-prob, stop and choice fields, validated into `req`."""
    req.top_p = _number(body, "top_p", 1.0, 0.0, 1.0, open_low=True)
    top_k = _typed(body, "top_k", (int,), "an integer")
    if top_k is not None and (top_k < -1 or top_k == 0):
        raise bad_request(f"'top_k' must be -1 (off) or at least 1, got {top_k}", "top_k")
    req.top_k = -1 if top_k is None else top_k
    req.min_p = _number(body, "min_p", 0.0, 0.0, 1.0)
    req.seed = _typed(body, "seed", (int,), "an integer")
    if req.seed is not None and not -2**63 <= req.seed < 2**63:
        raise bad_request(f"'seed' must be a signed 64-bit integer, got {req.seed}", "seed")
    req.presence_penalty = _number(body, "presence_penalty", 0.0, -2.0, 2.0)
    req.frequency_penalty = _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
    req.repetition_penalty = _number(body, "repetition_penalty", 1.0, 0.0, math.inf, open_low=True)
    req.logprobs = _typed(body, "logprobs", (int,), "an integer")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise bad_request(f"'logprobs' must be in [0, {MAX_LOGPROBS}], got {req.logprobs}", "logprobs")
    req.echo = bool(_typed(body, "echo", (bool,), "a boolean") or False)
    req.stop = _stop(body)
    ids = body.get("stop_token_ids")
    if ids is not None and (not isinstance(ids, list) or
                            not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
        raise bad_request("'stop_token_ids' must be a list of token ids", "stop_token_ids")
    req.stop_token_ids = list(dict.fromkeys(ids or []))
    n = _typed(body, "n", (int,), "an integer")
    if n is not None and not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"'n' must be in [1, {MAX_CHOICES}], got {n}", "n")
    req.n = n or 1
    best_of = _typed(body, "best_of", (int,), "an integer")
    if best_of is not None:
        if not req.n <= best_of <= MAX_CHOICES:
            raise bad_request(f"'best_of' must be in [n, {MAX_CHOICES}] (n is {req.n}), got {best_of}", "best_of")
        if req.stream and best_of > 1:
            raise bad_request("'best_of' greater than 1 cannot be streamed", "best_of")
    req.best_of = best_of


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
    if temperature is not None and not 0 <= temperature <= MAX_TEMPERATURE:
        raise bad_request(f"'temperature' must be in [0, {MAX_TEMPERATURE:g}], got {temperature}", "temperature")
    req = CompletionRequest(model, text, ids, max_tokens, stream, include_usage, ignore_eos, temperature, body)
    _sampling(body, req)
    return req


def completion_id() -> str:
    """A fresh request id: 128 random bits, so that ids cannot be guessed (a cancel needs the id)."""
    return f"cmpl-{secrets.token_hex(16)}"


def chunk(rid: str, created: int, model: str, choices: list[dict]) -> dict:
    """choices: {index, text, logprobs, finish_reason} each."""
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def usage_chunk(rid: str, created: int, model: str, prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}


def completion(rid: str, created: int, model: str, choices: list[dict], prompt_tokens: int,
               completion_tokens: int) -> dict:
    return {**chunk(rid, created, model, choices), "usage": usage(prompt_tokens, completion_tokens)}
