"""--max-step-prompts (Batcher.max_step_prompts): a step takes at most that many prompt rows (prompts,
prompt chunks, recomputed prompts), the rest waiting for the next step in arrival order, so that a
wave of arrivals stays within the prefill graphs' rows on CUDA. On the fake engine (the plans) and on
the tiny model through the GPU thread (the tokens are those of offline generation, bounded or not)."""
from __future__ import annotations

import queue

import pytest

from pegainfer.engine.batcher import Batcher
from pegainfer.engine.contract import Admit, Shutdown, StepEvents
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.kv_capacity import PagedCapacity
from pegainfer.engine.loop import GpuThread
from tests.engine.fake_engine import EOS, FakeEngine
from tests.engine.test_overlap import offline


def make(cap: int, *, budget: int = 8192, admission: bool = False, mixed: int = 8192) -> tuple[FakeEngine, Batcher]:
    eng = FakeEngine(8, max_len=256)
    return eng, Batcher(PagedCapacity(eng.cache), EOS, max_prefill_tokens=budget, max_step_prompts=cap,
                        overlap_admission=admission, mixed_step_tokens=mixed)


def add(eng: FakeEngine, b: Batcher, rid: str, prompt: list[int], max_tokens: int = 9) -> None:
    b.add(eng.sequence(Admit(rid, prompt, max_tokens)))


def run(eng: FakeEngine, b: Batcher, admitted: list | None = None):
    got = b.admit()
    if admitted is not None:
        admitted.append(got)
    plan = b.plan()
    b.settle(plan, eng.runner.run(plan))
    return plan


def prompt_rows(plan) -> list[str]:
    return [s.request_id for s, r in zip(plan.seqs, plan.rows) if r.prompt]


def test_a_wave_of_prompts_is_taken_a_bounded_number_a_step_in_arrival_order():
    eng, b = make(2)
    for i in range(5):
        add(eng, b, f"r{i}", [10 + i, 20 + i, 30 + i])
    admitted: list[list[str]] = []
    steps = [run(eng, b, admitted) for _ in range(3)]
    assert [prompt_rows(p) for p in steps] == [["r0", "r1"], ["r2", "r3"], ["r4"]]
    assert [p.decode_rows for p in steps] == [0, 2, 4]  # the earlier ones decode beside the later prompts
    # the rest stay waiting (not prefilling: no PrefillStarted) until a step has a prompt row for them
    assert admitted == [["r0", "r1"], ["r2", "r3"], ["r4"]]
    eng, b = make(0)  # no bound: the whole wave in one step
    for i in range(5):
        add(eng, b, f"r{i}", [10 + i, 20 + i, 30 + i])
    assert prompt_rows(run(eng, b)) == [f"r{i}" for i in range(5)]


def test_a_prompt_chunk_counts_as_a_prompt_row():
    eng, b = make(1, budget=4)
    add(eng, b, "long", list(range(100, 110)))  # 10 tokens: chunks of 4, 4, 2
    add(eng, b, "short", [7, 8])
    admitted: list[list[str]] = []
    seen = [[(s.request_id, len(r.token_ids)) for s, r in zip(p.seqs, p.rows) if r.prompt]
            for p in (run(eng, b, admitted) for _ in range(4))]
    assert seen == [[("long", 4)], [("long", 4)], [("long", 2)], [("short", 2)]]
    assert admitted == [["long"], [], [], ["short"]]  # "short" waits while "long" holds the step's one row
    with pytest.raises(ValueError, match="max_step_prompts"):
        make(-1)


def test_newcomers_joining_a_launched_step_are_bounded_too():
    eng, b = make(1, admission=True)
    add(eng, b, "a", [1], 20)
    first = run(eng, b)
    nxt = b.plan(launch=True)
    assert first.rows and nxt.launchable
    eng.runner.launch(nxt)
    for rid in ("c", "d", "e"):
        add(eng, b, rid, [3, 4, 5])
    joined = b.successor(nxt)
    assert b.joined == [("c", 0)] and prompt_rows(joined) == ["c"]


def test_a_prompts_chunks_across_launched_steps_hold_the_bound():
    eng, b = make(1, admission=True, mixed=66)  # beside one decode row: 65 prompt tokens a step
    add(eng, b, "a", [1], 40)
    plan = run(eng, b)
    plan = b.plan(launch=True)
    in_flight = eng.runner.launch(plan)
    add(eng, b, "long", list(range(100, 200)))  # 100 tokens: chunks of 65 and 35, room for d beside the 35
    add(eng, b, "d", [3, 4])
    seen = []
    for _ in range(4):
        nxt = b.successor(plan)
        seen.append([(s.request_id, len(r.token_ids)) for s, r in zip(nxt.seqs, nxt.rows) if r.prompt])
        launched = eng.runner.launch(nxt)
        b.settle_launched(plan, eng.runner.collect(in_flight))
        plan, in_flight = nxt, launched
    assert seen == [[("long", 65)], [("long", 35)], [("d", 2)], []]


def test_the_setting_is_refused_below_zero():
    from pegainfer.daemon.settings import SettingsError, Settings, _validate
    _validate(Settings(max_step_prompts=3))
    with pytest.raises(SettingsError, match="max_step_prompts must be 0"):
        _validate(Settings(max_step_prompts=-1))


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=8))
    yield e
    e.close()


@pytest.mark.parametrize("cap", [1, 2, 0])
def test_the_tokens_are_offline_generations_whatever_the_bound(engine, cap):
    prompts = [[5, 9, 200, 31], [7], list(range(40, 90)), [300, 301, 302, 303], [12, 13]]
    maxes = [6, 4, 5, 7, 3]
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, max_step_prompts=cap)
    for i, (p, m) in enumerate(zip(prompts, maxes)):  # all queued before the thread's first step
        gpu.submit(Admit(f"r{i}", p, m, ignore_eos=True))
    gpu.start()
    tokens: dict[str, list[int]] = {}
    finished: set[str] = set()
    most = 0  # the most prompt rows a step held
    while len(finished) < len(prompts):
        ev = events.get(timeout=60)
        if isinstance(ev, StepEvents):
            for t in ev.tokens:
                tokens.setdefault(t.request_id, []).append(t.token_id)
            finished |= {f.request_id for f in ev.finished}
            if ev.record:
                most = max(most, ev.record.rows - ev.record.decode_rows)
    gpu.submit(Shutdown())
    gpu.join(10)
    assert gpu.error is None
    assert [tokens[f"r{i}"] for i in range(len(prompts))] == offline(engine, prompts, maxes)
    assert most == (cap or len(prompts))  # the first step holds as many prompts as the bound lets it
