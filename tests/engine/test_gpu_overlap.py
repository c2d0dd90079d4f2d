"""Overlapped decode on CUDA (skipped without a GPU): the captured graphs gather each row's input id
from the previous step's tokens on the device. With the same step compositions (ignore_eos, length
limits only) the tokens must be bit-for-bit those of the thread reading every step before the next,
in bf16 with the Triton kernels; a stop token must still cut its stream at the right token. Run on a
GPU machine: pytest tests/engine/test_gpu_overlap.py"""
from __future__ import annotations

import queue

import pytest
import torch

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.loop import GpuThread
from pegainfer.engine.contract import Admit, Shutdown, StepEvents

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[5, 9, 200, 31], [7], list(range(40, 140)), [300, 301, 302, 303, 304], [12, 13], list(range(500, 530))]
MAXES = [24, 5, 17, 40, 1, 33]


def _run(engine, overlap: bool, admits: list[Admit]) -> tuple[dict, dict, list]:
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, overlap=overlap)
    gpu.start()
    for a in admits:
        gpu.submit(a)
    tokens, finished, records = {}, {}, []
    while len(finished) < len(admits):
        ev = events.get(timeout=300)
        if isinstance(ev, StepEvents):
            for t in ev.tokens:
                tokens.setdefault(t.request_id, []).append(t.token_id)
            finished.update({f.request_id: f.reason for f in ev.finished})
            if ev.record:
                records.append(ev.record)
    gpu.submit(Shutdown())
    gpu.join(30)
    assert gpu.error is None
    return tokens, finished, records


@pytest.fixture(scope="module")
def engine():
    # no prefix caching: each test runs the same prompts twice, and a second run that reused the first's
    # pages would prefill fewer tokens (an H100 run failed the routes comparison on exactly that: the
    # second run's first step skipped the 100-token prompt's cached page; the first run's step counted
    # its 256-token graph bucket, padding included)
    e = build_engine(EngineSpec(random_preset="tiny", device="cuda:0", dtype="bfloat16", num_slots=8,
                                kv_cache_tokens=8 * 4096, prefix_caching=False))  # not most of the free memory
    assert e.runner.graphs is not None
    yield e
    e.close()


def test_overlapped_graph_steps_equal_the_step_by_step_thread(engine):
    admits = [Admit(f"r{i}", p, m, ignore_eos=True) for i, (p, m) in enumerate(zip(PROMPTS, MAXES))]
    ref, ref_reasons, ref_records = _run(engine, False, admits)
    got, reasons, records = _run(engine, True, admits)
    assert got == ref and reasons == ref_reasons
    assert not any(r.overlapped for r in ref_records)
    assert sum(r.overlapped for r in records) >= 30
    assert [(r.rows, r.positions_max) for r in records] == [(r.rows, r.positions_max) for r in ref_records]
    # the expert counters of a launched-ahead step are read without a wait, yet match step by step
    assert [r.routes_per_expert for r in records] == [r.routes_per_expert for r in ref_records], \
        [(i, sum(a.routes_per_expert), sum(b.routes_per_expert), a.rows) for i, (a, b) in enumerate(zip(records, ref_records))
         if a.routes_per_expert != b.routes_per_expert]
    assert all(sum(r.routes_per_expert) > 0 for r in records)
    assert engine.cache.free_slots == engine.cache.num_slots


def test_a_stop_token_cuts_the_overlapped_stream(engine):
    ref, _, _ = _run(engine, False, [Admit("a", PROMPTS[2], 30, ignore_eos=True)])
    stop = ref["a"][6]
    cut = ref["a"].index(stop) + 1
    got, reasons, records = _run(engine, True, [Admit("a", PROMPTS[2], 30, ignore_eos=True, stop_token_ids=(stop,)),
                                                Admit("b", PROMPTS[0], 30, ignore_eos=True)])
    assert got["a"] == ref["a"][:cut] and reasons["a"] == "stop"
    assert sum(r.dropped_rows for r in records) == 1
    assert engine.cache.free_slots == engine.cache.num_slots
