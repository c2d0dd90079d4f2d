"""The per-request generation parameters the scheduler hands to the engine unchanged, and the one
table of the bounds every numeric parameter must respect. The HTTP protocol (daemon/protocol.py)
checks a request body against the same table, so a bound is written once; what depends on the
model (token ids and top_k against the vocabulary) is checked by the daemon once the model is known."""
from __future__ import annotations

import dataclasses
import math

MAX_LOGPROBS = 5  # the most top log-probs a token may ask for (OpenAI's limit for completions)
MAX_CHOICES = 16  # the most sequences one request may generate (n, or best_of)
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1  # every integer a request carries fits a signed 64-bit one
MAX_LOGIT_BIAS = 100.0  # |bias| per token, as OpenAI documents
MAX_LOGIT_BIAS_ENTRIES = 300  # tokens one request may bias


@dataclasses.dataclass(frozen=True, slots=True)
class Bound:
    """An allowed interval; `integer` demands an int (never a bool or a float)."""
    low: float
    high: float
    integer: bool = False
    open_low: bool = False  # the low end itself is excluded
    off: int | None = None  # an integer below `low` that is allowed and means "off" (top_k's -1)

    def problem(self, name: str, value: object) -> tuple[type[Exception], str] | None:
        """(TypeError or ValueError, message) when `value` is not allowed; None when it is."""
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            kind = "an integer" if self.integer else "a number"
            return TypeError, f"'{name}' must be {kind}, got {type(value).__name__}"
        if value == self.off:
            return None
        nan = isinstance(value, float) and math.isnan(value)
        if nan or value < self.low or value > self.high or (self.open_low and value == self.low):
            return ValueError, f"'{name}' must be {self.describe()}, got {value}"
        return None

    def describe(self) -> str:
        span = f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}]"
        if self.integer and self.high == INT64_MAX:
            span = f">= {self.low:g} (a signed 64-bit integer)" if self.low > INT64_MIN else "a signed 64-bit integer"
        return span if self.off is None else f"{self.off} (off) or {span}"


BOUNDS: dict[str, Bound] = {
    "max_tokens": Bound(1, INT64_MAX, integer=True),
    "temperature": Bound(0.0, 2.0),
    "top_p": Bound(0.0, 1.0, open_low=True),
    "top_k": Bound(1, INT64_MAX, integer=True, off=-1),  # and at most the vocabulary (checked by the daemon)
    "min_p": Bound(0.0, 1.0),
    "seed": Bound(INT64_MIN, INT64_MAX, integer=True),
    "presence_penalty": Bound(-2.0, 2.0),
    "frequency_penalty": Bound(-2.0, 2.0),
    "repetition_penalty": Bound(0.0, 2.0, open_low=True),  # (0, 2], as SGLang; 1 is neutral
    "logprobs": Bound(0, MAX_LOGPROBS, integer=True),
    "prompt_logprobs": Bound(0, MAX_LOGPROBS, integer=True),
    "n": Bound(1, MAX_CHOICES, integer=True),
    "best_of": Bound(1, MAX_CHOICES, integer=True),
    "token_id": Bound(0, INT64_MAX, integer=True),  # a prompt or stop token id (the vocabulary: the daemon)
    "logit_bias": Bound(-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS),
}


def check(name: str, value: object, bound: str | None = None) -> None:
    """Raise TypeError / ValueError unless `value` is allowed for parameter `name` (its bound:
    BOUNDS[bound or name])."""
    found = BOUNDS[bound or name].problem(name, value)
    if found is not None:
        raise found[0](found[1])


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationParams:
    """What the engine needs to generate for one request. Validated here, so that neither the
    scheduler nor the GPU thread ever sees a nonsensical value. The defaults mean greedy decoding
    of one sequence without log-probs. `n` is the number of sequences the engine generates from one
    shared prefill (the API's best_of when it is given, else its n); stop strings are not here:
    the daemon finds them in the text and ends the sequence itself."""
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None  # top-N log-probs of each generated token (0: only the chosen one's)
    prompt_logprobs: int | None = None  # likewise for each prompt token (echo with logprobs)
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), ids distinct

    def __post_init__(self) -> None:
        for name in ("max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                     "frequency_penalty", "repetition_penalty", "n"):
            check(name, getattr(self, name))
        for name in ("seed", "logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                check(name, getattr(self, name))
        if not isinstance(self.stop_token_ids, tuple):
            raise ValueError(f"stop_token_ids must be a tuple of token ids, got {self.stop_token_ids!r}")
        for t in self.stop_token_ids:
            check("stop_token_ids", t, "token_id")
        if not isinstance(self.logit_bias, tuple) or len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES or not all(
                isinstance(e, tuple) and len(e) == 2 for e in self.logit_bias):
            raise ValueError(f"logit_bias must be a tuple of at most {MAX_LOGIT_BIAS_ENTRIES} (token id, bias) pairs")
        for t, bias in self.logit_bias:
            check("logit_bias", t, "token_id")
            check("logit_bias", bias)
        if len({t for t, _ in self.logit_bias}) != len(self.logit_bias):
            raise ValueError("logit_bias names a token id twice")
