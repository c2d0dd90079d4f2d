"""The GPU loop (engine/loop.py) on a fake engine, without a model or a thread where it can be
driven step by step: the events and step records of a run with and without overlapped decode, a
device fault ending the loop with every held request failed, the idle wait checking the expert
ranks, and a shutdown releasing what it held."""
from __future__ import annotations

import time

from pegainfer.engine.contract import Admit, EngineDied, InjectFailure, PrefillStarted, Shutdown, StepEvents
from pegainfer.engine.loop import IDLE_WAKE_S, GpuThread
from pegainfer.ep.backend import RankFailure
from tests.engine.fake_engine import FakeEngine


def drive(gpu: GpuThread, cmds: list) -> list:
    """Apply the commands, then turn the loop until it is idle (as its thread does, without one)."""
    events: list = []
    gpu._emit = events.append
    for c in cmds:
        gpu.submit(c)
    assert gpu._apply(gpu._drain(block=False))
    while gpu.batcher.busy or gpu.in_flight:
        gpu.tick()
    return events


def summary(events: list) -> tuple[dict, dict, list]:
    tokens, finished, records = {}, {}, []
    for ev in events:
        if isinstance(ev, StepEvents):
            for t in ev.tokens:
                tokens.setdefault((t.request_id, t.index), []).append(t.token_id)
            finished.update({f.request_id: f.reason for f in ev.finished})
            records += [ev.record] if ev.record else []
    return tokens, finished, records


def test_events_and_step_records_with_and_without_overlap():
    runs = {}
    for overlap in (False, True):
        eng = FakeEngine(slots=4)
        gpu = GpuThread(eng, None, overlap=overlap)
        events = drive(gpu, [Admit("a", [1, 2, 3], 4), Admit("b", [4, 5], 3, n=2)])
        assert isinstance(events[0], PrefillStarted) and events[0].request_ids == ["a", "b"]
        runs[overlap] = (*summary(events), gpu)
        assert eng.cache.free_slots == 4
    tokens, finished, records, gpu = runs[True]
    ref_tokens, ref_finished, ref_records, ref_gpu = runs[False]
    assert tokens == ref_tokens and finished == ref_finished == {"a": "length", "b": "length"}
    assert [len(tokens[k]) for k in (("a", 0), ("b", 0), ("b", 1))] == [4, 3, 3]
    shape = [(r.step, r.phase, r.rows, r.decode_rows, r.prefill_tokens, r.positions_max, r.draws, r.request_ids,
              r.kv_slots_used, r.sampled, r.dropped_rows) for r in records]
    assert shape == [(r.step, r.phase, r.rows, r.decode_rows, r.prefill_tokens, r.positions_max, r.draws,
                      r.request_ids, r.kv_slots_used, r.sampled, r.dropped_rows) for r in ref_records]
    assert shape == [(1, "prefill", 2, 0, 5, 2, 3, ["a", "b"], 3, False, 0),
                     (2, "decode", 3, 3, 0, 3, 3, ["a", "b"], 3, False, 0),
                     (3, "decode", 3, 3, 0, 4, 3, ["a", "b"], 1, False, 0),
                     (4, "decode", 1, 1, 0, 5, 1, ["a"], 0, False, 0)]
    assert [r.overlapped for r in records] == [False, False, True, True] and gpu.overlapped_steps == 2
    assert not any(r.overlapped for r in ref_records) and ref_gpu.overlapped_steps == 0
    assert (gpu.steps, gpu.decode_batch_max, gpu.prefill_tokens) == (4, 3, 5) == (ref_gpu.steps,
                                                                                    ref_gpu.decode_batch_max,
                                                                                    ref_gpu.prefill_tokens)


def test_a_device_fault_ends_the_loop_and_fails_every_held_request():
    eng = FakeEngine(slots=2)
    events: list = []
    gpu = GpuThread(eng, events.append)
    for cmd in (Admit("a", [1], 9), Admit("b", [2], 9, n=2)):  # b waits for capacity
        gpu.submit(cmd)
    eng.runner.fault = RuntimeError("CUDA error: an illegal memory access was encountered")
    gpu._run()  # returns once the loop has ended
    died = events[-1]
    assert isinstance(died, EngineDied) and "CUDA error" in died.message and gpu.error == died.message
    assert [f.request_id for f in died.failed] == ["a", "b"]
    assert not gpu.running and not gpu.waiting and gpu.in_flight is None


def test_the_idle_loop_checks_the_expert_ranks_and_refreshes_its_heartbeat():
    eng = FakeEngine()
    gpu = GpuThread(eng, lambda ev: None)
    gpu.start()
    start = gpu.heartbeat
    time.sleep(3 * IDLE_WAKE_S)
    gpu.submit(Shutdown())
    gpu.join(5)
    assert not gpu.is_alive() and gpu.error is None
    assert eng.backend.checks >= 2 and gpu.heartbeat > start
    eng.backend.failure = RankFailure("expert rank 1 exited")
    events: list = []
    lost = GpuThread(eng, events.append)
    lost._run()
    assert isinstance(events[-1], EngineDied) and "expert rank 1 exited" in events[-1].message


def test_shutdown_releases_held_requests_and_an_injected_failure_fails_one():
    eng = FakeEngine(slots=2)
    gpu = GpuThread(eng, None)
    drive(gpu, [])
    events: list = []
    gpu._emit = events.append
    for cmd in (Admit("a", [1], 30), Admit("b", [2], 30), Admit("c", [3], 30)):
        gpu.submit(cmd)
    assert gpu._apply(gpu._drain(block=False))
    gpu.tick()
    gpu.tick()  # a step in flight
    gpu.submit(InjectFailure("a", "injected"))
    assert gpu._apply(gpu._drain(block=False))
    assert [(f.request_id, f.message) for f in events[-1].failed] == [("a", "injected")]
    gpu.submit(Shutdown())
    assert not gpu._apply(gpu._drain(block=False))
    assert [r.request_id for r in events[-1].released] == ["b", "c"]
    assert eng.cache.free_slots == 2 and not gpu.running and not gpu.waiting
