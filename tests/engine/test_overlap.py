"""Overlapped decode: the GPU thread launches step N+1 (ids fed from step N's tokens on the device)
before it reads step N. The tokens must be exactly those of offline generation and of the thread
without overlap; a sequence that ends at N (stop token, stop string, cancel) must not emit the token
the speculative step N+1 made for it; slots come back. Run with the eager runner and with the real
DecodeGraphs buffers and feed (replayed eagerly on the CPU)."""
from __future__ import annotations

import queue

import pytest

from pegainfer.engine.cuda_graphs import DecodeGraphs
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.generate import generate
from pegainfer.engine.loop import GpuThread
from pegainfer.engine.contract import Admit, Cancel, Released, Shutdown, StepEvents, StopChoice

PROMPTS = [[5, 9, 200, 31], [7], list(range(40, 90)), [300, 301, 302, 303], [12, 13]]
MAXES = [12, 5, 9, 20, 1]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=8))
    yield e
    e.close()


@pytest.fixture(params=["eager", "graph_buffers"])
def runner_kind(request, engine):
    """The eager runner, or the runner driving DecodeGraphs (its inputs, feed gather, tokens buffer
    and two turns of host buffers) with each 'graph' replayed as the plain step on the CPU."""
    if request.param == "graph_buffers":
        engine.runner.graphs = DecodeGraphs(engine.model, engine.cache, engine.cache.num_slots,
                                            engine.cache.scratch_slot)
    yield request.param
    engine.runner.graphs = None


class Session:
    def __init__(self, engine, overlap: bool):
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.gpu = GpuThread(engine, self.events.put, overlap=overlap)
        self.gpu.start()
        self.tokens: dict[str, list[int]] = {}
        self.finished: dict[str, str] = {}
        self.released: set[str] = set()
        self.records = []
        self.after_release: list[str] = []  # tokens that arrived for a request after its Released

    def pump(self, until) -> None:
        while not until():
            ev = self.events.get(timeout=60)
            if not isinstance(ev, StepEvents):
                continue
            for t in ev.tokens:
                if t.request_id in self.released:
                    self.after_release.append(t.request_id)
                self.tokens.setdefault(t.request_id, []).append(t.token_id)
            self.finished.update({f.request_id: f.reason for f in ev.finished})
            self.released |= {r.request_id for r in ev.released}
            if ev.record:
                self.records.append(ev.record)

    def close(self) -> None:
        self.gpu.submit(Shutdown())
        self.gpu.join(10)
        assert not self.gpu.is_alive() and self.gpu.error is None


def offline(engine, prompts, maxes):
    return [generate(engine, [p], m, ignore_eos=True)[0].token_ids for p, m in zip(prompts, maxes)]


@pytest.mark.parametrize("overlap", [True, False])
def test_tokens_match_offline_with_and_without_overlap(engine, runner_kind, overlap):
    ref = offline(engine, PROMPTS, MAXES)
    s = Session(engine, overlap)
    for i, (p, m) in enumerate(zip(PROMPTS, MAXES)):
        s.gpu.submit(Admit(f"r{i}", p, m, ignore_eos=True))
    s.pump(lambda: len(s.finished) == len(PROMPTS))
    s.close()
    assert [s.tokens[f"r{i}"] for i in range(len(PROMPTS))] == ref
    assert all(reason == "length" for reason in s.finished.values())
    overlapped = [r for r in s.records if r.overlapped]
    if overlap:
        # rows left the chain at different steps (max_tokens 5, 9, 12, 20): the feed mapped rows
        # of step N to other rows of step N+1
        assert len(overlapped) >= 10 and {r.rows for r in overlapped} >= {1, 2, 3}
        assert s.gpu.overlapped_steps == len(overlapped)
    else:
        assert not overlapped and s.gpu.overlapped_steps == 0
    assert engine.cache.free_slots == engine.cache.num_slots


def test_a_stop_token_ends_the_sequence_and_drops_the_speculative_token(engine, runner_kind):
    """The stop token is learned one step late: step N+1 already ran for that row; its token must
    not reach the client, and the neighbour keeps its exact tokens."""
    ref_a, ref_b = offline(engine, [PROMPTS[0], PROMPTS[2]], [30, 30])
    stop = ref_a[4]
    cut = ref_a.index(stop) + 1
    s = Session(engine, True)
    s.gpu.submit(Admit("a", PROMPTS[0], 30, ignore_eos=True, stop_token_ids=(stop,)))
    s.gpu.submit(Admit("b", PROMPTS[2], 30, ignore_eos=True))
    s.pump(lambda: len(s.finished) == 2)
    s.close()
    assert s.finished == {"a": "stop", "b": "length"}
    assert s.tokens["a"] == ref_a[:cut]
    assert s.tokens["b"] == ref_b
    # "a" was served by the prefill and cut - 1 decode steps; the step after them had been launched
    # with its row before the stop was read: two rows, one dropped, only "b" served
    with_a = [r.step for r in s.records if "a" in r.request_ids]
    assert len(with_a) == cut
    late = next(r for r in s.records if r.step == with_a[-1] + 1)
    assert late.overlapped and late.rows == 2 and late.dropped_rows == 1 and late.request_ids == ["b"]
    assert sum(r.dropped_rows for r in s.records) == 1
    assert engine.cache.free_slots == engine.cache.num_slots


def test_cancel_and_stop_string_while_a_step_is_in_flight(engine, runner_kind):
    """A Cancel and a StopChoice arrive between steps, with the next step already launched: no token
    of theirs after the Released / the stop, the other stream exact, every slot back."""
    ref_c = offline(engine, [PROMPTS[3]], [40])[0]
    s = Session(engine, True)
    s.gpu.submit(Admit("a", PROMPTS[0], 200, ignore_eos=True))
    s.gpu.submit(Admit("b", PROMPTS[1], 200, ignore_eos=True))
    s.gpu.submit(Admit("c", PROMPTS[3], 40, ignore_eos=True))
    s.pump(lambda: len(s.tokens.get("a", [])) >= 3)
    assert s.gpu.in_flight is not None or "c" in s.finished
    s.gpu.submit(Cancel("a"))
    s.gpu.submit(StopChoice("b", 0))
    s.pump(lambda: "a" in s.released and "b" in s.finished and "c" in s.finished)
    b_tokens = len(s.tokens["b"])
    s.close()
    assert s.after_release == []
    assert s.finished["b"] == "stop" and len(s.tokens["b"]) == b_tokens
    assert s.tokens["c"] == ref_c
    assert len(s.tokens["a"]) < 200 and "a" not in s.finished
    assert engine.cache.free_slots == engine.cache.num_slots


def test_a_waiting_request_is_admitted_between_overlapped_steps(engine, runner_kind):
    """With every slot busy a new request waits; the chain stops launching ahead once a slot frees,
    the newcomer prefills, and every request keeps its offline tokens."""
    small = build_engine(EngineSpec(model_dir=str(engine.spec.model_dir), num_slots=2))
    if runner_kind == "graph_buffers":
        small.runner.graphs = DecodeGraphs(small.model, small.cache, 2, small.cache.scratch_slot)
    try:
        maxes = [6, 15, 8]
        prompts = [PROMPTS[0], PROMPTS[3], PROMPTS[4]]
        ref = offline(small, prompts, maxes)
        s = Session(small, True)
        for i, (p, m) in enumerate(zip(prompts, maxes)):
            s.gpu.submit(Admit(f"r{i}", p, m, ignore_eos=True))
        s.pump(lambda: len(s.finished) == 3)
        s.close()
        assert [s.tokens[f"r{i}"] for i in range(3)] == ref
        assert any(r.phase == "mixed" or (r.phase == "prefill" and "r2" in r.request_ids) for r in s.records)
        assert any(r.overlapped for r in s.records)
        assert small.cache.free_slots == 2
    finally:
        small.close()


def test_graph_buffers_keep_two_launched_steps_apart(engine):
    """Two steps launched before either is read: each read returns its own step's tokens (two turns
    of host buffers), and the second step's fed ids were the first step's tokens."""
    graphs = DecodeGraphs(engine.model, engine.cache, engine.cache.num_slots, engine.cache.scratch_slot)
    engine.runner.graphs = graphs
    slots = [engine.cache.allocate() for _ in range(2)]
    try:
        prompts = [PROMPTS[0], PROMPTS[3]]
        ref = offline(engine, prompts, [3, 3])
        from pegainfer.engine.batch import RowInput
        from pegainfer.engine.step_plan import StepPlan
        first = engine.runner.run(StepPlan.greedy([RowInput(sl, p, 0) for sl, p in zip(slots, prompts)])).tokens
        n0 = [len(p) for p in prompts]
        step1 = graphs.launch([RowInput(sl, [t], n) for sl, t, n in zip(slots, first, n0)])
        # the second step's rows in the other order: row 0 reads row 1's token of the step before
        step2 = graphs.launch([RowInput(slots[1], [0], n0[1] + 1), RowInput(slots[0], [0], n0[0] + 1)], [1, 0])
        second, third = graphs.collect(step1), graphs.collect(step2)
        assert [first[0], second[0], third[1]] == ref[0]
        assert [first[1], second[1], third[0]] == ref[1]
        with pytest.raises(RuntimeError, match="greedy graph step"):
            graphs.run([RowInput(slots[0], [first[0]], n0[0])], logits=True)
            graphs.launch([RowInput(slots[0], [0], n0[0])], [0])
    finally:
        for sl in slots:
            engine.cache.release(sl)
        engine.runner.graphs = None


def test_steps_run_uncounted_leave_the_expert_counters_as_they_were(engine):
    """What the graphs' capture warm-up runs under: no routes of it reach a step's record."""
    engine.counters.take()
    with engine.model.routes.uncounted():
        generate(engine, [PROMPTS[0]], 3, ignore_eos=True)
    assert sum(engine.counters.take().routes_per_expert) == 0
    generate(engine, [PROMPTS[0]], 3, ignore_eos=True)
    assert sum(engine.counters.take().routes_per_expert) > 0
