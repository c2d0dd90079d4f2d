"""The batcher on the CPU with a scripted fake runner and no model (tests/engine/fake_engine.py): FCFS
admission by KV capacity, chunked prefill under the step's budget, n-choice forks after the shared
prefill, cancel and stop releasing capacity, finish reasons, which steps may run overlapped and the
rows dropped when a sequence ends while a step is in flight, and a per-request failure in a step's
result dropping that request alone."""
from __future__ import annotations

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pegainfer.engine.batcher import MIN_PROMPT_CHUNK, MIXED_STEP_TOKENS, Batcher, StepOutcome
from pegainfer.engine.contract import Admit, SamplingParams
from pegainfer.engine.kv_capacity import PagedCapacity
from pegainfer.engine.step_plan import Fork, StepPlan, StepResult
from tests.engine.fake_engine import EOS, FakeEngine

HOT = SamplingParams(temperature=1.0, seed=7)


def make(slots: int = 4, budget: int = 8192, overlap: bool = True, scripts: dict | None = None,
         mixed: int = MIXED_STEP_TOKENS, max_len: int = 64):
    eng = FakeEngine(slots, max_len=max_len, scripts=scripts)
    return eng, Batcher(PagedCapacity(eng.cache), EOS, max_prefill_tokens=budget, overlap=overlap,
                        mixed_step_tokens=mixed)


def add(eng: FakeEngine, b: Batcher, rid: str, prompt: list[int], max_tokens: int, **kw) -> None:
    b.add(eng.sequence(Admit(rid, prompt, max_tokens, **kw)))


def step(eng: FakeEngine, b: Batcher) -> tuple[list[str], StepPlan, StepOutcome]:
    """One step run to the end, as engine.loop runs it (admission, plan, run, settle)."""
    admitted = b.admit()
    plan = b.plan()
    return admitted, plan, b.settle(plan, eng.runner.run(plan))


def rows(plan: StepPlan) -> list[tuple[str, list[int], int]]:
    return [(s.request_id, r.token_ids, r.start_pos) for s, r in zip(plan.seqs, plan.rows)]


def tokens(out: StepOutcome) -> dict[tuple[str, int], int]:
    return {(t.request_id, t.index): t.token_id for t in out.tokens}


def test_fcfs_admission_waits_for_capacity_for_every_choice():
    eng, b = make(slots=3)
    add(eng, b, "a", [1, 2, 3], 2)
    add(eng, b, "b", [4, 5], 2, n=3)  # needs 3 slots
    add(eng, b, "c", [6], 2)  # would fit, but comes after b
    admitted, _, _ = step(eng, b)
    assert admitted == ["a"] and [s.request_id for s in b.waiting] == ["b", "c"]
    assert b.capacity.used == 1 and not b.can_admit()
    _, _, out = step(eng, b)
    assert [(f.request_id, f.reason) for f in out.finished] == [("a", "length")] and b.capacity.used == 0
    admitted, plan, out = step(eng, b)
    assert admitted == ["b"] and b.capacity.used == 3 and [s.request_id for s in b.waiting] == ["c"]
    while b.running:
        step(eng, b)
    assert step(eng, b)[0] == ["c"]


def test_a_long_prompt_is_fed_in_chunks_while_others_decode():
    eng, b = make(budget=8)
    add(eng, b, "d", [5], 20)
    step(eng, b)
    prompt = list(range(100, 120))
    add(eng, b, "long", prompt, 3)
    chunks = []
    for _ in range(3):
        admitted, plan, out = step(eng, b)
        chunks.append(rows(plan)[1])
        assert rows(plan)[0][0] == "d" and plan.decode_rows == 1 and plan.prefill_tokens == len(chunks[-1][1])
        assert ("long", 0) not in tokens(out) or len(chunks) == 3
    assert chunks == [("long", prompt[:8], 0), ("long", prompt[8:16], 8), ("long", prompt[16:], 16)]
    assert tokens(out)[("long", 0)] == 10  # its script's first token, drawn from the last chunk
    assert plan.positions_max == 19 and not plan.launchable


def test_a_prompt_that_would_be_cut_beside_earlier_ones_waits_with_those_behind_it():
    eng, b = make(budget=8)
    add(eng, b, "p1", [1] * 5, 4)
    add(eng, b, "p2", [2] * 6, 4)  # 3 tokens of budget left: it would be cut, so it waits
    add(eng, b, "p3", [3] * 2, 4)  # fits, but waits behind p2 (FCFS)
    assert [r[0] for r in rows(step(eng, b)[1])] == ["p1"]
    _, plan, _ = step(eng, b)
    assert [(r[0], len(r[1])) for r in rows(plan)] == [("p1", 1), ("p2", 6), ("p3", 2)]
    add(eng, b, "p4", [4] * 20, 2)  # the step's first prompt: cut to the whole budget
    _, plan, _ = step(eng, b)
    assert rows(plan)[-1] == ("p4", [4] * 8, 0) and plan.prefill_tokens == 8 and plan.decode_rows == 3


def test_while_others_decode_a_long_prompt_is_chunked_within_the_mixed_step_budget():
    eng, b = make(slots=8, budget=1000, mixed=100, max_len=512)
    for i in range(3):
        add(eng, b, f"d{i}", [5 + i], 50)
    step(eng, b)
    prompt = [100 + i % 800 for i in range(400)]
    add(eng, b, "long", prompt, 2)
    fed = []
    while len(fed) < len(prompt):
        _, plan, out = step(eng, b)
        assert sorted(s.request_id for s, r in zip(plan.seqs, plan.rows) if not r.prompt) == ["d0", "d1", "d2"]
        assert plan.decode_rows == 3 and plan.decode_rows + plan.prefill_tokens <= 100
        fed += rows(plan)[-1][1]
    assert fed == prompt and len(eng.runner.plans) == 1 + 5  # 97 tokens a step beside 3 decode rows
    assert [len(p.rows[-1].token_ids) for p in eng.runner.plans[1:]] == [97, 97, 97, 97, 12]
    assert tokens(out)[("long", 0)] == 10  # the token came with the last chunk


def test_with_nobody_decoding_a_prompt_takes_max_prefill_tokens_and_decode_rows_cannot_starve_it():
    eng, b = make(slots=8, budget=300, mixed=100, max_len=1024)
    add(eng, b, "alone", [7] * 1000, 2)
    _, plan, _ = step(eng, b)
    assert plan.prefill_tokens == 300 and plan.decode_rows == 0  # the mixed budget only binds beside decode rows
    eng, b = make(slots=8, budget=300, mixed=4, max_len=256)
    for i in range(6):  # more decode rows than the budget
        add(eng, b, f"d{i}", [5], 50)
    step(eng, b)
    add(eng, b, "p", list(range(200)), 2)
    _, plan, _ = step(eng, b)
    assert plan.decode_rows == 6 and plan.prefill_tokens == MIN_PROMPT_CHUNK


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(1, 6), st.integers(0, 3)), min_size=1, max_size=8),
       st.integers(72, 200), st.integers(1, 400))
def test_the_mixed_budget_is_never_exceeded_and_every_decoding_stream_is_in_every_step(reqs, mixed, max_prefill):
    """Requests (prompt length, max tokens, arrival step) arrive over time: every step carries every
    sequence that decodes, its tokens stay within mixed_step_tokens whenever any decodes (the floor aside:
    at most 8 decode rows here, so mixed - rows >= MIN_PROMPT_CHUNK), within max_prefill_tokens otherwise,
    and every prompt is fed whole, in order."""
    eng, b = make(slots=8, budget=max_prefill, mixed=mixed, max_len=512)
    fed: dict[str, list[int]] = {}
    prompts = {f"r{i}": [100 + i] * n for i, (n, _, _) in enumerate(reqs)}
    t = 0
    while t < 4 or b.busy:
        for i, (n, m, at) in enumerate(reqs):
            if at == t:
                add(eng, b, f"r{i}", prompts[f"r{i}"], m)
        b.admit()
        decoding = {s.key for s in b.running.values() if not s.prefilling}
        plan = b.plan()
        assert {s.key for s, r in zip(plan.seqs, plan.rows) if not r.prompt} == decoding
        limit = mixed if decoding else max_prefill
        assert plan.prefill_tokens <= max_prefill and plan.decode_rows + plan.prefill_tokens <= max(limit, 1)
        for s, r in zip(plan.seqs, plan.rows):
            if r.prompt:
                assert r.start_pos == len(fed.get(s.request_id, []))
                fed.setdefault(s.request_id, []).extend(r.token_ids)
        b.settle(plan, eng.runner.run(plan))
        t += 1
    assert fed == prompts


@pytest.mark.parametrize("sampling", [HOT, SamplingParams()], ids=["sampled", "greedy"])
def test_choices_draw_from_the_shared_prefill_then_fork_its_cache(sampling):
    eng, b = make(budget=4)
    add(eng, b, "r", list(range(30, 36)), 5, sampling=sampling, n=3)
    _, plan, out = step(eng, b)  # the first chunk: no token yet
    assert plan.num_draws == 0 and not plan.forks and not out.tokens
    _, plan, out = step(eng, b)
    slots = [b.running["r", i].slot for i in range(3)]
    assert rows(plan) == [("r", [34, 35], 4)] and plan.num_draws == 3
    assert plan.forks == (Fork(slots[0], (slots[1], slots[2]), 6, 0, range(0, 3)),)
    assert eng.runner.forks == [*plan.forks]
    if sampling is HOT:
        assert [(d.row, d.index) for d in plan.draws] == [(0, 0), (0, 1), (0, 2)]
    else:
        assert plan.draws is None and plan.draw_rows == [0, 0, 0]
    assert sorted(tokens(out)) == [("r", 0), ("r", 1), ("r", 2)] and all(t.first for t in out.tokens)
    _, plan, _ = step(eng, b)
    assert [(r[0], r[2]) for r in rows(plan)] == [("r", 6)] * 3 and sorted(r.slot for r in plan.rows) == sorted(slots)


def test_cancel_releases_capacity_mid_prefill_mid_decode_and_while_waiting():
    eng, b = make(slots=4, budget=4)
    add(eng, b, "pre", list(range(10)), 5, n=3)
    add(eng, b, "dec", [7], 5)
    step(eng, b)
    assert b.running["pre", 0].prefilling and b.capacity.used == 4
    add(eng, b, "wait", [8], 5)
    assert b.drop("pre") and b.capacity.used == 1  # its siblings' slots too
    assert b.drop("wait") and not b.waiting
    step(eng, b)
    assert b.drop("dec") and b.capacity.used == 0 and not b.running
    assert not b.drop("dec") and eng.cache.free_slots == 4


def test_a_stop_string_ends_one_choice_and_the_last_choice_ends_the_request():
    eng, b = make()
    add(eng, b, "r", [1, 2], 3, n=2)
    step(eng, b)
    assert b.stop_choice("r", 1) is None and b.capacity.used == 1 and ("r", 1) not in b.running
    assert b.stop_choice("r", 1) is None and b.stop_choice("nobody", 0) is None
    _, _, out = step(eng, b)
    _, _, out = step(eng, b)
    assert [(f.request_id, f.reason) for f in out.finished] == [("r", "length")]
    add(eng, b, "s", [1, 2], 9)
    step(eng, b)
    finished = b.stop_choice("s", 0)
    assert (finished.request_id, finished.reason) == ("s", "stop") and b.capacity.used == 0


def test_finish_reasons_eos_stop_token_and_length():
    scripts = {"eos": [11, EOS, 13], "kept": [11, EOS, 13], "tok": [11, 12, 13], ("two", 0): [40, 41], ("two", 1): [50]}
    eng, b = make(slots=8, scripts=scripts)
    add(eng, b, "eos", [1], 5)
    add(eng, b, "kept", [1], 3, ignore_eos=True)
    add(eng, b, "tok", [1], 5, stop_token_ids=(12,))
    add(eng, b, "two", [1], 2, n=2, stop_token_ids=(50,))
    reasons, finished, streams = {}, {}, {}
    while b.busy:
        out = step(eng, b)[2]
        for t in out.tokens:
            streams.setdefault((t.request_id, t.index), []).append(t.token_id)
            if t.finish_reason:
                reasons[t.request_id, t.index] = t.finish_reason
        finished.update({f.request_id: f.reason for f in out.finished})
    assert streams == {("eos", 0): [11, EOS], ("kept", 0): [11, EOS, 13], ("tok", 0): [11, 12],
                       ("two", 0): [40, 41], ("two", 1): [50]}
    assert reasons == {("eos", 0): "stop", ("kept", 0): "length", ("tok", 0): "stop", ("two", 0): "length",
                       ("two", 1): "stop"}
    assert finished == {"eos": "stop", "kept": "length", "tok": "stop", "two": "length"}  # "length" if any choice
    assert eng.cache.free_slots == 8


def test_which_steps_may_run_overlapped():
    eng, b = make(slots=4)

    def launchable(launch: bool = True) -> bool:
        plan = b.plan(launch)
        b.settle(plan, eng.runner.run(plan))
        return plan.launchable

    add(eng, b, "g", [1, 2], 9)
    add(eng, b, "h", [3], 9)
    step(eng, b)
    assert launchable()  # plain greedy decode rows only
    assert not launchable(launch=False)  # the loop admitted a request this step
    add(eng, b, "s", [4], 9, sampling=HOT)
    b.admit()
    assert not launchable()  # a prompt row
    assert not launchable()  # a sampled row
    b.drop("s")
    assert launchable()
    eng2, off = make(overlap=False)
    add(eng2, off, "g", [1], 9)
    step(eng2, off)
    plan = off.plan(launch=True)
    assert not plan.launchable and off.successor(plan) is None


def test_the_successor_of_a_step_in_flight_feeds_its_rows_and_stops_for_a_newcomer():
    eng, b = make(slots=3)
    add(eng, b, "a", [1], 2)  # its in-flight token will be its last
    add(eng, b, "b", [2], 9)
    step(eng, b)
    first = b.plan(launch=True)
    nxt = b.successor(first)
    assert rows(nxt) == [("b", [0], 2)] and nxt.feed == [1] and nxt.launchable
    add(eng, b, "c", [3], 9)  # fits: the chain stops so that it is admitted
    assert b.successor(nxt) is None
    add(eng, b, "big", [4], 9, n=3)  # waits behind c, and c is admitted first
    b.admit()
    assert b.successor(nxt) is not None  # nobody waiting fits: the chain goes on


def test_a_sequence_that_ends_while_a_step_is_in_flight_drops_that_row():
    eng, b = make(scripts={"a": [11, 12, 13, 14, 15]})
    add(eng, b, "a", [1], 20, stop_token_ids=(13,))
    add(eng, b, "b", [2], 20)
    add(eng, b, "c", [3], 20)
    step(eng, b)

    def turn(flight):
        """engine.loop's overlapped turn: launch the successor, then read the step in flight."""
        plan = b.successor(flight[0])
        nxt = (plan, eng.runner.launch(plan)) if plan is not None else None
        return nxt, b.settle_launched(flight[0], eng.runner.collect(flight[1]))

    plan = b.plan(launch=True)
    flight, out = turn((plan, eng.runner.launch(plan)))
    outs = [out]
    assert b.drop("c")  # cancelled between steps, with its next step launched
    for _ in range(3):
        flight, out = turn(flight)
        outs.append(out)
    assert [t.token_id for t in outs[0].tokens if t.request_id == "a"] == [12]
    assert [(t.token_id, t.finish_reason) for t in outs[1].tokens if t.request_id == "a"] == [(13, "stop")]
    # c's row of the step in flight when it was cancelled; then a's row of the step launched before its
    # stop token was read: each dropped with its token
    assert [s.request_id for s in outs[1].served] == ["a", "b"] and outs[1].dropped == 1
    assert [s.request_id for s in outs[2].served] == ["b"] and outs[2].dropped == 1 and outs[2].draws == 1
    assert {t.request_id for o in outs[1:] for t in o.tokens} == {"a", "b"} and len(outs[2].tokens) == 1
    assert outs[3].dropped == 0 and b.capacity.used == 1


def test_a_failure_in_the_result_drops_only_its_request():
    eng, b = make(slots=6, budget=4)
    add(eng, b, "n", [1, 2], 6, sampling=HOT)
    add(eng, b, "x", [3, 4], 6, sampling=HOT, n=2)
    add(eng, b, "e", list(range(50, 60)), 6, sampling=SamplingParams(prompt_logprobs=1))
    eng.runner.fail_draws["x"] = "OverflowError: its top_k"
    _, plan, out = step(eng, b)
    assert [f.request_id for f in out.failed] == ["x"] and "OverflowError" in out.failed[0].message
    assert not eng.runner.forks and ("x", 0) not in b.running and ("x", 1) not in b.running
    assert set(tokens(out)) == {("n", 0)} and b.capacity.used == 2  # n and e
    eng.runner.fail_rows["e"] = "ValueError: its prompt log-probs"
    _, plan, out = step(eng, b)
    assert [f.request_id for f in out.failed] == ["e"] and not out.prompt_logprobs
    assert set(tokens(out)) == {("n", 0)} and b.capacity.used == 1 and list(b.running) == [("n", 0)]


def test_prompt_log_probs_are_asked_for_chunk_by_chunk():
    eng, b = make(budget=4)
    prompt = list(range(200, 210))
    add(eng, b, "e", prompt, 2, sampling=SamplingParams(prompt_logprobs=1))
    events, outs = [], []
    for _ in range(3):
        outs.append(step(eng, b)[2])
        events += outs[-1].prompt_logprobs
    wants = [plan.prompt_wants[0] for plan in eng.runner.plans]
    assert [(w.n, w.first, w.targets) for w in wants] == [(1, True, prompt[1:5]), (1, False, prompt[5:9]),
                                                            (1, False, prompt[9:])]
    assert [p.start for p in events] == [0, 5, 9] and [len(o.tokens) for o in outs] == [0, 0, 1]
    assert [e for p in events for e in p.entries] == [None] + [(float(t), ()) for t in prompt[1:]]


def test_the_plan_and_the_result_are_immutable():
    eng, b = make()
    add(eng, b, "a", [1], 2)
    b.admit()
    plan = b.plan()
    result = eng.runner.run(plan)
    with pytest.raises(AttributeError):
        plan.rows = []
    with pytest.raises(AttributeError):
        result.tokens = []


def test_sampled_decode_steps_run_overlapped_where_the_device_samples():
    """With sampled_overlap (the runner samples inside the decode graph) a sampled decode step is
    launchable; its successor's draws count the token still in flight (the penalties' history of a
    launched step is kept on the device); a chain of plain greedy rows drops back to the fast path;
    a draw that fails in a launched step drops its request alone."""
    eng = FakeEngine(4)
    b = Batcher(PagedCapacity(eng.cache), EOS, overlap=True, sampled_overlap=True)
    add(eng, b, "s", [4, 5], 9, sampling=SamplingParams(temperature=0.8, presence_penalty=0.5, seed=3))
    add(eng, b, "g", [6], 2)
    add(eng, b, "x", [7], 9, sampling=HOT)
    step(eng, b)
    plan = b.plan(launch=True)
    assert plan.launchable and [d.step for d in plan.draws] == [1, 1, 1] and [d.row for d in plan.draws] == [0, 1, 2]
    nxt = b.successor(plan)  # g's in-flight token is its last: s and x go on
    s = b.running[("s", 0)]
    assert [q.request_id for q in nxt.seqs] == ["s", "x"] and nxt.feed == [0, 2]
    assert [(d.row, d.step) for d in nxt.draws] == [(0, 2), (1, 2)] and nxt.draws[0].output_ids is s.output_ids
    out = b.settle_launched(plan, StepResult.greedy([21, 22, 23]))
    assert len(out.tokens) == 3 and not out.failed
    failed = StepResult([-1, 31], [None, None], [(), ()], failed={0: "ValueError: its temperature"})
    out = b.settle_launched(nxt, failed._replace(sampled=True))
    assert [f.request_id for f in out.failed] == ["s"] and [t.request_id for t in out.tokens] == ["x"]
    assert list(b.running) == [("x", 0)] and b.capacity.used == 1
    off = Batcher(PagedCapacity(FakeEngine(4).cache), EOS, overlap=True)  # the host samples: one at a time
    add(eng, off, "h", [1], 5, sampling=HOT)
    off.admit()
    off.settle(p := off.plan(), eng.runner.run(p))
    assert not off.plan(launch=True).launchable
    add(eng, b, "p", [9], 9)  # plain greedy rows only: the chain's successor has no draws
    b.drop("x")
    b.admit()
    b.settle(p := b.plan(), eng.runner.run(p))
    plain = b.plan(launch=True)
    assert plain.launchable and plain.draws is None and b.successor(plain).draws is None
