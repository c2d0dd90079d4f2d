"""The engine-client protocol: the commands the scheduler sends to the GPU side.

The daemon implements it by putting the contract's typed commands (engine.contract.Admit, Cancel,
StopChoice) into the GPU thread's inbox; tests implement it with a recorder. Every method is called
on the asyncio loop thread and must return at once: it never blocks, never awaits and never raises
(a full or closed inbox is the daemon's business, reported back later as a failed event).
"""
from __future__ import annotations

from typing import Protocol

from pegainfer.engine.contract import Admit


class EngineClient(Protocol):
    def admit(self, command: Admit) -> None:
        """Hand a request to the engine; it will answer with token and finished/failed events."""
        ...

    def cancel(self, request_id: str) -> None:
        """Ask the engine to drop a request it holds and free its KV slot; events for it that
        were already in flight may still arrive and are ignored by the scheduler."""
        ...

    def stop_choice(self, request_id: str, index: int) -> None:
        """Ask the engine to finish one choice (sequence) of a request it holds, as if it had
        stopped on a stop token: the daemon found a stop string in that choice's text."""
        ...
