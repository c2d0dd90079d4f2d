"""The per-request generation parameters the scheduler hands to the engine unchanged."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationParams:
    """What the engine needs to generate for one request. Validated here, so that neither the
    scheduler nor the GPU thread ever sees a nonsensical value. Sampling parameters (temperature,
    top_p, seed, stop sequences) join as fields with defaults that mean "greedy, as today"."""
    max_tokens: int
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise TypeError(f"max_tokens must be an int, got {type(self.max_tokens).__name__}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
