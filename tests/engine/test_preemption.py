"""Admission by free KV pages and preemption by recompute (engine/batcher.py, engine/kv_capacity.py):
under a cache far smaller than the requests need at once, every request completes, none fails or
loses a token, the newest are the ones preempted, a resumed sequence is fed exactly its own tokens
again (no draw until it is caught up), and every page comes back. On the scripted fake engine (the
scheduling) and on the tiny model in float32 and bfloat16 (the tokens: the same as each request run
alone, greedy and seeded sampling, n = 2 included)."""
from __future__ import annotations

import pytest
import torch

from pegainfer.engine.contract import Admit, Cancel, SamplingParams, StepEvents
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.loop import GpuThread
from tests.engine.fake_engine import FakeEngine, default_script
from tests.engine.test_loop import drive, summary


def _preempted(events: list) -> list[tuple[str, int]]:
    return [p for ev in events if isinstance(ev, StepEvents) for p in ev.preempted]


def _fed(plans: list) -> dict[tuple[str, int], dict[int, int]]:
    """Per sequence, the id fed at each position (from every step that had host ids), checking that
    a position fed twice (a recompute) got the same id."""
    fed: dict[tuple[str, int], dict[int, int]] = {}
    for plan in plans:
        if plan.feed is not None:
            continue  # a launched successor's ids come from the device
        for seq, row in zip(plan.seqs, plan.rows):
            mine = fed.setdefault(seq.key, {})
            for i, tok in enumerate(row.token_ids):
                assert mine.setdefault(row.start_pos + i, tok) == tok, (seq.key, row.start_pos + i)
    return fed


@pytest.mark.parametrize("overlap", [False, True])
def test_every_request_completes_under_a_tiny_cache(overlap):
    eng = FakeEngine(slots=4, kv_tokens=7 * 8, page_size=8)  # 7 pages; each request ends up needing 4
    gpu = GpuThread(eng, None, overlap=overlap)
    prompts = {"a": [3] * 5, "b": [4] * 9, "c": [5] * 3}
    events = drive(gpu, [Admit(rid, p, 20) for rid, p in prompts.items()])
    tokens, finished, _ = summary(events)
    assert finished == {"a": "length", "b": "length", "c": "length"}
    seqs = {s.request_id: s for plan in eng.runner.plans for s in plan.seqs}
    for rid in prompts:  # every token once, in order: nothing lost or repeated by the recomputes
        assert tokens[(rid, 0)] == [default_script(seqs[rid], n) for n in range(20)]
    preempted = _preempted(events)
    assert preempted and gpu.batcher.preemptions == len(preempted)
    assert ("a", 0) not in preempted  # the oldest is never the one preempted
    for key, positions in _fed(eng.runner.plans).items():  # a resumed sequence is fed its own tokens
        seq = seqs[key[0]]
        assert all(tok == (seq.prompt_ids + seq.output_ids)[p] for p, tok in positions.items()), key
    assert eng.cache.pool.used == 0 and eng.cache.free_slots == 4 and gpu.snapshot().kv_pages_free == 7
    eng.cache.pool.check()


def test_a_preempted_request_can_be_cancelled_and_nothing_leaks():
    eng = FakeEngine(slots=4, kv_tokens=7 * 8, page_size=8)
    gpu = GpuThread(eng, None, overlap=False)
    events: list = []
    gpu._emit = events.append
    for rid in "abc":
        gpu.submit(Admit(rid, [7] * 6, 30))
    gpu._apply(gpu._drain(block=False))
    while not _preempted(events):
        gpu.tick()
    victim = _preempted(events)[0][0]
    assert any(s.request_id == victim for s in gpu.batcher.waiting)
    gpu.submit(Cancel(victim))
    gpu._apply(gpu._drain(block=False))
    assert all(s.request_id != victim for s in gpu.batcher.waiting)
    while gpu.batcher.busy:
        gpu.tick()
    assert eng.cache.pool.used == 0 and eng.cache.free_slots == 4
    eng.cache.pool.check()


REQUESTS = [Admit("greedy", list(range(40, 90)), 50, ignore_eos=True),
            Admit("seeded", list(range(7, 37)), 45, ignore_eos=True,
                  sampling=SamplingParams(temperature=1.0, top_k=40, seed=11)),
            Admit("two", list(range(100, 171)), 40, ignore_eos=True, n=2,
                  sampling=SamplingParams(temperature=0.8, seed=5)),
            Admit("late", list(range(300, 320)), 60, ignore_eos=True)]


def _run_alone(model_dir: str, dtype: str, cmd: Admit) -> dict:
    engine = build_engine(EngineSpec(model_dir=model_dir, num_slots=4, dtype=dtype))
    tokens, finished, _ = summary(drive(GpuThread(engine, None, overlap=False), [cmd]))
    engine.close()
    assert finished == {cmd.request_id: "length"}
    return tokens


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_recomputed_requests_give_the_tokens_they_give_alone(tiny_model_dir, dtype):
    model_dir = str(tiny_model_dir)
    want = {}
    for cmd in REQUESTS:
        want.update(_run_alone(model_dir, dtype, cmd))
    # 6 pages of 64: the four requests need 2 + 2 + 4 + 2 pages by their ends
    engine = build_engine(EngineSpec(model_dir=model_dir, num_slots=6, dtype=dtype, kv_cache_tokens=6 * 64))
    gpu = GpuThread(engine, None, overlap=True)
    events = drive(gpu, REQUESTS)
    tokens, finished, _ = summary(events)
    assert set(finished.values()) == {"length"} and len(finished) == 4
    assert _preempted(events), "the cache was meant to run out"
    for key, toks in want.items():
        assert tokens[key] == toks, key
    assert engine.cache.pool.used == 0 and engine.cache.free_slots == 6
    engine.cache.pool.check()
    engine.close()


def test_a_request_larger_than_the_whole_cache_fails_alone(tiny_model_dir):
    engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=2, kv_cache_tokens=2 * 64))
    events = drive(GpuThread(engine, None, overlap=False), [Admit("big", list(range(1, 100)), 40),
                                                             Admit("ok", [5, 6, 7], 3)])
    failed = [f for ev in events if isinstance(ev, StepEvents) for f in ev.failed]
    assert [f.request_id for f in failed] == ["big"] and "KV pages" in failed[0].message
    assert summary(events)[1] == {"ok": "length"}
    assert torch.equal(engine.cache.table[-1], torch.full_like(engine.cache.table[-1], engine.cache.scratch_page))
    engine.close()
