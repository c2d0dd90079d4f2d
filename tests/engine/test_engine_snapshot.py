"""The GPU thread publishes its state as the contract's EngineSnapshot with every StepEvents (and
with its death), so that /ready and the metrics never read its objects: each snapshot is the state
the events leave (steps counted, KV slots given back by the step that ended a request, nothing
running once every request ended), and an Admit that breaks an invariant fails alone with one."""
from __future__ import annotations

import queue

import pytest

from pegainfer.engine.contract import Admit, EngineSnapshot, SamplingParams, Shutdown, StepEvents
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.loop import GpuThread


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=4))
    yield e
    e.close()


def run(engine, admits: list[Admit], overlap: bool) -> list[StepEvents]:
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, overlap=overlap)
    first = gpu.snapshot()
    pages = engine.cache.num_pages
    assert first == EngineSnapshot(0, 0, 0, 0, 0, overlap, 4, 4, pages, pages, 64)
    for a in admits:
        gpu.submit(a)
    gpu.start()
    out, ended = [], set()
    while len(ended) < len(admits):
        ev = events.get(timeout=60)
        if isinstance(ev, StepEvents):
            out.append(ev)
            ended |= {f.request_id for f in ev.finished} | {f.request_id for f in ev.failed}
    gpu.submit(Shutdown())
    gpu.join(10)
    assert gpu.error is None
    return out


@pytest.mark.parametrize("overlap", [False, True])
def test_every_step_publishes_the_state_it_leaves(engine, overlap):
    admits = [Admit("a", [5, 6, 7], 3, True), Admit("b", [8, 9], 6, True, SamplingParams(temperature=0.8, seed=1), 2),
              Admit("bad", [5, 10**6], 2)]  # outside the vocabulary: an invariant the parse guarantees
    events = run(engine, admits, overlap)
    assert all(isinstance(ev.snapshot, EngineSnapshot) for ev in events)
    steps = [ev for ev in events if ev.record is not None]
    assert [ev.snapshot.steps for ev in steps] == [ev.record.step for ev in steps]
    assert all(ev.snapshot.kv_slots_used == ev.record.kv_slots_used for ev in steps if not ev.record.overlapped)
    failed = next(ev for ev in events if ev.failed)
    assert [f.request_id for f in failed.failed] == ["bad"]
    last = events[-1].snapshot
    assert (last.running, last.waiting, last.kv_slots_free, last.kv_slots_total) == (0, 0, 4, 4)
    assert last.kv_pages_used == 0 and last.kv_pages_total == engine.cache.num_pages  # every page back
    assert min(ev.snapshot.kv_pages_free for ev in events) < last.kv_pages_free
    assert last.prefix_cache_queries >= 5 and last.preemptions == 0
    assert last.decode_batch_max >= 2 and last.async_scheduling is overlap
    ended_a = next(ev for ev in events if any(f.request_id == "a" for f in ev.finished))
    assert ended_a.snapshot.kv_slots_free > min(ev.snapshot.kv_slots_free for ev in events)
