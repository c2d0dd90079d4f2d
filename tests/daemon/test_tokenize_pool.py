"""daemon/tokenize_pool.py: a long prompt is tokenised beside a running event loop, not on it; short
ones inline; the ids are the tokenizer's either way, and the workers run at a lower priority."""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from pegainfer.daemon.tokenize_pool import INLINE_MAX_CHARS, WORKER_NICE, TokenizePool
from pegainfer.engine.tokenizer import Tokenizer
from tools.benchkit.workload import prompt_text


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer(tiny_model_dir)


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("pegainfer-tokenize")]


async def test_a_long_prompt_does_not_block_the_loop(tok: Tokenizer):
    text = prompt_text(4, 0, 100_000)[:500_000]
    pool = TokenizePool(2)
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.002)

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    started = time.perf_counter()
    ids = await pool.encode(tok, text)
    took = time.perf_counter() - started
    ticking.cancel()
    gaps = [b - a for a, b in zip(ticks, ticks[1:]) if b >= started]
    assert ids == tok.encode(text) and len(ids) > 100_000
    # Inline, the loop would not tick at all for the whole encode (0.1-0.3 s here).
    assert len(gaps) > 10 and max(gaps) < max(0.05, took / 3), (took, max(gaps))
    worker = _workers()[0]
    nice = int(Path(f"/proc/self/task/{worker.native_id}/stat").read_text().rsplit(")", 1)[1].split()[16])
    assert nice == WORKER_NICE
    pool.shutdown()


async def test_short_prompts_are_encoded_inline(tok: Tokenizer):
    # earlier tests' pools shut down without waiting: let their workers exit first, so that one
    # leaving mid-test does not change the count (seen once in CI: 1 before, 0 after)
    for t in _workers():
        t.join(timeout=5)
    before = len(_workers())
    pool = TokenizePool(1)
    short = "Once upon a time" * (INLINE_MAX_CHARS // 16 - 1)
    assert len(short) < INLINE_MAX_CHARS
    assert await pool.encode(tok, short) == tok.encode(short)
    assert len(_workers()) == before  # no worker was needed
    pool.shutdown()
