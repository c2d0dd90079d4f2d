"""The device sampler wired into the decode graph (engine/device_sampler.py, issue 33), through the real
runner and GPU thread on the tiny model, on the CPU: each "graph" replays its step function, and the
sampled rows are chosen from the graph's device state (per-slot history and bias, static per-row
parameters) by engine.sampler ("reference") or by the Triton kernel in the interpreter ("kernel").

- mixed batches (greedy, temperature / top-k / top-p / min-p, the three penalties, logit_bias,
  seeds, log-probs, n choices), overlapped and not: the same tokens and log-probs as today's path
  (engine.sampler on the logits), in float32 and bfloat16; the sampled decode steps run launched;
- the penalties follow a request's whole history across launched steps (its first token chosen on
  the host, the others recorded on the device), against a reference on HF's logits;
- the kernel in the runner: the same tokens as engine.sampler, log-probs within 1e-3 of HF's;
- a seed's tokens are the same alone and in crowds on this path;
- a draw whose values fail fails alone; the graph's capture records nothing into a history."""
from __future__ import annotations

import queue

import pytest
import torch

from pegainfer.engine.contract import Admit, SamplingParams, Shutdown, StepEvents
from pegainfer.engine.cuda_graphs import DecodeGraphs
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.kernels.config import KernelConfig, SampleTiling
from pegainfer.engine.batch import RowInput
from pegainfer.engine.loop import GpuThread
from pegainfer.engine.sampler import Draw
from pegainfer.engine.step_plan import StepPlan
from tests.engine.invariance_cases import PROBES, alone, crowd, serve

MIXED = [
    Admit("greedy", [5, 9, 200, 31], 12, True),
    Admit("top-p", [3, 4, 5], 10, True, SamplingParams(temperature=0.7, top_p=0.9, seed=11)),
    Admit("top-k-pen", [11, 12, 11, 40], 12, True,
          SamplingParams(temperature=0.7, top_k=50, presence_penalty=0.5, seed=12)),
    Admit("logprobs", [7, 8, 9], 9, True, SamplingParams(logprobs=5)),
    Admit("min-p-bias", [21, 22], 8, True,
          SamplingParams(temperature=1.1, min_p=0.05, logit_bias=((7, 3.0), (9, -100.0)), seed=13, logprobs=2)),
    Admit("greedy-pen", [30, 31, 30, 31], 14, True,
          SamplingParams(repetition_penalty=1.4, frequency_penalty=0.6, presence_penalty=0.3)),
    Admit("n2", [40, 41, 42], 7, True, SamplingParams(temperature=0.9, top_k=20, seed=14), n=2),
]


def _graphs(engine, sampler: str) -> DecodeGraphs:
    return DecodeGraphs(engine.model, engine.cache, engine.cache.num_slots, engine.cache.scratch_slot, sampler=sampler)


def serve_with(engine, sampler: str | None, admits, overlap: bool = True):
    """Every token event (request, choice) -> [(token, logprob, top)], and how many steps ran
    overlapped. sampler None: the eager runner."""
    engine.runner.graphs = None if sampler is None else _graphs(engine, sampler)
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, overlap=overlap)
    try:
        for a in admits:
            gpu.submit(a)
        gpu.start()
        got, finished = {}, set()
        while len(finished) < len(admits):
            ev = events.get(timeout=120)
            if not isinstance(ev, StepEvents):
                continue
            assert not ev.failed, ev.failed
            for t in ev.tokens:
                got.setdefault((t.request_id, t.index), []).append((t.token_id, t.logprob, t.top_logprobs))
            finished.update(f.request_id for f in ev.finished)
        gpu.submit(Shutdown())
        gpu.join(10)
        assert gpu.error is None and engine.cache.free_slots == engine.cache.num_slots
        kinds = set() if engine.runner.graphs is None else {k[2] for k in engine.runner.graphs.graphs}
        return got, gpu.overlapped_steps, kinds
    finally:
        engine.runner.graphs = None


def assert_same(got: dict, want: dict, atol: float = 0.0) -> None:
    """The same tokens; log-probs within atol; the top-N the same values and the same entries above
    the N-th (equal log-probs, frequent in bfloat16, come in either order and either may make the
    cut: the device takes the top 20 and cuts, engine.sampler the top N)."""
    assert got.keys() == want.keys()
    for key in want:
        assert [t for t, _, _ in got[key]] == [t for t, _, _ in want[key]], key
        for (_, lp, top), (_, lp_w, top_w) in zip(got[key], want[key]):
            assert (lp is None) == (lp_w is None) and len(top) == len(top_w), key
            if lp is None:
                continue
            assert abs(lp - lp_w) <= atol and all(abs(a - b) <= atol for (_, a), (_, b) in zip(top, top_w)), key
            last = top_w[-1][1] + atol if top_w else 0.0  # entries tied at the N-th may be either
            assert {i for i, v in top if v > last} == {i for i, v in top_w if v > last}, key


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engine(request, tiny_model_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), dtype=request.param, num_slots=12))
    yield e
    e.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_mixed_batches_choose_what_engine_sampler_chooses(engine, overlap):
    off, _, off_kinds = serve_with(engine, "off", MIXED, overlap)  # the graph returns logits to engine.sampler
    got, overlapped, kinds = serve_with(engine, "reference", MIXED, overlap)
    assert off_kinds == {"logits"} and kinds == {"sample", "sample_lp"}
    assert_same(got, off)  # the same logits, the same choices: bit for bit
    if engine.spec.torch_dtype() == torch.float32:
        # the eager runner (a different attention path: its bf16 logits differ in the last bits, and
        # so may a draw near a tie; in float32 the log-probs agree within 1e-5)
        want, _, _ = serve_with(engine, None, MIXED, overlap)
        assert_same(got, want, atol=1e-5)
    # greedy rows inside the sampled steps kept their exact greedy tokens
    greedy_alone, _, _ = serve_with(engine, "reference", MIXED[:1], overlap)
    assert [t for t, _, _ in greedy_alone[("greedy", 0)]] == [t for t, _, _ in got[("greedy", 0)]]
    # sampled decode steps ran launched (fed on the device) when overlap is on, never when it is off
    assert (overlapped > 0) == overlap


def _penalised(logits: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams) -> torch.Tensor:
    """vLLM's penalties on one position's float32 logits, written out plainly."""
    x = logits.clone()
    for t in set(prompt) | set(output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return x


def test_penalties_follow_the_whole_history_across_launched_steps(tiny_model_dir):
    """Greedy with all three penalties, 24 tokens, launched steps: each token is the argmax of HF's
    logits penalised by the prompt and every token before it (recorded on the device, step by step)."""
    from tools.hf_oracle import load_hf
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), dtype="float32", num_slots=4))
    try:
        spec = SamplingParams(repetition_penalty=1.8, frequency_penalty=0.9, presence_penalty=0.7)
        prompt = [17, 17, 30, 31, 5]
        got, overlapped, _ = serve_with(e, "reference", [Admit("p", prompt, 24, True, spec),
                                                          Admit("g", [1, 2], 24, True)])
    finally:
        e.close()
    assert overlapped > 0
    tokens = [t for t, _, _ in got[("p", 0)]]
    hf = load_hf(tiny_model_dir, torch.float32, "cpu")
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + tokens])).logits[0].float()  # [L, V]
    want = [int(_penalised(logits[len(prompt) - 1 + j], prompt, tokens[:j], spec).argmax()) for j in range(len(tokens))]
    assert tokens == want
    assert len(set(tokens)) > len(tokens) // 2  # the penalties bite: no short loop


def test_the_kernel_in_the_runner_chooses_what_engine_sampler_chooses(tiny_model_dir, triton_interpreter):
    """The Triton sampler inside the decode step (interpreted: few rows, few steps), float32: the
    tokens of engine.sampler's path, the log-probs within 1e-5 of it and within 1e-3 of HF's. The
    engine's KernelConfig.sample reaches the launch: each row split over 4 programs of 256 columns."""
    from tools.hf_oracle import load_hf
    admits = [MIXED[0], MIXED[2], Admit("lp", [7, 8, 9], 5, True, SamplingParams(temperature=0.8, top_p=0.9,
                                                                                     seed=3, logprobs=5))]
    admits = [Admit(a.request_id, a.prompt_ids, 5, True, a.sampling) for a in admits]
    tiling = SampleTiling(chunks=4, block_v=256)
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), dtype="float32", num_slots=4,
                                kernels=KernelConfig(sample=tiling)))
    try:
        assert _graphs(e, "kernel").sampler.tiling == tiling
        want, _, _ = serve_with(e, None, admits)
        got, _, kinds = serve_with(e, "kernel", admits)
    finally:
        e.close()
    assert {"sample", "sample_lp"} & kinds
    assert_same(got, want, atol=1e-5)
    hf = load_hf(tiny_model_dir, torch.float32, "cpu")
    tokens = [t for t, _, _ in got[("lp", 0)]]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([[7, 8, 9] + tokens])).logits[0].float(), dim=-1)
    for j, (tok, lp, top) in enumerate(got[("lp", 0)]):
        assert abs(lp - ref[2 + j, tok].item()) < 1e-3
        ref_lp, ref_ids = ref[2 + j].topk(5)
        assert [i for i, _ in top] == ref_ids.tolist()
        assert torch.allclose(torch.tensor([v for _, v in top]), ref_lp, atol=1e-3)


@pytest.mark.parametrize(("size", "overlap"), [(7, True), (33, False)])
def test_a_seed_is_the_same_alone_and_in_a_crowd(engine, size, overlap):
    """The probes' tokens alone and in crowds, bit for bit; their log-probs within 1e-5: on the CPU
    the graph's decode forward (torch's absorbed MLA, not the GPU's batch-invariant Triton kernels)
    moves a logit's last bits with the batch bucket, with the device sampler off as well. On the
    GPU tests/engine/test_gpu_batch_invariance.py checks the log-probs bitwise through this path."""
    engine.runner.graphs = _graphs(engine, "reference")
    try:
        base = alone(engine)
        others = crowd(size, seed=size, vocab=engine.cfg.vocab_size)
        got = serve(engine, [PROBES[0], *others[:size // 2], PROBES[1], *others[size // 2:]], overlap=overlap)
    finally:
        engine.runner.graphs = None
    for p in PROBES:
        rid = p.request_id
        assert got.tokens[rid] == base.tokens[rid], f"{rid} tokens differ in a crowd of {size}"
        assert got.prompt.get(rid) == base.prompt.get(rid)  # prompt rows run eagerly: bitwise
        for (lp, top), (lp_b, top_b) in zip(got.logprobs[rid], base.logprobs[rid]):
            assert abs(lp - lp_b) < 1e-5 and [i for i, _ in top] == [i for i, _ in top_b]


def test_a_draw_whose_values_fail_fails_alone(engine):
    """A draw without checked parameters whose values are outside the sampler's domain: its row runs
    greedy and unrecorded, its token is dropped, the others get what they get without it."""
    runner = engine.runner
    runner.graphs = _graphs(engine, "reference")
    rows = [RowInput(s, [40 + s], 5) for s in range(3)]
    good = [Draw(i, SamplingParams(temperature=0.8, seed=i, presence_penalty=0.4), i, 0, 3, [1, 2], [7, 8, 9])
            for i in range(3)]
    bad = Draw(1, SamplingParams(temperature=float("nan")), 0, 0, 3)
    try:
        clean = runner.run(StepPlan(rows, draws=good))
        hist = runner.graphs.sampler.history.clone()
        mixed = runner.run(StepPlan(rows, draws=[good[0], bad, good[2]]))
        after = runner.graphs.sampler.history
    finally:
        runner.graphs = None
    assert list(mixed.failed) == [1] and "temperature" in mixed.failed[1]
    assert mixed.tokens[1] == -1 and [mixed.tokens[0], mixed.tokens[2]] == [clean.tokens[0], clean.tokens[2]]
    # the failed row recorded nothing: slot 1's history is still the clean run's
    assert torch.equal(after[1], hist[1]) and int(after[0].sum()) == int(hist[0].sum())
