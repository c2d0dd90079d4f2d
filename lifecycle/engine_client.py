"""The engine-client protocol: the two commands the scheduler sends to the GPU side.

The daemon implements it by putting a typed command (engine.contract.Admit / Cancel) into the
GPU thread's inbox; tests implement it with a recorder. Both methods are called on the asyncio
loop thread and must return at once: they never block, never await and never raise (a full or
closed inbox is the daemon's business, reported back later as a failed event).
"""
from __future__ import annotations

from typing import Protocol

from lifecycle.params import GenerationParams


class EngineClient(Protocol):
    def admit(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> None:
        """Hand a request to the engine; it will answer with token and finished/failed events."""
        ...

    def cancel(self, request_id: str) -> None:
        """Ask the engine to drop a request it holds and free its KV slot; events for it that
        were already in flight may still arrive and are ignored by the scheduler."""
        ...
