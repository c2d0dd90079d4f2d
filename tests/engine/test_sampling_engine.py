"""Sampling through the GPU thread on the tiny model: a seed reproduces its tokens whatever shares
the batch, n choices share one prefill and fork its KV cache, stop token ids end a choice, and the
log-probs (generated and prompt) are the log-softmax of HF transformers' logits."""
from __future__ import annotations

import dataclasses
import queue

import pytest
import torch

from pegainfer.engine.cuda_graphs import DecodeGraphs
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.generate import generate
from pegainfer.engine.loop import GpuThread
from pegainfer.engine.contract import Admit, SamplingParams, Shutdown, StepEvents, StepRecord

PROMPT = [5, 9, 200, 31, 77, 12]
HOT = SamplingParams(temperature=1.0, seed=1234)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=8))
    yield e
    e.close()


@dataclasses.dataclass
class Run:
    tokens: dict[tuple[str, int], list[int]]
    logprobs: dict[tuple[str, int], list]
    finished: dict[str, str]
    choice_reasons: dict[tuple[str, int], str]
    records: list[StepRecord]
    prompt: dict[str, list]


def run(engine, admits: list[Admit], later: tuple[Admit, ...] = ()) -> Run:
    """Admit everything at once (`later` once the first step is done), collect every event until
    each request finished."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put)
    for a in admits:
        gpu.submit(a)
    gpu.start()
    out = Run({}, {}, {}, {}, [], {})
    while len(out.finished) < len(admits) + len(later):
        ev = events.get(timeout=60)
        if not isinstance(ev, StepEvents):
            continue
        if ev.record is not None and not out.records:
            for a in later:
                gpu.submit(a)
        assert not ev.failed, ev.failed
        for p in ev.prompt_logprobs:
            out.prompt[p.request_id] = p.entries
        for t in ev.tokens:
            key = (t.request_id, t.index)
            out.tokens.setdefault(key, []).append(t.token_id)
            out.logprobs.setdefault(key, []).append((t.logprob, t.top_logprobs))
            if t.finish_reason:
                out.choice_reasons[key] = t.finish_reason
        out.finished.update({f.request_id: f.reason for f in ev.finished})
        if ev.record:
            out.records.append(ev.record)
    gpu.submit(Shutdown())
    gpu.join(10)
    assert engine.cache.free_slots == engine.cache.num_slots
    return out


def test_a_seed_reproduces_its_tokens_whatever_shares_the_batch(engine):
    alone = run(engine, [Admit("a", PROMPT, 12, True, HOT)]).tokens[("a", 0)]
    mixed = run(engine, [
        Admit("g", [7, 8, 9], 20, True),  # greedy, decoding while "a" prefills
        Admit("b", [3, 4], 15, True, SamplingParams(temperature=0.8, top_k=40, seed=99)),
        Admit("a", PROMPT, 12, True, HOT),
        Admit("p", list(range(40, 90)), 9, True, SamplingParams(temperature=1.2, repetition_penalty=1.3, logprobs=2)),
    ])
    assert mixed.tokens[("a", 0)] == alone
    assert mixed.tokens[("g", 0)] == generate(engine, [[7, 8, 9]], 20, ignore_eos=True)[0].token_ids
    assert any(r.sampled and r.decode_rows >= 2 for r in mixed.records)
    other_seed = run(engine, [Admit("a", PROMPT, 12, True, dataclasses.replace(HOT, seed=1235))]).tokens[("a", 0)]
    assert other_seed != alone


def test_n_choices_share_one_prefill_and_fork_the_cache(engine):
    first = run(engine, [Admit("r", PROMPT, 10, True, HOT, n=4)])
    choices = [first.tokens[("r", i)] for i in range(4)]
    assert all(len(c) == 10 for c in choices) and len({tuple(c) for c in choices}) == 4
    prefills = [r for r in first.records if r.prefill_tokens]
    assert len(prefills) == 1 and prefills[0].prefill_tokens == len(PROMPT) and prefills[0].rows == 1
    assert prefills[0].draws == 4
    assert first.finished == {"r": "length"}
    again = run(engine, [Admit("r", PROMPT, 10, True, HOT, n=4)])
    assert [again.tokens[("r", i)] for i in range(4)] == choices
    # choice 0 of n is the n=1 request with the same seed
    assert run(engine, [Admit("s", PROMPT, 10, True, HOT)]).tokens[("s", 0)] == choices[0]


def test_forked_siblings_decode_from_a_true_copy_of_the_prefill(engine):
    """Greedy n=3 on the sampling path (log-probs asked): every sibling must equal plain greedy."""
    greedy = generate(engine, [PROMPT], 12, ignore_eos=True)[0].token_ids
    out = run(engine, [Admit("r", PROMPT, 12, True, SamplingParams(logprobs=1), n=3)])
    assert [out.tokens[("r", i)] for i in range(3)] == [greedy] * 3


def test_stop_token_ids_end_each_choice(engine):
    free = run(engine, [Admit("r", PROMPT, 16, True, HOT, n=2)])
    stop = free.tokens[("r", 1)][3]
    out = run(engine, [Admit("r", PROMPT, 16, True, HOT, n=2, stop_token_ids=(stop,))])
    assert out.tokens[("r", 1)] == free.tokens[("r", 1)][:4]
    assert out.choice_reasons[("r", 1)] == "stop"
    cut = free.tokens[("r", 0)].index(stop) + 1 if stop in free.tokens[("r", 0)] else 16
    assert out.tokens[("r", 0)] == free.tokens[("r", 0)][:cut]
    assert out.finished["r"] == ("stop" if cut < 16 else "length")


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    from tools.hf_oracle import load_hf
    return load_hf(tiny_model_dir, torch.float32, "cpu")


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """[L, V] log-softmax of HF's logits at every position of ids."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_logprobs_are_the_log_softmax_of_hf_logits(engine, hf):
    out = run(engine, [Admit("r", PROMPT, 8, True, SamplingParams(logprobs=5, prompt_logprobs=5))])
    tokens = out.tokens[("r", 0)]
    ref = hf_logprobs(hf, PROMPT + tokens)  # [L, V]
    for j, (lp, top) in enumerate(out.logprobs[("r", 0)]):
        pos = len(PROMPT) - 1 + j
        ref_lp, ref_ids = ref[pos].topk(5)
        assert [t for t, _ in top] == ref_ids.tolist()
        assert torch.allclose(torch.tensor([v for _, v in top]), ref_lp, atol=1e-4)
        assert abs(lp - ref[pos, tokens[j]].item()) < 1e-4
    entries = out.prompt["r"]
    assert len(entries) == len(PROMPT) and entries[0] is None
    for i in range(1, len(PROMPT)):
        lp, top = entries[i]
        assert abs(lp - ref[i - 1, PROMPT[i]].item()) < 1e-4
        ref_lp, ref_ids = ref[i - 1].topk(5)
        assert [t for t, _ in top] == ref_ids.tolist()
        assert torch.allclose(torch.tensor([v for _, v in top]), ref_lp, atol=1e-4)


def test_sampled_logprobs_are_the_raw_ones_of_the_token_drawn(engine, hf):
    spec = SamplingParams(temperature=1.5, top_k=50, presence_penalty=0.5, seed=5, logprobs=2)
    out = run(engine, [Admit("r", PROMPT, 6, True, spec)])
    tokens = out.tokens[("r", 0)]
    ref = hf_logprobs(hf, PROMPT + tokens)
    for j, (lp, _) in enumerate(out.logprobs[("r", 0)]):
        assert abs(lp - ref[len(PROMPT) - 1 + j, tokens[j]].item()) < 1e-4


def test_greedy_steps_keep_the_argmax_fast_path(engine):
    """Plain greedy requests (n=2 included: its choices are the same argmax) never take the sampling path."""
    out = run(engine, [Admit("g", PROMPT, 5, True), Admit("h", [3, 4], 5, True, n=2)])
    assert out.records and not any(r.sampled for r in out.records)
    assert out.tokens[("h", 0)] == out.tokens[("h", 1)] == generate(engine, [[3, 4]], 5, ignore_eos=True)[0].token_ids


class EagerPrefillGraphs:
    def __init__(self, engine):
        self.model, self.cache, self.calls = engine.model, engine.cache, []

    def fits(self, rows):
        return all(r.start_pos == 0 for r in rows)

    def run(self, rows, logits=False):
        from pegainfer.engine.model.inputs import PrefillInputs
        from pegainfer.engine.model.prefill import prefill_logits, prefill_step
        self.calls.append(logits)
        ids, pos, slots, row_ids, last = [], [], [], [], []
        for i, r in enumerate(rows):
            ids += r.token_ids
            pos += range(len(r.token_ids))
            slots += [r.slot] * len(r.token_ids)
            row_ids += [i] * len(r.token_ids)
            last.append(len(ids) - 1)
        inp = PrefillInputs(*(torch.tensor(x) for x in (ids, pos, slots, row_ids, last)))
        if logits:
            return prefill_logits(self.model, inp, self.cache)
        return prefill_step(self.model, inp, self.cache).tolist()


@pytest.mark.parametrize("with_echo", [False, True])
def test_the_graph_paths_choose_the_same_tokens_as_the_eager_path(engine, with_echo):
    """The runner's CUDA routing (graph decode rows, graph or eager prompt rows, logits or argmax out)
    run on CPU with the graphs' own step functions: the same tokens as the eager runner."""
    admits = [Admit("g", PROMPT, 14, True),
              Admit("s", [3, 4, 5], 4, True, SamplingParams(temperature=0.9, seed=8), n=2),
              Admit("p", [11, 12], 6, True, SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5))]
    if with_echo:  # prompt log-probs: that step runs eagerly with every prompt position's logits
        admits.append(Admit("e", [7, 8, 9, 10], 3, True, SamplingParams(logprobs=2, prompt_logprobs=2)))
    later = (Admit("q", [20, 21, 22], 5, True, SamplingParams(temperature=1.0, seed=4)),)  # prefills beside decodes
    ref = run(engine, admits, later)
    runner = engine.runner
    # the real DecodeGraphs: off CUDA each "graph" replays its step function eagerly
    runner.graphs = DecodeGraphs(engine.model, engine.cache, engine.cache.num_slots, engine.cache.scratch_slot)
    runner.prefill_graphs = EagerPrefillGraphs(engine)
    try:
        got = run(engine, admits, later)
        decode_calls, prefill_calls = {key[2] for key in runner.graphs.graphs}, runner.prefill_graphs.calls
    finally:
        runner.graphs = runner.prefill_graphs = None
    assert got.tokens == ref.tokens
    # both the device sampler (log-probs too, with the echo request) and the fast path (tokens) ran
    assert decode_calls == {"sample", "tokens"} | ({"sample_lp"} if with_echo else set())
    assert any(r.phase == "mixed" and r.sampled for r in got.records)
    if with_echo:
        assert prefill_calls == [True] and got.prompt["e"][1][0] == pytest.approx(ref.prompt["e"][1][0], abs=1e-5)
    else:
        assert prefill_calls == [True, True]  # both prefills sample: the logits graph
