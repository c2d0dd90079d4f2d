"""The OpenAI completions protocol: request parsing and validation into a typed CompletionRequest,
the response and SSE chunk shapes, and the error JSON every 4xx/5xx carries.

Parsing is where every request field is checked, once: the HTTP-shaped fields (prompt, stream,
echo, stop strings, n, best_of) here, and the sampling parameters by the contract's
SamplingParams.checked against its one table of bounds (engine/contract.py). The parsed request
then builds the engine's Admit command (`admit`), which the lifecycle carries to the engine as it
is; the engine only asserts what the parse guaranteed."""
from __future__ import annotations

import dataclasses
import secrets
from typing import Any

from pegainfer.engine.contract import (
    BOUNDS,
    INT64_MAX,
    MAX_CHOICES,
    Admit,
    ParamError,
    SamplingParams,
)

MAX_STOP = 4  # stop sequences per request, as OpenAI allows
# A list of prompts runs as one engine request per prompt (daemon.completions): at most MAX_PROMPTS of
# them, and at most MAX_SEQUENCES sequences in all (prompts x max(n, best_of)).
MAX_PROMPTS = 64
MAX_SEQUENCES = 256
# vLLM's extensions this server does not have, each with the value that asks for nothing: a request
# that sets one otherwise is a 400 naming it (never silently unconstrained or cut differently).
VLLM_UNSUPPORTED = {"guided_json": None, "guided_regex": None, "guided_choice": None, "guided_grammar": None,
                    "structured_outputs": None, "min_tokens": 0, "skip_special_tokens": True}

# The fields of /v1/completions this server knows; any other is ignored (as vLLM does) and logged once
# (daemon.unknown_fields).
COMPLETION_FIELDS = frozenset({
    "model", "prompt", "max_tokens", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "seed",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs", "echo", "stop", "stop_token_ids",
    "n", "best_of", "logit_bias", "ignore_eos", "suffix", "user", "response_format", "include_stop_str_in_output",
    *VLLM_UNSUPPORTED})

Prompt = str | list[int]  # one prompt: text, or token ids


def refuse_unsupported_output(body: dict) -> None:
    """A 400 on either route for a `response_format` other than text, or for a vLLM extension in
    VLLM_UNSUPPORTED set to anything but its no-op value (null counts as the no-op too)."""
    if body.get("response_format") not in (None, {"type": "text"}):
        raise unsupported("response_format", "a response_format other than {\"type\": \"text\"} (structured output)",
                          yet=False)
    for name, neutral in VLLM_UNSUPPORTED.items():
        value = body.get(name)
        if value is not None and value != neutral:
            shaped = name.startswith(("guided_", "structured"))
            raise unsupported(name, f"structured output ({name})" if shaped else f"'{name}': {value!r:.40}", yet=False)


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


def unsupported(param: str, what: str, *, yet: bool = True) -> APIError:
    return APIError(400, f"{what} is not supported{' yet' if yet else ''}", "invalid_request_error", param,
                    "unsupported_parameter")


@dataclasses.dataclass(slots=True)
class CompletionRequest:
    model: str | None
    prompt: str | None  # exactly one of prompt / prompt_ids: the first prompt (`part` gives each one)
    prompt_ids: list[int] | None
    max_tokens: int | None  # None: the rest of the context (chat completions without a limit)
    stream: bool
    include_usage: bool
    ignore_eos: bool
    raw: dict[str, Any]
    # what the engine runs: the API's logprobs for generated tokens (0 with best_of > n, which ranks
    # candidates by their log-probs), and for the prompt's tokens with echo
    sampling: SamplingParams = SamplingParams()
    logprobs: int | None = None  # as the API asked (the response carries log-probs when not None)
    echo: bool = False
    # echo with max_tokens 0 (OpenAI's and vLLM's prompt scoring): the engine makes one token, which
    # the reply leaves out: the prompt (and its log-probs) alone, finish_reason "length", 0 tokens billed
    echo_only: bool = False
    stop: list[str] = dataclasses.field(default_factory=list)
    include_stop: bool = False  # vLLM's include_stop_str_in_output: a stop string ends the text, not cut from it
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)
    n: int = 1
    best_of: int | None = None
    prompts: list[Prompt] = dataclasses.field(default_factory=list)  # every prompt, in the API's order
    add_bos: bool = True  # text prompts get BOS in front (a chat template writes its own)

    def part(self, prompt: Prompt) -> CompletionRequest:
        """This request for one of its prompts (a list of prompts runs one engine request each)."""
        if len(self.prompts) == 1 and self.prompts[0] is prompt:
            return self  # already the one prompt's request
        text, ids = (prompt, None) if isinstance(prompt, str) else (None, prompt)
        return dataclasses.replace(self, prompt=text, prompt_ids=ids, prompts=[prompt])

    @property
    def candidates(self) -> int:
        """How many sequences the engine generates: best_of when given, else n."""
        return self.best_of if self.best_of is not None else self.n

    def admit(self, request_id: str, prompt_ids: list[int]) -> Admit:
        """The engine's command for this request: built once, carried unchanged by the lifecycle.
        max_tokens must be known by now (daemon.completions fills in the rest of the context)."""
        assert self.max_tokens is not None, "max_tokens is set before the request is admitted"
        return Admit(request_id, prompt_ids, self.max_tokens, self.ignore_eos, self.sampling, self.candidates,
                     tuple(self.stop_token_ids))


def _typed(body: dict, name: str, kinds: tuple[type, ...], label: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in kinds:
        raise bad_request(f"'{name}' must be {label}, got {type(value).__name__}", name)
    if not isinstance(value, kinds):
        raise bad_request(f"'{name}' must be {label}, got {type(value).__name__}", name)
    return value


# the fields that take an integer (the contract's integer bounds and the chat API's own two)
INTEGER_FIELDS = frozenset({name for name, bound in BOUNDS.items() if bound.integer}
                           | {"max_completion_tokens", "top_logprobs"})


def whole(value: Any) -> Any:
    """A whole float as its int (5.0 is 5), as vLLM's pydantic models take it; anything else as it
    is: a fraction stays a float (a 400 later), and so does one past 2^53, where a float no longer
    names one integer (a JSON integer beyond 64 bits parses as such a float: -2^63 - 1 would round
    to the valid -2^63)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def whole_numbers(body: Any) -> Any:
    """The body with whole floats made ints (`whole`) in the integer fields, as vLLM's pydantic
    models take them (token-id lists: token_ids)."""
    if not isinstance(body, dict):
        return body
    fixed = {name: n for name, value in body.items()
             if name in INTEGER_FIELDS and isinstance(value, float) and (n := whole(value)) is not value}
    return {**body, **fixed} if fixed else body


def _integer(body: dict, name: str) -> int | None:
    """An integer field, None when absent; a 400 unless the contract's BOUNDS allow it."""
    value = body.get(name)
    if value is None:
        return None
    found = BOUNDS[name].problem(name, value)
    if found is not None:
        raise bad_request(str(found), name)
    return value


def token_ids(value: Any, name: str) -> list[int]:
    """A list of token ids: non-negative 64-bit integers, whole floats taken as theirs (`whole`); the
    vocabulary: vocabulary_problem. Returns a new list."""
    if not isinstance(value, list):
        raise bad_request(f"'{name}' must be a list of token ids", name)
    ids = [whole(t) for t in value]
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= INT64_MAX:
            raise bad_request(f"'{name}' must hold token ids (integers in [0, 2^63)), got {str(t)[:40]}", name)
    return ids


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


def _logit_bias(body: dict) -> tuple[tuple[int, Any], ...]:
    """OpenAI's shape: an object whose keys are token ids (decimal strings) and whose values are
    biases, as (token id, bias) pairs; the contract checks the biases, their number and repeats."""
    raw = body.get("logit_bias")
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to biases", "logit_bias")
    for key in raw:
        if not (key.isascii() and key.isdigit() and len(key) <= 19 and int(key) <= INT64_MAX):
            raise bad_request(f"'logit_bias' keys must be token ids (decimal strings), got {key[:24]!r}", "logit_bias")
    return tuple((int(key), bias) for key, bias in raw.items())


def _choices(body: dict, req: CompletionRequest) -> None:
    """The HTTP-shaped fields after the sampling ones: echo, stop strings and ids, n and best_of."""
    req.echo = bool(_typed(body, "echo", (bool,), "a boolean") or False)
    req.stop = _stop(body)
    req.include_stop = bool(_typed(body, "include_stop_str_in_output", (bool,), "a boolean"))
    ids = body.get("stop_token_ids")
    req.stop_token_ids = list(dict.fromkeys(token_ids(ids, "stop_token_ids"))) if ids is not None else []
    req.n = _integer(body, "n") or 1
    best_of = _integer(body, "best_of")
    if best_of is not None:
        if best_of < req.n:
            raise bad_request(f"'best_of' must be in [n, {MAX_CHOICES}] (n is {req.n}), got {best_of}", "best_of")
        if req.stream and best_of > 1:
            raise bad_request("'best_of' greater than 1 cannot be streamed", "best_of")
    req.best_of = best_of


def _sampling(body: dict) -> SamplingParams:
    """The sampling parameters as sent, checked by the contract (the one check); a 400 naming the
    first field outside its bound. logprobs is the API's here; `parse_completion` then sets what
    the engine runs."""
    sent = {name: body.get(name) for name in ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                                              "frequency_penalty", "repetition_penalty", "logprobs")}
    try:
        return SamplingParams.checked(**sent, logit_bias=_logit_bias(body))
    except ParamError as e:
        raise bad_request(str(e), e.param) from None


def parse_completion(body: Any, *, max_tokens_default: int) -> CompletionRequest:
    """Validate a /v1/completions body. Unknown fields are ignored, as vLLM does (the handler logs each
    name once: daemon.unknown_fields). Every integer is
    a signed 64-bit one and every number finite and inside its bound, so nothing the engine is
    handed can overflow a device tensor."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    body = whole_numbers(body)
    model = _typed(body, "model", (str,), "a string")
    _typed(body, "user", (str,), "a string")  # OpenAI's end-user id: unused here, but typed as the API types it
    if body.get("suffix") is not None:
        raise unsupported("suffix", "'suffix' (insertion)", yet=False)
    refuse_unsupported_output(body)  # vLLM's completions take a response_format too
    prompts = _prompts(body.get("prompt"))

    echo_only = body.get("max_tokens") == 0 and body.get("echo") is True and not isinstance(body["max_tokens"], bool)
    max_tokens = 1 if echo_only else _integer(body, "max_tokens")
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
        include_usage = opts.get("include_usage")
        include_usage = False if include_usage is None else include_usage  # null: not asked (vLLM's Optional[bool])
        if not isinstance(include_usage, bool):
            raise bad_request("'stream_options.include_usage' must be a boolean", "stream_options")
    ignore_eos = bool(_typed(body, "ignore_eos", (bool,), "a boolean") or False)
    sampling = _sampling(body)
    first = prompts[0]
    req = CompletionRequest(model, first if isinstance(first, str) else None, None if isinstance(first, str) else first,
                            max_tokens, stream, include_usage, ignore_eos, body, logprobs=sampling.logprobs,
                            prompts=prompts, echo_only=echo_only)
    _choices(body, req)
    # best_of ranks candidates by cumulative log-prob: the engine reports the chosen tokens' log-probs
    # whenever there is a choice to make; echo with logprobs asks for the prompt's too
    engine_logprobs = req.logprobs if req.logprobs is not None else (0 if req.candidates > req.n else None)
    req.sampling = dataclasses.replace(sampling, logprobs=engine_logprobs,
                                       prompt_logprobs=req.logprobs if req.echo else None)
    if len(prompts) * req.candidates > MAX_SEQUENCES:
        raise bad_request(f"{len(prompts)} prompts x {req.candidates} choices make {len(prompts) * req.candidates} "
                          f"sequences; one request may run at most {MAX_SEQUENCES}", "prompt")
    return req


def _prompts(prompt: Any) -> list[Prompt]:
    """OpenAI's four forms: a string, a list of token ids, a list of strings, a list of token-id
    lists; each prompt non-empty, at most MAX_PROMPTS of them."""
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' is empty", "prompt")
        return [prompt]
    if prompt is None:
        raise bad_request("'prompt' is required", "prompt")
    if not isinstance(prompt, list):
        raise bad_request("'prompt' must be a string, a list of strings, a list of token ids or a list of "
                          "token-id lists", "prompt")
    if not prompt:
        raise bad_request("'prompt' is empty", "prompt")
    if all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in prompt):
        return [token_ids(prompt, "prompt")]
    if len(prompt) > MAX_PROMPTS:
        raise bad_request(f"'prompt' holds {len(prompt)} prompts; one request may hold at most {MAX_PROMPTS}",
                          "prompt")
    if all(isinstance(p, str) for p in prompt):
        if (empty := next((i for i, p in enumerate(prompt) if not p), None)) is not None:
            raise bad_request(f"'prompt[{empty}]' is empty", "prompt")
        return list(prompt)
    if all(isinstance(p, list) for p in prompt):
        for i, p in enumerate(prompt):
            if not p:
                raise bad_request(f"'prompt[{i}]' is empty", "prompt")
        return [token_ids(p, "prompt") for p in prompt]
    raise bad_request("'prompt' must be a string, a list of token ids, a list of strings or a list of token-id "
                      "lists (not a mix)", "prompt")


def vocabulary_problem(req: CompletionRequest, prompt_ids: list[int], vocab: int, *,
                       tokenized: bool = False) -> APIError | None:
    """The bounds that depend on the model, checked once it is known: every token id the request
    names lies in the vocabulary, and top_k is at most its size. tokenized: the prompt ids came from
    the tokenizer, so they are in the vocabulary (scanning 400k of them held the loop for 9 ms)."""
    named = (("prompt", "prompt token id", () if tokenized else prompt_ids), ("stop_token_ids", "stop token id", req.stop_token_ids),
             ("logit_bias", "logit_bias token id", [t for t, _ in req.sampling.logit_bias]))
    for param, what, ids in named:
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            return bad_request(f"{what} {bad} is outside the vocabulary [0, {vocab})", param)
    top_k = req.sampling.top_k
    if top_k > vocab:
        return bad_request(f"'top_k' must be -1 or 0 (off) or in [1, {vocab}] (the vocabulary size), got {top_k}",
                           "top_k")
    return None


def completion_id(prefix: str = "cmpl-") -> str:
    """A fresh request id: 128 random bits, so that ids cannot be guessed (a cancel needs the id)."""
    return f"{prefix}{secrets.token_hex(16)}"


def chunk(rid: str, created: int, model: str, choices: list[dict]) -> dict:
    """choices: {index, text, logprobs, finish_reason} each."""
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage; prompt_tokens_details.cached_tokens: prompt tokens served from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def usage_chunk(rid: str, created: int, model: str, prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}


def completion(rid: str, created: int, model: str, choices: list[dict], prompt_tokens: int,
               completion_tokens: int) -> dict:
    return {**chunk(rid, created, model, choices), "usage": usage(prompt_tokens, completion_tokens)}
