"""The per-request generation parameters the scheduler hands to the engine unchanged."""
from __future__ import annotations

import dataclasses
import math

MAX_LOGPROBS = 5  # the most top log-probs a token may ask for (OpenAI's limit for completions)
MAX_CHOICES = 16  # the most sequences one request may generate (n, or best_of)


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

    def __post_init__(self) -> None:
        _int(self, "max_tokens", low=1)
        _int(self, "top_k", low=-1)
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (off) or >= 1, got 0")
        _int(self, "n", low=1, high=MAX_CHOICES)
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _int(self, name, low=0, high=MAX_LOGPROBS)
        if self.seed is not None:
            _int(self, "seed", low=-2**63, high=2**63 - 1)
        _number(self, "temperature", 0.0, 2.0)
        _number(self, "top_p", 0.0, 1.0, open_low=True)
        _number(self, "min_p", 0.0, 1.0)
        _number(self, "presence_penalty", -2.0, 2.0)
        _number(self, "frequency_penalty", -2.0, 2.0)
        _number(self, "repetition_penalty", 0.0, math.inf, open_low=True)
        if not isinstance(self.stop_token_ids, tuple) or not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be a tuple of token ids, got {self.stop_token_ids!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(params: GenerationParams, name: str, low: int, high: int | None = None) -> None:
    value = getattr(params, name)
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")


def _number(params: GenerationParams, name: str, low: float, high: float, open_low: bool = False) -> None:
    value = getattr(params, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if math.isnan(value) or value > high or value < low or (open_low and value == low):
        left = "(" if open_low else "["
        right = ")" if math.isinf(high) else "]"
        raise ValueError(f"{name} must be in {left}{low}, {high}{right}, got {value}")
