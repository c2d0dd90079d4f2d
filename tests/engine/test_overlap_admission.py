"""Admission overlapped (Batcher.overlap_admission, the daemon's --async-admission; engine/successor.py):
a plain greedy newcomer joins the step launched while another is in flight, its prompt beside the
decode rows, its first token fed on the device to the launch after; a long prompt is chunked across
launched steps. The tokens are exactly offline generation's and those of the thread without it;
requests that cannot join (sampled, n > 1, preempted) wait for the step in flight to be read, as
before. On the fake engine (the plans themselves) and on the tiny model, eager and with the real
DecodeGraphs buffers and feed replayed on the CPU."""
from __future__ import annotations

import pytest

from pegainfer.engine.batcher import Batcher
from pegainfer.engine.contract import Admit, PrefillStarted, SamplingParams, StepEvents
from pegainfer.engine.cuda_graphs import DecodeGraphs
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.kv_capacity import PagedCapacity
from pegainfer.engine.loop import GpuThread
from tests.engine.fake_engine import EOS, FakeEngine
from tests.engine.test_overlap import PROMPTS, offline


def make(slots: int = 4, mixed: int = 8192, max_len: int = 64) -> tuple[FakeEngine, Batcher]:
    eng = FakeEngine(slots, max_len=max_len)
    return eng, Batcher(PagedCapacity(eng.cache), EOS, mixed_step_tokens=mixed, overlap_admission=True)


def add(eng: FakeEngine, b: Batcher, rid: str, prompt: list[int], max_tokens: int, **kw) -> None:
    b.add(eng.sequence(Admit(rid, prompt, max_tokens, **kw)))


def rows(plan) -> list[tuple[str, list[int], int, bool]]:
    return [(s.request_id, r.token_ids, r.start_pos, r.prompt) for s, r in zip(plan.seqs, plan.rows)]


def first_step(eng, b):
    b.admit()
    plan = b.plan()
    b.settle(plan, eng.runner.run(plan))
    return b.plan(launch=True)


def test_a_newcomer_joins_the_launched_step_and_is_fed_its_first_token():
    eng, b = make()
    run = eng.runner
    add(eng, b, "a", [1], 9)
    first = first_step(eng, b)  # a's first token (10) came with its prefill
    assert first.launchable and rows(first) == [("a", [10], 1, False)]
    in_flight = run.launch(first)
    add(eng, b, "c", [3, 4, 5], 9)
    nxt = b.successor(first)  # launched before `first` is read, c's prompt beside a's fed row
    assert b.joined == [("c", 0)]
    assert rows(nxt) == [("a", [0], 2, False), ("c", [3, 4, 5], 0, True)]
    assert nxt.feed == [0, -1] and nxt.draw_rows == [0, 1] and nxt.prefill_tokens == 3 and nxt.launchable
    launched = run.launch(nxt)
    assert [t.token_id for t in b.settle_launched(first, run.collect(in_flight)).tokens] == [11]
    third = b.successor(nxt)  # c's first token is still in flight: fed from after the one-token rows
    assert rows(third) == [("a", [0], 3, False), ("c", [0], 3, False)] and third.feed == [0, 1]
    run.launch(third)
    out = b.settle_launched(nxt, run.collect(launched))
    assert {t.request_id: t.token_id for t in out.tokens} == {"a": 12, "c": 10}


@pytest.mark.parametrize("kw", [{"temperature": 0.8, "seed": 1}, {"n": 2}, {"logprobs": 2}],
                         ids=["sampled", "choices", "logprobs"])
def test_who_cannot_join_waits_for_the_step_in_flight(kw):
    eng, b = make()
    add(eng, b, "a", [1], 9)
    first = first_step(eng, b)
    n = kw.pop("n", 1)
    sampling = SamplingParams.checked(**kw) if kw else SamplingParams()
    add(eng, b, "c", [3, 4], 9, n=n, sampling=sampling)
    assert b.successor(first) is None and b.joined == []


def test_a_long_prompt_is_chunked_across_launched_steps():
    eng, b = make(mixed=6, max_len=256)
    run = eng.runner
    add(eng, b, "a", [1], 30)
    plan = first_step(eng, b)
    in_flight = run.launch(plan)
    prompt = list(range(100, 250))
    add(eng, b, "long", prompt, 3)
    chunks = []
    while not any(r[0] == "long" and not r[3] for r in rows(plan)):  # until it decodes
        nxt = b.successor(plan)
        chunks += [(r[1], r[2]) for r in rows(nxt) if r[0] == "long" and r[3]]
        launched = run.launch(nxt)
        b.settle_launched(plan, run.collect(in_flight))
        plan, in_flight = nxt, launched
    # the budget beside a decode row: MIN_PROMPT_CHUNK (64) tokens a step
    assert chunks == [(prompt[:64], 0), (prompt[64:128], 64), (prompt[128:], 128)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    # no prefix caching: the second variant would find the first's prompt pages (fewer tokens prefilled)
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=3, prefix_caching=False))
    yield e
    e.close()


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph_buffers"])
def test_newcomers_joining_launched_steps_keep_their_offline_tokens(engine, graphs):
    """The GPU loop turned by hand (as its thread turns it): each newcomer arrives while a step is in
    flight and joins the next launch; the 150-token prompt goes in 64-token chunks, launched."""
    if graphs:
        engine.runner.graphs = DecodeGraphs(engine.model, engine.cache, engine.cache.num_slots,
                                            engine.cache.scratch_slot)
    try:
        prompts = [PROMPTS[0], list(range(40, 190)), PROMPTS[3], PROMPTS[1], PROMPTS[4]]
        maxes = [14, 6, 9, 7, 5]
        ref = offline(engine, prompts, maxes)
        events: list = []
        gpu = GpuThread(engine, events.append, mixed_step_tokens=24, overlap_admission=True)

        def turn(n: int = 1) -> None:
            for _ in range(n):
                assert gpu._apply(gpu._drain(block=False))
                gpu.tick()

        gpu.submit(Admit("r0", prompts[0], maxes[0], ignore_eos=True))
        turn(2)  # its prefill, then its first launched decode step
        for i in range(1, 5):
            assert gpu.in_flight is not None
            gpu.submit(Admit(f"r{i}", prompts[i], maxes[i], ignore_eos=True))
            turn(2)
        while gpu.batcher.busy or gpu.in_flight:
            turn()
        tokens: dict[str, list[int]] = {}
        records = []
        for ev in events:
            if isinstance(ev, StepEvents):
                for t in ev.tokens:
                    tokens.setdefault(t.request_id, []).append(t.token_id)
                records += [ev.record] if ev.record else []
        assert [tokens[f"r{i}"] for i in range(5)] == ref
        started = [ev for ev in events if isinstance(ev, PrefillStarted)]
        assert [ev.request_ids for ev in started] == [["r0"], ["r1"], ["r2"], ["r3"], ["r4"]]
        joined = [r for r in records if r.overlapped and r.prefill_tokens]
        assert sum(r.prefill_tokens for r in joined) == sum(map(len, prompts[1:]))  # every newcomer, launched
        assert sum("r1" in r.request_ids and r.prefill_tokens >= 64 for r in joined) >= 2  # chunked, named
        assert engine.cache.free_slots == 3 and engine.cache.pool.used == 0
    finally:
        engine.runner.graphs = None


def test_a_newcomer_sharing_pages_of_a_prompt_in_flight_keeps_its_tokens(tiny_model_dir):
    """Prefix caching on: the second copy of a prompt arrives while the first's chunks are launched,
    and shares the full pages they register; both keep offline generation's tokens."""
    long = list(range(40, 190))
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=3, prefix_caching=False))
    try:
        ref = offline(e, [PROMPTS[0], long, long], [12, 5, 5])
    finally:
        e.close()
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=3))
    try:
        events: list = []
        gpu = GpuThread(e, events.append, mixed_step_tokens=24, overlap_admission=True)

        def turn() -> None:
            assert gpu._apply(gpu._drain(block=False))
            gpu.tick()

        gpu.submit(Admit("r0", PROMPTS[0], 12, ignore_eos=True))
        turn(), turn()
        gpu.submit(Admit("r1", long, 5, ignore_eos=True))
        turn()
        gpu.submit(Admit("r2", long, 5, ignore_eos=True))
        while gpu.batcher.busy or gpu.in_flight:
            turn()
        tokens: dict[str, list[int]] = {}
        for ev in events:
            if isinstance(ev, StepEvents):
                for t in ev.tokens:
                    tokens.setdefault(t.request_id, []).append(t.token_id)
        assert [tokens[r] for r in ("r0", "r1", "r2")] == ref
        cached = {rid: c for ev in events if isinstance(ev, PrefillStarted) for rid, c in zip(ev.request_ids,
                                                                                            ev.cached_tokens)}
        assert cached["r1"] == 0 and cached["r2"] >= 64  # r2 shared r1's first page
        assert e.cache.free_slots == 3
    finally:
        e.close()
