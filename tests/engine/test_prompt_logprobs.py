"""Prompt log-probs (echo with logprobs) are computed chunk by chunk within the prefill budget, and
within a chunk a slice of positions at a time: the result equals the one-pass computation for any
budget (chunk boundaries included) and HF's log-softmax, and one 4,000-token prompt with echo and
logprobs 5 at DeepSeek's vocabulary of 102,400 costs less than 100 MB of peak memory more than the
same prompt without (it cost 3.2 GB when every position's [V] logits were built at once)."""
from __future__ import annotations

import multiprocessing
import queue
import resource

import pytest
import torch

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.loop import GpuThread
from pegainfer.engine.contract import Admit, EngineDied, SamplingParams, Shutdown, StepEvents
from pegainfer.engine.sampler import prompt_logprobs

PROMPT = [(7 * i + 3) % 1000 for i in range(50)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=4))
    yield e
    e.close()


def echo_run(engine, budget: int, prompt: list[int], n: int = 3) -> tuple[list, list[int], list]:
    """(prompt entries joined from every chunk's event, the chunk starts seen, the greedy neighbour's
    tokens) for one echo request beside a greedy neighbour, with a prefill budget of `budget`."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, max_prefill_tokens=budget)
    gpu.submit(Admit("g", [11, 12, 13], 8, True))
    gpu.submit(Admit("e", prompt, 3, True, SamplingParams(logprobs=n, prompt_logprobs=n)))
    gpu.start()
    entries, starts, neighbour, done = [], [], [], set()
    while done != {"g", "e"}:
        ev = events.get(timeout=60)
        if not isinstance(ev, StepEvents):
            continue
        assert not ev.failed
        for p in ev.prompt_logprobs:
            assert p.start == len(entries)  # chunks arrive in order, each where the last one ended
            starts.append(p.start)
            entries += p.entries
        neighbour += [t.token_id for t in ev.tokens if t.request_id == "g"]
        done |= {f.request_id for f in ev.finished}
    gpu.submit(Shutdown())
    gpu.join(10)
    return entries, starts, neighbour


@pytest.fixture(scope="module")
def one_pass(engine):
    return echo_run(engine, 8192, PROMPT)


@pytest.mark.parametrize("budget", [1, 2, 7, 16, 25, 49, 50, 64])
def test_chunked_prompt_logprobs_equal_the_one_pass_ones(engine, one_pass, budget):
    ref, ref_starts, ref_neighbour = one_pass
    got, starts, neighbour = echo_run(engine, budget, PROMPT)
    assert len(got) == len(ref) == len(PROMPT) and got[0] is None and ref_starts == [0]
    if budget < len(PROMPT):
        assert len(starts) > 1  # it really was fed in chunks
    for i in range(1, len(PROMPT)):
        (lp, top), (ref_lp, ref_top) = got[i], ref[i]
        assert abs(lp - ref_lp) < 1e-5, (i, lp, ref_lp)
        assert [t for t, _ in top] == [t for t, _ in ref_top]
        assert max(abs(a - b) for (_, a), (_, b) in zip(top, ref_top)) < 1e-5
    assert neighbour == ref_neighbour


def test_chunked_prompt_logprobs_are_hf_log_softmax(engine, tiny_model_dir):
    from tools.hf_oracle import load_hf
    hf = load_hf(tiny_model_dir, torch.float32, "cpu")
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([PROMPT])).logits[0].float(), dim=-1)  # [L, V]
    got, _, _ = echo_run(engine, 7, PROMPT, n=5)
    for i in range(1, len(PROMPT)):
        lp, top = got[i]
        assert abs(lp - ref[i - 1, PROMPT[i]].item()) < 1e-4
        assert [t for t, _ in top] == ref[i - 1].topk(5).indices.tolist()


@pytest.mark.parametrize("per_slice", [1, 3, 10, 64])
def test_prompt_logprobs_in_slices_equal_one_slice(per_slice):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(23, 300, generator=gen) * 4  # [positions, V]
    targets = torch.randint(0, 300, (23,), generator=gen).tolist()
    asked = []

    def logits_of(a: int, b: int) -> torch.Tensor:
        asked.append(b - a)
        return logits[a:b]

    got = prompt_logprobs(logits_of, targets, 4, 300, slice_bytes=per_slice * 300 * 4)
    assert max(asked) == min(per_slice, 23) and sum(asked) == 23
    lp = torch.log_softmax(logits, dim=-1)
    top_lp, top_ids = lp.topk(4, dim=-1)
    for j, (chosen, top) in enumerate(got):
        assert chosen == pytest.approx(lp[j, targets[j]].item(), abs=1e-6)
        assert [t for t, _ in top] == top_ids[j].tolist()
        assert [v for _, v in top] == pytest.approx(top_lp[j].tolist(), abs=1e-6)


# ---- the memory bound, each run in a fresh process (peak RSS is a high-water mark) ------------------
LONG_PROMPT = 4000
VOCAB = 102_400


def _peak_growth(model_dir: str, echo: bool, out: multiprocessing.Queue) -> None:
    """Child process: build the engine, then serve one 4,000-token request; report how far the
    process's peak RSS rose during the request (bytes)."""
    torch.set_num_threads(1)
    engine = build_engine(EngineSpec(model_dir=model_dir, num_slots=1, max_model_len=LONG_PROMPT + 8))
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    spec = SamplingParams(logprobs=5, prompt_logprobs=5) if echo else SamplingParams()
    gpu.submit(Admit("r", [(13 * i + 5) % VOCAB for i in range(LONG_PROMPT)], 2, True, spec))
    gpu.start()
    entries, finished = 0, False
    while not finished:
        ev = events.get(timeout=300)
        if isinstance(ev, EngineDied) or (isinstance(ev, StepEvents) and ev.failed):
            out.put((None, repr(ev)[:300]))
            return
        if not isinstance(ev, StepEvents):
            continue
        entries += sum(len(p.entries) for p in ev.prompt_logprobs)
        finished = bool(ev.finished)
    gpu.submit(Shutdown())
    gpu.join(10)
    out.put((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before, entries))


def peak_growth(model_dir: str, echo: bool) -> tuple[int, int]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_peak_growth, args=(model_dir, echo, out))
    child.start()
    try:
        return out.get(timeout=300)
    finally:
        child.join(30)


@pytest.mark.slow
def test_echo_logprobs_of_a_4000_token_prompt_stay_within_100_mb(tiny_variant_dir):
    model_dir = str(tiny_variant_dir({"vocab_size": VOCAB}))
    plain, no_entries = peak_growth(model_dir, echo=False)
    echo, entries = peak_growth(model_dir, echo=True)
    assert plain is not None and echo is not None, (no_entries, entries)
    assert (no_entries, entries) == (0, LONG_PROMPT)
    assert echo - plain < 100 * 2**20, f"peak RSS grew {echo / 2**20:.0f} MB with echo, {plain / 2**20:.0f} MB without"
