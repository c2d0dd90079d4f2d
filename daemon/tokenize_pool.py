"""Prompt text -> token ids without stalling the event loop: long prompts are tokenised on a small
pool of worker threads (--tokenizer-workers) while the loop keeps streaming everyone else's tokens;
short ones inline, where the thread hop would cost more than the work."""
from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pegainfer.engine.tokenizer import Tokenizer

# Prompts shorter than this are tokenised on the loop. Measured on the 2-core CPU box (tiny
# model's byte-level BPE, uvloop): a pool round trip costs about 50 µs on its own; 1,000
# characters encode in 0.18 ms inline and 0.25 ms through the pool, 100 characters in 20 µs
# inline and 84 µs through the pool. Below this size the loop is blocked for at most ~0.2 ms, far
# less than one decode step; above it the work grows linearly (1 MB: 0.27 s) and goes off the loop.
INLINE_MAX_CHARS = 1024
# The workers' nice value. Tokenising is throughput work beside the latency-critical loop and GPU
# thread: where cores are scarce (CPU serving, a small VM) the scheduler gives the workers about a
# tenth of a contended core instead of half, so the engine's steps are not slowed. On the 2-core
# box at nice 0, 8 prompts of 1 MB tokenised beside a stream widened its largest gap between chunks
# from about 20 ms to 150-230 ms (the engine's two OpenMP threads lost their cores); with this, see
# tests/daemon/test_loop_stall.py.
WORKER_NICE = 10
T = TypeVar("T")


class TokenizePool:
    def __init__(self, workers: int):
        self.workers = workers
        # Threads, not processes: the tokenizer releases the GIL while it encodes (engine/tokenizer.py),
        # so a worker thread runs beside the loop without pickling megabytes of text.
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pegainfer-tokenize",
                                        initializer=_lower_priority)

    async def encode(self, tokenizer: Tokenizer, text: str, add_bos: bool = True) -> list[int]:
        if len(text) < INLINE_MAX_CHARS:
            return tokenizer.encode(text, add_bos)
        return await asyncio.get_running_loop().run_in_executor(self._pool, tokenizer.encode, text, add_bos)

    async def call(self, size: int, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), inline when `size` (the characters it works on) is small, else on a worker
        (a chat template rendering a long conversation)."""
        if size < INLINE_MAX_CHARS:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        """Stop the workers; a prompt still being encoded finishes first (its request is gone)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _lower_priority() -> None:
    """Runs in each worker as it starts; on Linux a thread has its own nice value."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)
    except (AttributeError, OSError):  # pragma: no cover - not Linux, or not allowed: run at normal priority
        pass
