"""Start-up warm-up (issue 28, no cold start): everything the server would otherwise compile or
capture on a request's time, done before it reports ready. Two parts:

- every graph a step can ask for is captured: each decode graph (batch bucket x attention-length
  bucket x greedy/logits: DecodeGraphs.keys) and each prefill graph (fresh packs per token bucket and
  the bank graphs of later prompt chunks per (token, bank) bucket pair: PrefillGraphs.keys). A
  capture runs its step once first, which compiles the Triton kernels of that shape; all of it runs
  on the scratch KV slot;
- a few requests run through a batcher and the runner as the GPU thread would run them, for what no
  graph holds: the sampler (temperature, top-p/k, min-p, penalties, logit bias, every top-N of
  log-probs, n choices and their fork), the eager steps of prompt log-probs at a few token counts (Triton
  specialises on a size being 1 or a multiple of 16), and a prompt longer than the prefill budget
  (chunks over the cache). They take slots like any request and give them back; nothing else is
  running yet, and the route counters do not count them.

Without the Triton kernels (the CPU) nothing compiles: one short greedy request runs, as before.
Triton keeps what it compiled in its cache (--compile-cache-dir), so a restart skips compiling;
capturing is redone every start."""
from __future__ import annotations

import dataclasses
import time

from pegainfer.engine.admission import admit
from pegainfer.engine.batcher import MIXED_STEP_TOKENS, Batcher
from pegainfer.engine.contract import MAX_LOGPROBS, Admit, SamplingParams
from pegainfer.engine.engine import Engine
from pegainfer.engine.kv_capacity import PagedCapacity
from pegainfer.engine.startup_log import log_event

SAMPLED = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, min_p=0.05, presence_penalty=0.5,
                         frequency_penalty=0.5, repetition_penalty=1.1, seed=1, logprobs=5, logit_bias=((1, 1.0),))


@dataclasses.dataclass(frozen=True, slots=True)
class WarmupReport:
    capture_s: float  # capturing every graph (with the compiles of their first runs)
    requests_s: float  # the warm-up requests (the sampler's and the eager steps' compiles)
    decode_keys: tuple  # the decode graphs captured: (batch, length, kind)
    prefill_keys: tuple  # the prefill graphs captured: (tokens, bank, logits, one prompt)
    requests: int


def warm_up(engine: Engine, *, max_prefill_tokens: int = 8192,
            mixed_step_tokens: int = MIXED_STEP_TOKENS) -> WarmupReport:
    t0 = time.perf_counter()
    decode, prefill = engine.runner.graphs, engine.runner.prefill_graphs
    decode_keys = tuple(decode.keys()) if decode is not None else ()
    prefill_keys = tuple(prefill.keys()) if prefill is not None else ()
    with engine.model.routes.uncounted():  # no step of the engine's
        if decode is not None:
            decode.warm(list(decode_keys))
        if prefill is not None:
            prefill.warm(list(prefill_keys))
        t1 = time.perf_counter()
        batches = warm_requests(engine, max_prefill_tokens)
        for admits in batches:
            run_requests(engine, admits, max_prefill_tokens, mixed_step_tokens)
    t2 = time.perf_counter()
    report = WarmupReport(t1 - t0, t2 - t1, decode_keys, prefill_keys, sum(map(len, batches)))
    log_event("warmup_done", capture_s=round(report.capture_s, 3), requests_s=round(report.requests_s, 3),
              decode_graphs=len(decode_keys), prefill_graphs=len(prefill_keys), requests=len(admits))
    return report


def warm_requests(engine: Engine, max_prefill_tokens: int) -> list[list[Admit]]:
    """The warm-up requests (see the module docstring), in batches run one after another: a sampling
    step compiles for the largest top-N log-probs of its batch (and for penalties or none), so each
    top-N, with and without penalties, runs in a batch of its own. One greedy token without the Triton
    kernels."""
    tok = 1 % engine.cfg.vocab_size
    if not engine.model.kernels.triton:
        return [[Admit("warmup-0", [tok], 2, True)]]
    max_len = engine.max_model_len
    long = min(max_len - 4, max_prefill_tokens + 100)  # cut into chunks: the later one reads the cache
    first = [Admit("warmup-greedy", [tok], 3, True), Admit("warmup-long", [tok] * long, 2, True),
             Admit("warmup-sampled", [tok] * 5, 3, True, SAMPLED, n=min(2, engine.cache.num_slots))]
    first += [Admit(f"warmup-echo-{n}", [tok] * n, 2, True, SamplingParams(prompt_logprobs=MAX_LOGPROBS))
              for n in (1, 17, 32, 40)]  # eager prompt steps: a size of 1, a multiple of 16, neither
    batches = [first]
    for top in (None, *range(MAX_LOGPROBS + 1)):
        for penalty in (0.0, 0.5):
            spec = SamplingParams(temperature=1.0, seed=2, presence_penalty=penalty, logprobs=top)
            batches.append([Admit(f"warmup-top-{top}-{penalty}", [tok] * 2, 2, True, spec)])
    return [[a for a in batch if len(a.prompt_ids) + a.max_tokens <= max_len] for batch in batches]


def run_requests(engine: Engine, admits: list[Admit], max_prefill_tokens: int, mixed_step_tokens: int) -> int:
    """Serve `admits` to the end through a batcher and the runner, one step at a time (no overlap);
    the number of steps. Raises if one fails: a server that cannot serve these is not ready."""
    b = Batcher(PagedCapacity(engine.cache), engine.eos_id, max_prefill_tokens=max_prefill_tokens,
                mixed_step_tokens=mixed_step_tokens, overlap=False)
    for a in admits:
        b.add(admit(a, engine))
    steps = 0
    while b.busy:
        b.admit()
        plan = b.plan()
        out = b.settle(plan, engine.runner.run(plan))
        if out.failed:
            raise RuntimeError(f"warm-up request failed: {out.failed[0].message}")
        steps += 1
    return steps
