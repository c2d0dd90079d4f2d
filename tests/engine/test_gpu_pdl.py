"""Programmatic dependent launch (engine/kernels/pdl.py) on CUDA, skipped without a GPU: with PDL
on every launch (MAX_ROWS 32; the default is one row) the lite-shaped decode graphs must give every
token of plain launches, bit for bit, at 1, 4 and 32 rows (the one-row kernels, the few-row ones and the router's three-launch
form), for 24 steps after a prompt of 40. A kernel reading what the one before had not written yet
would change tokens (random weights: near-tied logits). Run on a GPU machine:
pytest tests/engine/test_gpu_pdl.py"""
from __future__ import annotations

import pytest
import torch

from engine.batch import RowInput
from engine.engine import EngineSpec, build_engine, dependent_launch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BATCHES = (1, 4, 32)


def _tokens(pdl_rows: int, monkeypatch) -> tuple[int, dict]:
    from engine.kernels import pdl
    monkeypatch.setattr(pdl, "MAX_ROWS", pdl_rows)
    engine = build_engine(EngineSpec(random_preset="lite", device="cuda", dtype="bfloat16", num_slots=max(BATCHES),
                                     max_model_len=256))
    try:
        mode = dependent_launch(engine.model.embed)
        out = {}
        for b in BATCHES:
            g = torch.Generator().manual_seed(b)
            prompts = torch.randint(0, engine.cfg.vocab_size - 2, (b, 40), generator=g).tolist()
            slots = [engine.cache.allocate() for _ in range(b)]
            toks = engine.runner.step([RowInput(s, p, 0) for s, p in zip(slots, prompts)])
            trace = [toks]
            for pos in range(40, 64):
                toks = engine.runner.step([RowInput(s, [t], pos) for s, t in zip(slots, toks)])
                trace.append(toks)
            for s in slots:
                engine.cache.release(s)
            out[b] = trace
        return mode, out
    finally:
        engine.close()
        del engine
        torch.cuda.empty_cache()


def test_pdl_decode_graphs_give_the_tokens_of_plain_launches(monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs compute capability 9.0")
    rows, plain = _tokens(0, monkeypatch)
    assert rows == 0
    rows, got = _tokens(max(BATCHES), monkeypatch)
    assert rows == max(BATCHES)
    for b in BATCHES:
        assert got[b] == plain[b], b
