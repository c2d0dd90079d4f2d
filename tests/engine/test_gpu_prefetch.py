"""L2 prefetches on the side stream (engine/kernels/prefetch.py, engine.decode.L2_PREFETCH) on CUDA,
skipped without a GPU: they change no bit of what a one-row decode produces, and the captured
graphs with the extra fork (joined by the MoE layer's own join) replay.
Run on a GPU machine: pytest tests/engine/test_gpu_prefetch.py"""
from __future__ import annotations

import queue

import pytest
import torch

from engine import decode
from engine.engine import EngineSpec, build_engine
from engine.gpu_thread import GpuThread
from engine.messages import Admit, Shutdown, StepEvents

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _tokens(prefetch: tuple[str, ...], monkeypatch) -> list[int]:
    monkeypatch.setattr(decode, "L2_PREFETCH", prefetch)
    engine = build_engine(EngineSpec(random_preset="tiny", device="cuda:0", dtype="bfloat16", num_slots=4))
    assert engine.runner.graphs is not None
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, overlap=True)
    gpu.start()
    gpu.submit(Admit("r0", list(range(40, 90)), 40, ignore_eos=True))
    tokens: list[int] = []
    done = False
    while not done:
        ev = events.get(timeout=300)
        if isinstance(ev, StepEvents):
            tokens += [t.token_id for t in ev.tokens]
            done = bool(ev.finished)
    gpu.submit(Shutdown())
    gpu.join(30)
    assert gpu.error is None
    engine.close()
    return tokens


def test_prefetching_weights_into_l2_changes_no_token(monkeypatch):
    plain = _tokens((), monkeypatch)
    assert len(plain) == 40
    assert _tokens(("o_proj", "shared_down", "shared_gate_up"), monkeypatch) == plain
