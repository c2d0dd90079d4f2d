"""The arrangements the batch-invariance tests put a probe request in, shared by the CPU test
(test_batch_invariance.py) and its GPU variant (test_gpu_batch_invariance.py): two probes (greedy
with log-probs and prompt log-probs, seeded sampling with log-probs), crowds of mixed prompt lengths,
lengths to generate and sampling settings, and a GPU-thread run that collects every token event."""
from __future__ import annotations

import dataclasses
import queue
import random

from pegainfer.engine.contract import Admit, SamplingParams, Shutdown, StepEvents
from pegainfer.engine.loop import GpuThread

PROBE_PROMPT = [11, 250, 7, 93, 41, 5, 5, 180, 66, 2, 19, 240, 133, 8, 71, 12, 99, 3, 150, 201, 44, 17, 60]
GREEDY = SamplingParams(logprobs=3, prompt_logprobs=2)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=4321, logprobs=3)
PROBES = (Admit("probe-greedy", PROBE_PROMPT, 14, True, GREEDY),
          Admit("probe-seeded", PROBE_PROMPT[:17], 14, True, SEEDED))


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
          later: list[Admit] = (), after_steps: int = 3, mixed_step_tokens: int = 2048) -> Seen:
    """Admit everything at once (`later` after `after_steps` steps), collect until all finished."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, max_prefill_tokens=max_prefill_tokens, overlap=overlap,
                    mixed_step_tokens=mixed_step_tokens)
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
            seen.prompt.setdefault(p.request_id, []).extend(p.entries)  # one event per prompt chunk
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




def alone(engine) -> Seen:
    """Each probe alone in the engine: the reference every other arrangement must equal bitwise."""
    runs = [serve(engine, [p]) for p in PROBES]
    return Seen(*({k: v for r in runs for k, v in getattr(r, f.name).items()} for f in dataclasses.fields(Seen)))
