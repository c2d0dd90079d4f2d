"""A request's sampling parameters in the form the batched sampler takes (engine.sampler): checked
against the sampler's domain and converted once, when the GPU thread admits the request, so that a
step's batch build cannot fail on one row's values. The domain is what keeps the device maths
defined (finite float32 numbers, int64 integers, token ids and top-k within the vocabulary), not
the API's policy (engine.contract's BOUNDS, checked where a request is parsed): a value outside it
is an invariant the parse broke, and fails that request alone (engine.admission)."""
from __future__ import annotations

import dataclasses
import math

from pegainfer.engine.contract import GREEDY_BELOW, SamplingParams

FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32


@dataclasses.dataclass(frozen=True, slots=True)
class DrawParams:
    """One request's sampling parameters as the batched sampler takes them: checked and converted
    once, when the request is admitted (DrawParams.of raises ValueError or TypeError on anything
    outside the sampler's domain), so that building a step's batch never fails on one row's values.
    Every float is finite in float32 and every int fits int64."""
    temperature: float  # 0: greedy (a temperature below GREEDY_BELOW is greedy too)
    top_p: float  # (0, 1]
    top_k: int  # 0: off; else in [1, vocab]
    min_p: float  # [0, 1]
    presence: float
    frequency: float
    repetition: float  # > 0
    seed: int  # signed 64-bit
    logprobs: int | None  # [0, vocab]
    bias_ids: tuple[int, ...] = ()  # distinct token ids in [0, vocab)
    bias_values: tuple[float, ...] = ()
    penalised: bool = False

    @classmethod
    def of(cls, spec: SamplingParams, seed: int, vocab: int) -> DrawParams:
        temperature = _float32("temperature", spec.temperature, low=0.0)
        top_k = _int("top_k", spec.top_k, -1, vocab)
        if top_k == 0:
            raise ValueError("top_k must be -1 (off) or in [1, vocab], got 0")
        bias = spec.logit_bias
        if not isinstance(bias, tuple) or not all(isinstance(e, tuple) and len(e) == 2 for e in bias):
            raise TypeError("logit_bias must be a tuple of (token id, bias) pairs")
        ids = tuple(_int("logit_bias token id", t, 0, vocab - 1) for t, _ in bias)
        if len(set(ids)) != len(ids):
            raise ValueError("logit_bias names a token id twice")
        logprobs = None if spec.logprobs is None else _int("logprobs", spec.logprobs, 0, vocab)
        return cls(
            temperature=0.0 if temperature < GREEDY_BELOW else temperature,
            top_p=_float32("top_p", spec.top_p, low=0.0, high=1.0, open_low=True), top_k=max(top_k, 0),
            min_p=_float32("min_p", spec.min_p, low=0.0, high=1.0),
            presence=_float32("presence_penalty", spec.presence_penalty),
            frequency=_float32("frequency_penalty", spec.frequency_penalty),
            repetition=_float32("repetition_penalty", spec.repetition_penalty, low=0.0, open_low=True),
            seed=_int("seed", seed, -2**63, 2**63 - 1), logprobs=logprobs, bias_ids=ids,
            bias_values=tuple(_float32("logit_bias value", v) for _, v in bias), penalised=spec.penalised)

    @property
    def hot(self) -> bool:
        return self.temperature > 0


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _float32(name: str, value: object, low: float = -FLOAT32_MAX, high: float = FLOAT32_MAX,
             open_low: bool = False) -> float:
    """A finite number in [low, high] ((low, high] with open_low) that float32 holds. Above an open
    low end of 0, a value too small for a normal float32 (it would round to 0, or to a denormal that
    a GPU may flush to 0) becomes the smallest normal one, to the same effect: a top_p that small
    keeps one token, a repetition penalty that small sends seen tokens' logits to the limit."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    x = float(value) if -FLOAT32_MAX <= value <= FLOAT32_MAX else math.inf  # NaN fails the test too
    if not math.isfinite(x) or not low <= x <= high or (open_low and x <= low):
        raise ValueError(f"{name} must be a finite float32 in {'(' if open_low else '['}{low:g}, {high:g}], "
                         f"got {value}")
    return FLOAT32_TINY if open_low and low == 0.0 and x < FLOAT32_TINY else x
