"""Prefix caching (engine/kv_pages.py, PagedCapacity.take/written): a prompt sharing full pages with an
earlier one starts after them, reports them as cached tokens, and gives exactly the tokens of a
server without the cache, in float32 and bfloat16 on the tiny model: greedy, seeded sampling, and a
request for prompt log-probs (never served from the cache); after a shared page is evicted by
another prompt the chain breaks where it went, and the outputs stay the same."""
from __future__ import annotations

import pytest

from pegainfer.engine.contract import Admit, PrefillStarted, SamplingParams, StepEvents
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.loop import GpuThread
from tests.engine.test_loop import drive, summary

PREFIX = [(i * 37) % 900 + 3 for i in range(150)]  # 2 full pages of 64 and 22 tokens
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, seed=3)
ECHO = SamplingParams(prompt_logprobs=2)
# (request, prompt tokens expected from the cache); one at a time, in order, on a cache of 6 pages
STEPS = [(Admit("a", PREFIX + [11] * 10, 12, True), 0),
         (Admit("b", PREFIX + [12] * 20, 12, True), 128),  # the prefix's two full pages
         (Admit("c", PREFIX + [13] * 5, 12, True, SEEDED), 128),
         (Admit("d", PREFIX + [14] * 3, 4, True, ECHO), 0),  # prompt log-probs: every position computed
         (Admit("e", PREFIX[:64] + [15] * 2, 6, True), 64),  # a shorter prompt shares the first page only
         (Admit("filler", [(i * 11) % 800 + 5 for i in range(300)], 20, True), 0),  # takes 5 of the 6 pages
         # the filler evicted the prefix's second page (e had used the first more recently): the chain
         # breaks there, and f computes from position 64 on
         (Admit("f", PREFIX + [16] * 7, 12, True), 64),
         (Admit("g", PREFIX + [17] * 9, 12, True, SEEDED), 128)]  # f's pages are cached again


def _serve(model_dir: str, dtype: str, caching: bool) -> tuple[dict, dict, dict]:
    engine = build_engine(EngineSpec(model_dir=model_dir, num_slots=4, dtype=dtype, kv_cache_tokens=6 * 64,
                                     prefix_caching=caching))
    gpu = GpuThread(engine, None, overlap=True)
    tokens, prompt, cached = {}, {}, {}
    for cmd, _ in STEPS:
        events = drive(gpu, [cmd])
        got, finished, _ = summary(events)
        assert finished == {cmd.request_id: "length"}
        tokens.update(got)
        for ev in events:
            if isinstance(ev, PrefillStarted):
                cached.update(zip(ev.request_ids, ev.cached_tokens))
            if isinstance(ev, StepEvents):
                prompt.setdefault(cmd.request_id, []).extend(e for p in ev.prompt_logprobs for e in p.entries)
        assert engine.cache.pool.used == 0  # every reference returned
    engine.cache.pool.check()
    snap = gpu.snapshot()
    engine.close()
    return tokens, {k: v for k, v in prompt.items() if v}, {**cached, "queries": snap.prefix_cache_queries,
                                                            "hits": snap.prefix_cache_hits}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_outputs_are_identical_with_the_prefix_cache_on_and_off(tiny_model_dir, dtype):
    on_tokens, on_prompt, on_cached = _serve(str(tiny_model_dir), dtype, True)
    off_tokens, off_prompt, off_cached = _serve(str(tiny_model_dir), dtype, False)
    assert on_tokens == off_tokens
    assert on_prompt == off_prompt and len(on_prompt["d"]) == len(PREFIX) + 3
    assert {cmd.request_id: on_cached[cmd.request_id] for cmd, _ in STEPS} == {cmd.request_id: n for cmd, n in STEPS}
    assert on_cached["hits"] == sum(n for _, n in STEPS)
    assert on_cached["queries"] == sum(len(cmd.prompt_ids) for cmd, _ in STEPS)
    assert off_cached["queries"] == off_cached["hits"] == 0 and all(off_cached[cmd.request_id] == 0 for cmd, _ in STEPS)
