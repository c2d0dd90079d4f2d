"""Where the shared experts run beside the routed ones (ep.moe.SHARED_SCHEDULE) on CUDA, skipped
without a GPU: every placement is a different order of the same launches on two streams, so the
decode graphs of each must give the tokens of the default placement bit for bit (bf16, Triton
kernels, tiny preset, several rows at different positions).
Run on a GPU machine: pytest tests/engine/test_gpu_shared_schedule.py"""
from __future__ import annotations

import queue

import pytest
import torch

from engine.engine import EngineSpec, build_engine
from engine.gpu_thread import GpuThread
from engine.messages import Admit, Shutdown, StepEvents
from ep import moe

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[5, 9, 200, 31], [7], list(range(40, 140)), [300, 301, 302, 303, 304]]
MAXES = [24, 9, 17, 30]


def _tokens(schedule: str, monkeypatch) -> dict:
    monkeypatch.setattr(moe, "SHARED_SCHEDULE", schedule)  # read while the graphs are captured
    engine = build_engine(EngineSpec(random_preset="tiny", device="cuda:0", dtype="bfloat16", num_slots=8))
    assert engine.runner.graphs is not None and engine.model.side_stream is not None
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, overlap=True)
    gpu.start()
    for i, (p, m) in enumerate(zip(PROMPTS, MAXES)):
        gpu.submit(Admit(f"r{i}", p, m, ignore_eos=True))
    tokens, done = {}, set()
    while len(done) < len(PROMPTS):
        try:
            ev = events.get(timeout=1)
        except queue.Empty:
            assert gpu.error is None and gpu.is_alive(), gpu.error  # a failed step: say so, do not wait on
            continue
        if isinstance(ev, StepEvents):
            for t in ev.tokens:
                tokens.setdefault(t.request_id, []).append(t.token_id)
            done.update(f.request_id for f in ev.finished)
    gpu.submit(Shutdown())
    gpu.join(30)
    assert gpu.error is None
    engine.close()
    return tokens


def test_every_shared_expert_placement_gives_the_same_tokens(monkeypatch):
    want = _tokens("beside", monkeypatch)
    assert [len(want[f"r{i}"]) for i in range(len(PROMPTS))] == MAXES
    for schedule in moe.SHARED_SCHEDULES:
        if schedule != "beside":
            assert _tokens(schedule, monkeypatch) == want, schedule
