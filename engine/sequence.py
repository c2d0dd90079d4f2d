"""One sequence as the GPU thread sees it (one choice of a request: prompt, KV slot and pages,
tokens so far, limits, how its tokens are chosen), and the group of sequences a request of n choices holds."""
from __future__ import annotations

import dataclasses

from pegainfer.engine.draw_params import DrawParams
from pegainfer.engine.contract import FinishReason, SamplingParams


@dataclasses.dataclass(slots=True)
class Group:
    """The request's sequences still alive, and the finish reasons of those that ended."""
    request_id: str
    live: int
    reasons: list[str] = dataclasses.field(default_factory=list)

    def end_one(self, reason: str) -> FinishReason | None:
        """Record one sequence's end; the request's reason once its last sequence has ended."""
        self.live -= 1
        self.reasons.append(reason)
        if self.live > 0:
            return None
        return FinishReason.LENGTH if FinishReason.LENGTH in self.reasons else FinishReason.STOP


@dataclasses.dataclass(slots=True)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    slot: int = -1
    output_ids: list[int] = dataclasses.field(default_factory=list)
    cached: int = 0  # tokens already in the KV cache
    index: int = 0  # choice index within the request
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    seed: int = 0  # the request's seed (the client's, or one the engine drew)
    params: DrawParams | None = None  # `sampling` and `seed` as the sampler takes them, checked at admission
    stop_token_ids: frozenset[int] = frozenset()
    group: Group | None = None
    # siblings (choices 1..n-1) waiting for this sequence's prefill: they draw their first token
    # from its logits and then take a copy of its KV cache rows
    forks: list[Sequence] = dataclasses.field(default_factory=list)
    room: int = 0  # positions its KV pages cover (the batcher grows them before a row writes past)
    registered: int = 0  # full prompt pages offered to the prefix cache
    digests: list[bytes] | None = None  # the prompt's full pages' chain digests (engine/kv_pages.py), made once
    # resumed after a preemption: its generated tokens are fed back one decode row at a time (no
    # draw) until the cache holds them again, computed as they first were (bit for bit)
    replay: bool = False
    echoed: int = 0  # prompt positions whose prompt log-probs went out (a recompute does not repeat them)
    preemptions: int = 0
    plain: bool = dataclasses.field(init=False)  # plain greedy: the argmax fast path serves it
    # (request id, choice index): the batcher's key, read for every row of every step, so stored once
    # (a property building the tuple cost ~0.1 µs a read)
    key: tuple[str, int] = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.plain = self.sampling.plain_greedy
        self.key = (self.request_id, self.index)

    @property
    def prefilling(self) -> bool:
        """Part of the prompt is not in the KV cache yet (chunked prefill)."""
        return self.cached < len(self.prompt_ids)

    def next_row(self, budget: int) -> list[int]:
        """Tokens to feed next step: the next prompt chunk of at most `budget` tokens (prompt
        log-probs too are computed chunk by chunk), or the last sampled token."""
        if not self.prefilling:
            return [self.output_ids[-1]]
        return self.prompt_ids[self.cached:self.cached + budget]

    def finish_reason(self, eos_id: int | None) -> FinishReason | None:
        last = self.output_ids[-1] if self.output_ids else None
        if last is not None and ((last == eos_id and not self.ignore_eos) or last in self.stop_token_ids):
            return FinishReason.STOP
        if len(self.output_ids) >= self.max_tokens:
            return FinishReason.LENGTH
        return None
