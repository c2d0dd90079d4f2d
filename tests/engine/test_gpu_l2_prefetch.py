"""Weights pulled into L2 on their own stream (engine/kernels/l2_prefetch.py) on CUDA, skipped
without a GPU: a prefetch leaves every byte as it was, its kernel issues the L2 prefetch
instruction, and greedy generation through the captured decode graphs (the prefetch stream forked
and joined inside each) gives the same tokens with every weight prefetched, the next layer's too,
as with prefetching off. Run on a GPU machine: pytest tests/engine/test_gpu_l2_prefetch.py"""
from __future__ import annotations

import pytest
import torch

from engine.engine import EngineSpec, build_engine
from engine.generate import generate
from engine.kernels import l2_prefetch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[5, 9, 200, 31], list(range(40, 140))]


@pytest.mark.parametrize("evict_last", [True, False])
def test_a_prefetch_changes_nothing_and_prefetches(evict_last):
    w = torch.randn(3000, 2048, device="cuda").bfloat16()
    before = w.clone()
    k = l2_prefetch.prefetch(w, evict_last=evict_last)
    torch.cuda.synchronize()
    assert torch.equal(w, before)
    assert ("prefetch.global.L2::evict_last" in k.asm["ptx"]) == evict_last
    assert "prefetch.global.L2" in k.asm["ptx"]


def _tokens(monkeypatch, weights: tuple, nxt: tuple) -> list:
    monkeypatch.setattr(l2_prefetch, "WEIGHTS", weights)
    monkeypatch.setattr(l2_prefetch, "NEXT_WEIGHTS", nxt)
    monkeypatch.setattr(l2_prefetch, "MAX_ROWS", 4)
    e = build_engine(EngineSpec(random_preset="tiny", device="cuda:0", dtype="bfloat16", num_slots=4))
    try:
        assert e.runner.graphs is not None and e.model.prefetch_stream is not None
        runs = [generate(e, [p], 20, ignore_eos=True) for p in PROMPTS] + [generate(e, PROMPTS, 20, ignore_eos=True)]
        return [[g.token_ids for g in run] for run in runs]
    finally:
        e.close()


def test_graph_steps_give_the_same_tokens_with_and_without_prefetching(monkeypatch):
    off = _tokens(monkeypatch, (), ())
    on = _tokens(monkeypatch, l2_prefetch.NAMES, ("q_kv_a",))
    assert on == off
