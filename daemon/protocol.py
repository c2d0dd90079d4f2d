"""The OpenAI completions protocol: request parsing and validation into a typed CompletionRequest,
the response and SSE chunk shapes, and the error JSON every 4xx/5xx carries."""
from __future__ import annotations

import dataclasses
import math
import secrets
from typing import Any

from lifecycle.params import BOUNDS, INT64_MAX, MAX_CHOICES, MAX_LOGIT_BIAS_ENTRIES

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
    logit_bias: dict[int, float] = dataclasses.field(default_factory=dict)

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


def _bounded(name: str, value: Any) -> Any:
    """`value` if lifecycle.params.BOUNDS allows it for `name` (the one table of bounds), else a 400."""
    found = BOUNDS[name].problem(name, value)
    if found is not None:
        raise bad_request(found[1], name)
    return value


def _number(body: dict, name: str, default: float | None) -> float | None:
    value = body.get(name)
    return default if value is None else float(_bounded(name, value))


def _integer(body: dict, name: str) -> int | None:
    value = body.get(name)
    return None if value is None else _bounded(name, value)


def _token_ids(value: Any, name: str) -> list[int]:
    """A list of token ids: non-negative 64-bit integers (the vocabulary: vocabulary_problem)."""
    if not isinstance(value, list):
        raise bad_request(f"'{name}' must be a list of token ids", name)
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= INT64_MAX:
            raise bad_request(f"'{name}' must hold token ids (integers in [0, 2^63)), got {str(t)[:40]}", name)
    return list(value)


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


def _logit_bias(body: dict) -> dict[int, float]:
    """OpenAI's shape: an object whose keys are token ids (decimal strings) and whose values are
    biases in [-100, 100], added to those tokens' logits before sampling."""
    raw = body.get("logit_bias")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to biases", "logit_bias")
    if len(raw) > MAX_LOGIT_BIAS_ENTRIES:
        raise bad_request(f"'logit_bias' may name at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(raw)}",
                          "logit_bias")
    out: dict[int, float] = {}
    for key, bias in raw.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 19 and int(key) <= INT64_MAX):
            raise bad_request(f"'logit_bias' keys must be token ids (decimal strings), got {key[:24]!r}", "logit_bias")
        token = int(key)
        if token in out:
            raise bad_request(f"'logit_bias' names token {token} twice", "logit_bias")
        out[token] = float(_bounded("logit_bias", bias))
    return out


def _sampling(body: dict, req: CompletionRequest) -> None:
    """The sampling, log-prob, stop and choice fields, validated into `req` against the bounds of
    lifecycle.params (the model-dependent ones: vocabulary_problem)."""
    req.top_p = _number(body, "top_p", 1.0)
    top_k = _integer(body, "top_k")
    req.top_k = -1 if top_k is None else top_k
    req.min_p = _number(body, "min_p", 0.0)
    req.seed = _integer(body, "seed")
    req.presence_penalty = _number(body, "presence_penalty", 0.0)
    req.frequency_penalty = _number(body, "frequency_penalty", 0.0)
    req.repetition_penalty = _number(body, "repetition_penalty", 1.0)
    req.logit_bias = _logit_bias(body)
    req.logprobs = _integer(body, "logprobs")
    req.echo = bool(_typed(body, "echo", (bool,), "a boolean") or False)
    req.stop = _stop(body)
    ids = body.get("stop_token_ids")
    req.stop_token_ids = list(dict.fromkeys(_token_ids(ids, "stop_token_ids"))) if ids is not None else []
    req.n = _integer(body, "n") or 1
    best_of = _integer(body, "best_of")
    if best_of is not None:
        if best_of < req.n:
            raise bad_request(f"'best_of' must be in [n, {MAX_CHOICES}] (n is {req.n}), got {best_of}", "best_of")
        if req.stream and best_of > 1:
            raise bad_request("'best_of' greater than 1 cannot be streamed", "best_of")
    req.best_of = best_of


def parse_completion(body: Any, *, max_tokens_default: int) -> CompletionRequest:
    """Validate a /v1/completions body. Unknown fields are ignored, as vLLM does. Every integer is
    a signed 64-bit one and every number finite and inside its bound, so nothing the engine is
    handed can overflow a device tensor."""
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
        ids = _token_ids(prompt, "prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(t, (str, list)) for t in prompt):
        raise unsupported("prompt", "a batch of several prompts in one request")
    elif prompt is None:
        raise bad_request("'prompt' is required", "prompt")
    elif isinstance(prompt, list) and not prompt:
        raise bad_request("'prompt' is empty", "prompt")
    else:
        raise bad_request("'prompt' must be a string or a list of token ids", "prompt")

    max_tokens = _integer(body, "max_tokens")
    if max_tokens is None:
        max_tokens = max_tokens_default
    stream = bool(_typed(body, "stream", (bool,), "a boolean") or False)
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad_request("'stream_options' must be an object", "stream_options")
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        include_usage = opts.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise bad_request("'stream_options.include_usage' must be a boolean", "stream_options")
    ignore_eos = bool(_typed(body, "ignore_eos", (bool,), "a boolean") or False)
    temperature = _number(body, "temperature", None)
    req = CompletionRequest(model, text, ids, max_tokens, stream, include_usage, ignore_eos, temperature, body)
    _sampling(body, req)
    return req


def vocabulary_problem(req: CompletionRequest, prompt_ids: list[int], vocab: int, *,
                       tokenized: bool = False) -> APIError | None:
    """The bounds that depend on the model, checked once it is known: every token id the request
    names lies in the vocabulary, and top_k is at most its size. tokenized: the prompt ids came from
    the tokenizer, so they are in the vocabulary (scanning 400k of them held the loop for 9 ms)."""
    named = (("prompt", "prompt token id", () if tokenized else prompt_ids), ("stop_token_ids", "stop token id", req.stop_token_ids),
             ("logit_bias", "logit_bias token id", req.logit_bias))
    for param, what, ids in named:
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            return bad_request(f"{what} {bad} is outside the vocabulary [0, {vocab})", param)
    if req.top_k > vocab:
        return bad_request(f"'top_k' must be -1 (off) or in [1, {vocab}] (the vocabulary size), got {req.top_k}",
                           "top_k")
    return None


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
