"""One request's bad values fail that request alone, on the real GPU thread and tiny model: a spec that
bypassed the HTTP checks (top_k = 2^63, a NaN temperature, an out-of-vocabulary logit bias, ...) is
refused at admission; a fault that still happens in a step's per-request work (its sampling set-up,
its prompt log-probs) fails the request it belongs to, while the sampled neighbour in the same steps
keeps streaming the very tokens it has alone, and the engine lives on. Device faults are not
swallowed."""
from __future__ import annotations

import dataclasses
import queue

import pytest
import torch

from pegainfer.engine.batch import RowInput
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.loop import GpuThread
from pegainfer.engine.contract import Admit, EngineDied, SamplingParams, Shutdown, StepEvents
from pegainfer.engine.request_guard import device_fault
from pegainfer.engine.sampler import Draw
from pegainfer.engine.step_plan import StepPlan
from pegainfer.ep.backend import RankFailure

PROMPT = [5, 9, 200, 31, 77, 12]
NEIGHBOUR = Admit("n", [7, 8, 9, 10], 24, True, SamplingParams(temperature=0.9, top_k=50, seed=42, logprobs=2))


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=8))
    yield e
    e.close()


@dataclasses.dataclass
class Outcome:
    tokens: dict[str, list[int]]
    finished: dict[str, str]
    failed: dict[str, str]
    died: list[str]


def serve(engine, admits: list[Admit], poison=None) -> Outcome:
    """Run the admits on a GpuThread until each finished or failed. poison(gpu): called after the
    commands are applied and before the thread starts (to corrupt a sequence past admission)."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, max_prefill_tokens=4)  # prompts in chunks: more mixed steps
    for a in admits:
        gpu.submit(a)
    if poison is not None:
        assert gpu._apply(gpu._drain(block=False))
        poison(gpu)
    gpu.start()
    out = Outcome({}, {}, {}, [])
    while len(out.finished) + len(out.failed) < len(admits) and not out.died:
        ev = events.get(timeout=60)
        if isinstance(ev, EngineDied):
            out.died.append(ev.message)
        if not isinstance(ev, StepEvents):
            continue
        for t in ev.tokens:
            out.tokens.setdefault(t.request_id, []).append(t.token_id)
        out.finished.update({f.request_id: f.reason for f in ev.finished})
        out.failed.update({f.request_id: f.message for f in ev.failed})
    gpu.submit(Shutdown())
    gpu.join(10)
    assert gpu.error is None and not gpu.is_alive()
    assert engine.cache.free_slots == engine.cache.num_slots  # every slot came back
    return out


@pytest.fixture(scope="module")
def alone(engine) -> list[int]:
    out = serve(engine, [NEIGHBOUR])
    assert len(out.tokens["n"]) == NEIGHBOUR.max_tokens
    return out.tokens["n"]


BAD_SPECS = {
    "top_k_2^63_hot": SamplingParams(temperature=0.5, top_k=2**63),
    "top_k_2^63_greedy": SamplingParams(temperature=0.0, top_k=2**63, logprobs=1),
    "top_k_over_vocab": SamplingParams(temperature=0.5, top_k=1025),
    "temperature_nan": SamplingParams(temperature=float("nan")),
    "temperature_inf": SamplingParams(temperature=float("inf")),
    "repetition_inf": SamplingParams(repetition_penalty=float("inf")),
    "repetition_zero": SamplingParams(temperature=1.0, repetition_penalty=0.0),
    "repetition_negative": SamplingParams(repetition_penalty=-1.0),
    "presence_beyond_float32": SamplingParams(presence_penalty=1e300),
    "top_p_zero": SamplingParams(temperature=1.0, top_p=0.0),
    "seed_float": SamplingParams(temperature=1.0, seed=1.5),  # type: ignore[arg-type]
    "logprobs_over_vocab": SamplingParams(logprobs=10**6),
    "prompt_logprobs_over_vocab": SamplingParams(prompt_logprobs=2**63),
    "logit_bias_outside_vocab": SamplingParams(logit_bias=((1024, 1.0),)),
    "logit_bias_nan": SamplingParams(logit_bias=((3, float("nan")),)),
    "logit_bias_not_pairs": SamplingParams(logit_bias=(3,)),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("name", BAD_SPECS)
def test_a_poisoned_spec_fails_alone_at_admission(engine, alone, name):
    out = serve(engine, [NEIGHBOUR, Admit("bad", PROMPT, 4, True, BAD_SPECS[name])])
    assert not out.died
    assert set(out.failed) == {"bad"} and "bad" not in out.tokens
    assert out.finished == {"n": "length"} and out.tokens["n"] == alone


EXTREME_BUT_VALID = {  # what the API accepts at its edges: each completes, with tokens in the vocabulary
    "repetition_tiny": SamplingParams(temperature=1.0, repetition_penalty=1e-300, seed=1),
    "repetition_tiny_frequency_edges": SamplingParams(temperature=2.0, repetition_penalty=1e-40, frequency_penalty=-2,
                                                    presence_penalty=2, seed=2**63 - 1),
    "top_p_tiny": SamplingParams(temperature=1.0, top_p=1e-300, seed=-2**63),
    "temperature_tiny_is_greedy": SamplingParams(temperature=1e-9, top_k=1024, min_p=1.0, logprobs=5),
    "bias_edges": SamplingParams(temperature=0.5, logit_bias=((3, 100.0), (4, -100.0), (1023, 100.0)), seed=5),
    "echo_logprobs_at_the_top": SamplingParams(temperature=2.0, top_k=1024, logprobs=5, prompt_logprobs=5, seed=9),
}


@pytest.mark.parametrize("name", EXTREME_BUT_VALID)
def test_extreme_but_valid_specs_complete_beside_the_neighbour(engine, alone, name):
    out = serve(engine, [NEIGHBOUR, Admit("x", PROMPT, 5, True, EXTREME_BUT_VALID[name], n=2)])
    assert not out.died and not out.failed
    assert out.finished == {"n": "length", "x": "length"} and out.tokens["n"] == alone
    assert len(out.tokens["x"]) == 10 and all(0 <= t < 1024 for t in out.tokens["x"])
    if name == "bias_edges":  # +100 on two tokens: nothing else is ever drawn
        assert set(out.tokens["x"]) <= {3, 1023}


def test_bad_limits_fail_alone_at_admission(engine, alone):
    bad = [Admit("ids", [5, 2**63], 4), Admit("neg", [-1, 5], 4), Admit("len", PROMPT, 2**63),
           Admit("n", PROMPT, 4, n=2**63), Admit("n0", PROMPT, 4, n=0)]
    out = serve(engine, [NEIGHBOUR] + [dataclasses.replace(a, request_id=f"bad-{a.request_id}") for a in bad])
    assert not out.died and len(out.failed) == len(bad) and out.tokens["n"] == alone


def test_a_fault_in_a_steps_sampling_set_up_fails_only_its_request(engine, alone):
    """A sequence whose checked parameters are corrupted after admission: building the step's
    sampling batch raises on its row (int64 overflow, as SamplingBatch.build did for top_k = 2^63).
    The guard finds the row: that request fails, the neighbour's tokens are those it has alone."""
    def poison(gpu):
        bad = next(s for s in gpu.waiting if s.request_id == "bad")
        for s in (bad, *bad.forks):
            s.params = dataclasses.replace(s.params, top_k=2**63)

    spec = SamplingParams(temperature=0.7, seed=3)
    out = serve(engine, [NEIGHBOUR, Admit("bad", PROMPT, 6, True, spec, n=2), Admit("ok", PROMPT, 6, True, spec)],
                poison)
    assert not out.died
    assert set(out.failed) == {"bad"} and "Overflow" in out.failed["bad"]
    assert out.tokens["n"] == alone and out.finished == {"n": "length", "ok": "length"}
    assert out.tokens["ok"] == serve(engine, [Admit("ok", PROMPT, 6, True, spec)]).tokens["ok"]


def test_a_fault_in_a_prompt_chunks_log_probs_fails_only_its_request(engine, alone):
    """An echo request whose prompt log-prob width became impossible after admission (topk wider
    than the vocabulary raises in its chunk's work): it fails, the neighbour streams on."""
    def poison(gpu):
        bad = next(s for s in gpu.waiting if s.request_id == "bad")
        bad.sampling = dataclasses.replace(bad.sampling, prompt_logprobs=10**6)

    out = serve(engine, [NEIGHBOUR, Admit("bad", list(range(20, 40)), 4, True, SamplingParams(prompt_logprobs=2))],
                poison)
    assert not out.died and set(out.failed) == {"bad"}
    assert out.tokens["n"] == alone


@pytest.mark.parametrize("bad_draw", [0, 1, 2])
def test_the_runner_leaves_out_a_failing_draw_and_keeps_the_others_tokens(engine, bad_draw):
    runner, cache = engine.runner, engine.cache
    slots = [cache.allocate() for _ in range(3)]
    try:
        rows = [RowInput(s, [3 + i, 4, 5], 0) for i, s in enumerate(slots)]
        hot = SamplingParams(temperature=1.0, seed=11)
        draws = [Draw(r, hot, 11, 0, 0) for r in range(3)]
        ref = runner.run(StepPlan(rows, draws=draws))
        for s in slots:
            cache.release(s)
        slots = [cache.allocate() for _ in range(3)]
        rows = [RowInput(s, r.token_ids, 0) for s, r in zip(slots, rows)]
        mixed = list(draws)
        mixed[bad_draw] = dataclasses.replace(draws[bad_draw], spec=dataclasses.replace(hot, top_k=2**63))
        got = runner.run(StepPlan(rows, draws=mixed))
    finally:
        for s in slots:
            cache.release(s)
    assert set(got.failed) == {bad_draw}
    assert [t for i, t in enumerate(got.tokens) if i != bad_draw] == [t for i, t in enumerate(ref.tokens)
                                                                       if i != bad_draw]


def test_device_and_rank_faults_are_never_one_requests():
    assert device_fault(RankFailure("expert rank 1 exited"))
    assert device_fault(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert device_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not device_fault(ValueError("Overflow when unpacking long long"))
    assert not device_fault(RuntimeError("selected index k out of range"))
