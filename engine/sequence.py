"""One request as the GPU thread sees it: prompt, KV slot, tokens so far, limits."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(slots=True)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    slot: int = -1
    output_ids: list[int] = dataclasses.field(default_factory=list)
    cached: int = 0  # tokens already in the KV cache

    @property
    def pending_ids(self) -> list[int]:
        """Tokens to feed next step: the whole prompt (prefill) or the last sampled token."""
        if self.cached == 0:
            return self.prompt_ids
        return [self.output_ids[-1]]

    def finish_reason(self, eos_id: int | None) -> str | None:
        if self.output_ids and self.output_ids[-1] == eos_id and not self.ignore_eos:
            return "stop"
        if len(self.output_ids) >= self.max_tokens:
            return "length"
        return None
