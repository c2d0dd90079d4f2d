"""Batch invariance through the GPU thread on the tiny model (CPU, float32 and bfloat16): a probe
request's token ids and log-probs (generated and prompt) are bitwise the same alone and inside
crowds of 2, 7, 33 and 64 other requests of mixed lengths and sampling settings, with its prompt
packed beside others or cut into chunks (--max-prefill-tokens), greedy and seeded, with async
scheduling on and off. And the opt-out is honest: --no-batch-invariant still serves correctly."""
from __future__ import annotations

import dataclasses
import queue
import random

import pytest

from pegainfer.engine.contract import Admit, SamplingParams, Shutdown, StepEvents
from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.loop import GpuThread

PROBE_PROMPT = [11, 250, 7, 93, 41, 5, 5, 180, 66, 2, 19, 240, 133, 8, 71, 12, 99, 3, 150, 201, 44, 17, 60]
GREEDY = SamplingParams(logprobs=3, prompt_logprobs=2)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=4321, logprobs=3)
PROBES = (Admit("probe-greedy", PROBE_PROMPT, 14, True, GREEDY),
          Admit("probe-seeded", PROBE_PROMPT[:17], 14, True, SEEDED))


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engine(request, tiny_model_dir):
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), dtype=request.param, num_slots=72,
                                max_model_len=256))
    assert e.batch_invariant
    yield e
    e.close()


def crowd(n: int, seed: int, vocab: int) -> list[Admit]:
    """n requests of mixed prompt lengths, lengths to generate and sampling settings."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(vocab) for _ in range(rng.choice([1, 2, 5, 9, 30, 64, 120]))]
        sampling = rng.choice([SamplingParams(), SamplingParams(temperature=1.1, seed=rng.randrange(1 << 30)),
                               SamplingParams(temperature=0.7, top_k=20, seed=i, logprobs=1),
                               SamplingParams(repetition_penalty=1.2)])
        out.append(Admit(f"c{i}", prompt, rng.randrange(1, 24), True, sampling))
    return out


@dataclasses.dataclass
class Seen:
    tokens: dict[str, list[int]]
    logprobs: dict[str, list]
    prompt: dict[str, list]


def serve(engine, admits: list[Admit], *, overlap: bool = True, max_prefill_tokens: int = 8192,
          later: list[Admit] = (), after_steps: int = 3) -> Seen:
    """Admit everything at once (`later` after `after_steps` steps), collect until all finished."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, max_prefill_tokens=max_prefill_tokens, overlap=overlap)
    for a in admits:
        gpu.submit(a)
    gpu.start()
    seen, finished, steps = Seen({}, {}, {}), set(), 0
    while len(finished) < len(admits) + len(later):
        ev = events.get(timeout=120)
        if not isinstance(ev, StepEvents):
            continue
        if ev.record is not None:
            steps += 1
            if steps == after_steps:
                for a in later:
                    gpu.submit(a)
        assert not ev.failed, ev.failed
        for p in ev.prompt_logprobs:
            seen.prompt[p.request_id] = p.entries
        for t in ev.tokens:
            seen.tokens.setdefault(t.request_id, []).append(t.token_id)
            seen.logprobs.setdefault(t.request_id, []).append((t.logprob, t.top_logprobs))
        finished.update(f.request_id for f in ev.finished)
    gpu.submit(Shutdown())
    gpu.join(10)
    assert engine.cache.free_slots == engine.cache.num_slots
    return seen


def assert_probes_equal(got: Seen, alone: Seen, where: str) -> None:
    for p in PROBES:
        rid = p.request_id
        assert got.tokens[rid] == alone.tokens[rid], f"{rid} tokens differ {where}"
        assert got.logprobs[rid] == alone.logprobs[rid], f"{rid} log-probs differ {where}"
        assert got.prompt.get(rid) == alone.prompt.get(rid), f"{rid} prompt log-probs differ {where}"


@pytest.fixture(scope="module")
def alone(engine) -> Seen:
    """Each probe alone in the engine: the reference every other arrangement must equal bitwise."""
    runs = [serve(engine, [p]) for p in PROBES]
    return Seen(*({k: v for r in runs for k, v in getattr(r, f.name).items()} for f in dataclasses.fields(Seen)))


@pytest.mark.parametrize(("size", "overlap", "max_prefill"), [
    (2, True, 8192), (7, False, 8192), (33, True, 40), (64, False, 8192), (64, True, 13),
])
def test_a_request_is_the_same_alone_and_in_a_crowd(engine, alone, size, overlap, max_prefill):
    others = crowd(size, seed=size, vocab=engine.cfg.vocab_size)
    # probes first, in the middle and last: different rows, packed beside different prompts
    admits = [PROBES[0], *others[:size // 2], PROBES[1], *others[size // 2:]]
    got = serve(engine, admits, overlap=overlap, max_prefill_tokens=max_prefill)
    assert_probes_equal(got, alone, f"in a crowd of {size} (overlap {overlap}, max_prefill_tokens {max_prefill})")


@pytest.mark.parametrize("max_prefill", [1, 3, 17])
def test_a_prompt_cut_into_chunks_gives_the_same_request(engine, alone, max_prefill):
    got = serve(engine, list(PROBES), max_prefill_tokens=max_prefill)
    assert_probes_equal(got, alone, f"chunked by max_prefill_tokens {max_prefill}")


def test_a_request_arriving_while_others_decode_is_the_same(engine, alone):
    """The probes join a running batch: their prompts prefill in a mixed step beside decode rows."""
    got = serve(engine, crowd(9, seed=3, vocab=engine.cfg.vocab_size), later=list(PROBES), after_steps=3)
    assert_probes_equal(got, alone, "joining rows that decode")


def test_the_opt_out_still_serves_the_same_greedy_tokens_alone(tiny_model_dir):
    """--no-batch-invariant: the library's kernels by row count; alone, float32 on the CPU, the
    greedy tokens match the invariant engine's (the arithmetic differs only in summation order)."""
    fast = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=4, max_model_len=256,
                                   kernels=KernelConfig(batch_invariant=False)))
    inv = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=4, max_model_len=256))
    try:
        assert not fast.batch_invariant and inv.batch_invariant
        probe = Admit("g", PROBE_PROMPT, 10, True)
        assert serve(fast, [probe]).tokens["g"] == serve(inv, [probe]).tokens["g"]
    finally:
        fast.close()
        inv.close()
