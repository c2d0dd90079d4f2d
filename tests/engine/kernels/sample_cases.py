"""Draws for the sampler kernel's tests (tests/engine/kernels/test_sample.py): engine.sampler's Draw
lists turned into the kernel's inputs (SampleRows, the history and bias slots), and a mixed batch
that touches every stage: greedy, temperature, top-k, top-p, min-p, penalties, logit_bias, seeds."""
from __future__ import annotations

import random

import torch

from pegainfer.engine.contract import SamplingParams
from pegainfer.engine.kernels.sample_rows import HISTORY_SEEN, SampleRows
from pegainfer.engine.sampler import Draw


def kernel_inputs(draws: list[Draw], vocab: int, device: torch.device | str
                  ) -> tuple[SampleRows, torch.Tensor | None, torch.Tensor | None]:
    """(rows, history [H, V] int32 or None, bias [B, V] float32 or None) for the draws: a history
    slot for each penalised draw (engine.sampler penalises only those), a bias slot for each draw
    with a logit_bias."""
    ps = [d.checked(vocab) for d in draws]
    pen = [s for s, p in enumerate(ps) if p.penalised]
    biased = [s for s, p in enumerate(ps) if p.bias_ids]
    history = torch.zeros(len(pen), vocab, dtype=torch.int32) if pen else None
    for slot, s in enumerate(pen):
        if draws[s].prompt_ids:
            history[slot, draws[s].prompt_ids] = HISTORY_SEEN
        if draws[s].output_ids:
            ids = torch.tensor(draws[s].output_ids)
            history[slot].index_put_((ids,), torch.ones(len(ids), dtype=torch.int32), accumulate=True)
    bias = torch.zeros(len(biased), vocab) if biased else None
    for slot, s in enumerate(biased):
        bias[slot, list(ps[s].bias_ids)] = torch.tensor(ps[s].bias_values)
    rows = SampleRows.build(
        [p.temperature for p in ps], top_p=[p.top_p for p in ps], top_k=[p.top_k for p in ps],
        min_p=[p.min_p for p in ps], presence=[p.presence for p in ps], frequency=[p.frequency for p in ps],
        repetition=[p.repetition for p in ps], seed=[p.seed for p in ps], index=[d.index for d in draws],
        step=[d.step for d in draws], row=[d.row for d in draws],
        history_slot=[pen.index(s) if s in pen else -1 for s in range(len(ps))],
        bias_slot=[biased.index(s) if s in biased else -1 for s in range(len(ps))], device=device)
    return rows, None if history is None else history.to(device), None if bias is None else bias.to(device)


SPECS = [
    SamplingParams(),
    SamplingParams(temperature=0.9),
    SamplingParams(temperature=0.9, top_k=20),
    SamplingParams(temperature=1.2, top_p=0.7),
    SamplingParams(temperature=1.0, min_p=0.05),
    SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=5, top_p=0.9, min_p=0.01),
    SamplingParams(repetition_penalty=1.3),  # greedy with a penalty
    SamplingParams(logit_bias=((7, 30.0), (3, -5.0))),  # greedy with a bias: token 7
    SamplingParams(temperature=1.1, top_p=0.8, presence_penalty=0.5, frequency_penalty=0.4, repetition_penalty=1.2),
    SamplingParams(temperature=0.8, top_k=40, logit_bias=((11, 4.0), (12, 3.5), (13, -100.0))),
    SamplingParams(temperature=0.6, min_p=0.1, top_p=0.95, frequency_penalty=-0.3),
]


def mixed_draws(rows: int, vocab: int, seed: int) -> list[Draw]:
    """rows draws cycling through SPECS, each with its own seed, choice index, step and a history of
    prompt and output tokens (used by the penalised ones only)."""
    rng = random.Random(seed)
    return [Draw(r, SPECS[r % len(SPECS)], rng.randrange(-2**63, 2**63), rng.randrange(4), rng.randrange(1000),
                 [rng.randrange(vocab) for _ in range(20)], [rng.randrange(vocab) for _ in range(12)])
            for r in range(rows)]


def crowd_draws(probe: Draw, size: int, pos: int, vocab: int, seed: int) -> list[Draw]:
    """probe at position pos among size - 1 mixed draws; draw s reads logits row s."""
    others = mixed_draws(size, vocab, seed)
    draws = [Draw(s, d.spec, d.seed, d.index, d.step, d.prompt_ids, d.output_ids) for s, d in enumerate(others)]
    draws[pos] = Draw(pos, probe.spec, probe.seed, probe.index, probe.step, probe.prompt_ids, probe.output_ids)
    return draws
