"""Offline batched generation over the engine: what `pegainfer generate`, the HF oracle and the
direct benchmark run. All rows prefill in one step, then decode together in one step each. Greedy
unless a SamplingParams is given (one for all prompts, or one per prompt)."""
from __future__ import annotations

import dataclasses

from pegainfer.engine.admission import runnable
from pegainfer.engine.batch import RowInput
from pegainfer.engine.draw_params import DrawParams
from pegainfer.engine.engine import Engine, RequestError
from pegainfer.engine.contract import SamplingParams, TopLogprobs
from pegainfer.engine.sampler import Draw
from pegainfer.engine.step_plan import StepPlan


@dataclasses.dataclass(slots=True)
class Generation:
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    logprobs: list[float | None] = dataclasses.field(default_factory=list)  # per token, when asked for
    top_logprobs: list[TopLogprobs] = dataclasses.field(default_factory=list)


def generate(engine: Engine, prompts: list[list[int]], max_tokens: int, ignore_eos: bool = False,
             sampling: SamplingParams | list[SamplingParams] | None = None) -> list[Generation]:
    for p in prompts:  # the caller checked its inputs; these are the engine's invariants
        runnable(p, max_tokens, engine)
    specs = sampling if isinstance(sampling, list) else [sampling or SamplingParams()] * len(prompts)
    if len(specs) != len(prompts):
        raise ValueError(f"{len(specs)} sampling specs for {len(prompts)} prompts")
    params = [DrawParams.of(s, s.seed or 0, engine.cfg.vocab_size) for s in specs]  # ValueError on a bad spec
    slots: list[int] = []
    try:
        for p in prompts:  # pages for the whole context of each (CacheFull if the cache has too few)
            slots.append(engine.cache.allocate(len(p) + max_tokens))
        out = [Generation(p, [], "length") for p in prompts]
        rows = [RowInput(s, p, 0) for s, p in zip(slots, prompts)]
        live = list(range(len(prompts)))
        while live:
            draws = [Draw(r, specs[i], specs[i].seed or 0, 0, len(out[i].token_ids), prompts[i], out[i].token_ids,
                          params[i]) for r, i in enumerate(live)]
            step = engine.runner.run(StepPlan(rows, draws=draws))
            if step.failed:  # cannot happen with checked params; never hand out a placeholder token
                raise RequestError(f"prompt {live[min(step.failed)]}: {step.failed[min(step.failed)]}")
            next_rows, next_live = [], []
            for i, row, tok, lp, top in zip(live, rows, step.tokens, step.logprobs, step.top_logprobs):
                g = out[i]
                g.token_ids.append(tok)
                g.logprobs.append(lp)
                g.top_logprobs.append(top)
                if tok == engine.eos_id and not ignore_eos:
                    g.finish_reason = "stop"
                elif len(g.token_ids) < max_tokens:
                    next_rows.append(RowInput(row.slot, [tok], row.start_pos + len(row.token_ids)))
                    next_live.append(i)
            rows, live = next_rows, next_live
        return out
    finally:
        for s in slots:
            engine.cache.release(s)
