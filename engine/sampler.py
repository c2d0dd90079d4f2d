"""Token choice for a step: penalties, temperature, min-p, top-k, top-p and the seeded draw, for every
row of the step in one batched call on the device (no per-row Python loop), plus the log-probs.

Semantics, in the order applied (vLLM's):
- repetition_penalty divides positive logits (multiplies negative ones) of every token seen in the
  prompt or the output; frequency_penalty subtracts penalty * count and presence_penalty subtracts
  penalty once, for tokens of the output only.
- temperature 0 is greedy: the argmax of the (penalised) logits, bit for bit what torch.argmax gives.
- otherwise: softmax(logits / temperature), then min_p (drop tokens below min_p * the top
  probability), then top_k, then top_p over what top_k kept (the smallest set whose mass reaches
  top_p; the most likely token always stays), then one draw.
- the draw is argmax(probs / E) with E ~ Exp(1) per vocabulary entry (the exponential race, equal
  in law to a categorical draw); E comes from engine.counter_rng, keyed by (seed, choice index,
  tokens generated so far), so a seed reproduces its tokens whatever else shares the batch.
- log-probs are the log-softmax of the raw model logits, before penalties and temperature (vLLM's
  default "raw" mode): the chosen token's, and the top-N.
"""
from __future__ import annotations

import dataclasses

import torch

from engine.counter_rng import exponential
from engine.messages import SamplingSpec, TopLogprobs


def argmax_rows(logits: torch.Tensor, chunks: int = 64, out: torch.Tensor | None = None) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) for [B, V] logits, in two passes: the max of each of `chunks`
    column blocks (B * chunks reductions in parallel), then the first block holding the row's max.
    The same index as torch.argmax (the first of equal maxima: both passes keep the first). One
    pass over a 102,400-wide row ran as a single block of threads: 28.6 µs of a 2.5 ms batch-1 step
    on the H200 (gpu_probe.py --timeline). out: a [B] int64 tensor to write the indices into."""
    b, v = logits.shape
    if v % chunks or v < 4 * chunks:
        return torch.argmax(logits, dim=-1, out=out)
    vals, idx = logits.view(b, chunks, v // chunks).max(dim=-1)  # [B, chunks] each
    best = torch.argmax(vals, dim=-1, keepdim=True)  # [B, 1]
    first = best * (v // chunks)  # [B, 1]
    if out is None:
        return (first + idx.gather(1, best)).squeeze(1)
    torch.add(first, idx.gather(1, best), out=out.unsqueeze(1))
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Draw:
    """One token to choose this step: which forward row's logits, for which sequence."""
    row: int  # index of the forward row whose logits it draws from
    spec: SamplingSpec
    seed: int  # the request's seed, as a signed 64-bit integer
    index: int  # the sequence's choice index
    step: int  # tokens the sequence generated before this one
    prompt_ids: list[int] = dataclasses.field(default_factory=list)  # for the penalties only
    output_ids: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class SamplingBatch:
    """Per-draw parameters as device tensors, [S] each, and which optional stages run at all."""
    rows: torch.Tensor | None  # [S] int64 source row of each draw; None when draw s reads row s
    temperature: torch.Tensor  # [S] float32
    top_p: torch.Tensor  # [S] float32
    top_k: torch.Tensor  # [S] int64, <= 0 off
    min_p: torch.Tensor  # [S] float32
    presence: torch.Tensor  # [S] float32
    frequency: torch.Tensor  # [S] float32
    repetition: torch.Tensor  # [S] float32
    seed: torch.Tensor  # [S] int64
    index: torch.Tensor  # [S] int64
    step: torch.Tensor  # [S] int64
    seen_in_prompt: torch.Tensor | None  # [S, V] bool, only when some draw is penalised
    output_counts: torch.Tensor | None  # [S, V] float32, likewise
    hot: torch.Tensor | None  # [H] int64 the draws with temperature > 0, when not all of them are
    all_greedy: bool
    use_min_p: bool
    use_top_k_top_p: bool
    num_logprobs: int | None  # the largest N any draw asked for; None: no log-probs at all

    @classmethod
    def build(cls, draws: list[Draw], vocab: int, device: torch.device | str) -> SamplingBatch:
        specs = [d.spec for d in draws]
        floats = torch.tensor([[s.temperature for s in specs], [s.top_p for s in specs], [s.min_p for s in specs],
                               [s.presence_penalty for s in specs], [s.frequency_penalty for s in specs],
                               [s.repetition_penalty for s in specs]], dtype=torch.float32).to(device)  # [6, S]
        ints = torch.tensor([[d.row for d in draws], [s.top_k for s in specs], [d.seed for d in draws],
                             [d.index for d in draws], [d.step for d in draws]], dtype=torch.int64).to(device)  # [5, S]
        hot = [i for i, s in enumerate(specs) if s.temperature > 0]
        wanted = [s.logprobs for s in specs if s.logprobs is not None]
        seen = counts = None
        if any(s.penalised for s in specs):
            seen, counts = _histories(draws, vocab, device)
        identity = all(d.row == i for i, d in enumerate(draws))
        return cls(
            rows=None if identity else ints[0], temperature=floats[0], top_p=floats[1], min_p=floats[2],
            presence=floats[3], frequency=floats[4], repetition=floats[5], top_k=ints[1], seed=ints[2],
            index=ints[3], step=ints[4], seen_in_prompt=seen, output_counts=counts,
            hot=None if len(hot) in (0, len(draws)) else torch.tensor(hot, dtype=torch.int64).to(device),
            all_greedy=not hot, use_min_p=any(specs[i].min_p > 0 for i in hot),
            use_top_k_top_p=any(specs[i].top_k > 0 or specs[i].top_p < 1 for i in hot),
            num_logprobs=max(wanted) if wanted else None)


@dataclasses.dataclass(slots=True)
class Sampled:
    tokens: torch.Tensor  # [S] int64
    logprobs: torch.Tensor | None  # [S] float32, the chosen tokens' raw log-probs
    top_ids: torch.Tensor | None  # [S, N] int64
    top_logprobs: torch.Tensor | None  # [S, N] float32


def sample(logits: torch.Tensor, b: SamplingBatch) -> Sampled:
    """logits: [R, V] float32, one row per forward row; returns one token per draw."""
    raw = logits if b.rows is None else logits.index_select(0, b.rows)  # [S, V]
    x = raw
    if b.output_counts is not None:
        x = apply_penalties(x, b.seen_in_prompt, b.output_counts, b.presence, b.frequency, b.repetition)
    greedy = torch.argmax(x, dim=-1)  # [S]
    tokens = greedy
    if not b.all_greedy:
        pick = (lambda t: t) if b.hot is None else (lambda t: t.index_select(0, b.hot))  # only the hot draws
        probs = torch.softmax(pick(x) / pick(b.temperature)[:, None], dim=-1)  # [H, V]
        if b.use_min_p:
            floor = pick(b.min_p)[:, None] * probs.amax(dim=-1, keepdim=True)  # [H, 1]
            probs = probs.masked_fill(probs < floor, 0.0)
        if b.use_top_k_top_p:
            probs = top_k_top_p(probs, pick(b.top_k), pick(b.top_p))
        noise = exponential(pick(b.seed), pick(b.index), pick(b.step), probs.shape[-1])  # [H, V]
        drawn = torch.argmax(probs / noise, dim=-1)  # [H]
        tokens = drawn if b.hot is None else greedy.index_copy(0, b.hot, drawn)
    if b.num_logprobs is None:
        return Sampled(tokens, None, None, None)
    lp = torch.log_softmax(raw, dim=-1)  # [S, V]
    chosen = lp.gather(1, tokens[:, None]).squeeze(1)  # [S]
    top_lp, top_ids = lp.topk(b.num_logprobs, dim=-1)  # [S, N]
    return Sampled(tokens, chosen, top_ids, top_lp)


def apply_penalties(logits: torch.Tensor, seen_in_prompt: torch.Tensor, counts: torch.Tensor,
                    presence: torch.Tensor, frequency: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
    """[S, V] -> [S, V]. A draw with neutral penalties (0, 0, 1) keeps its logits bit for bit."""
    in_output = counts > 0  # [S, V]
    rep = repetition[:, None]
    scaled = torch.where(logits > 0, logits / rep, logits * rep)
    x = torch.where(seen_in_prompt | in_output, scaled, logits)
    return x - frequency[:, None] * counts - presence[:, None] * in_output.to(logits.dtype)


def top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero every probability outside each row's top-k and then its top-p nucleus. [S, V] -> [S, V]."""
    vocab = probs.shape[-1]
    ordered, order = probs.sort(dim=-1, descending=True)  # [S, V]
    rank = torch.arange(vocab, device=probs.device)[None, :]  # [1, V]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))  # [S]
    keep = rank < k[:, None]  # [S, V]
    ordered = ordered.masked_fill(~keep, 0.0)
    mass_before = (ordered.cumsum(dim=-1) - ordered) / ordered.sum(dim=-1, keepdim=True)  # [S, V]
    keep &= (mass_before < top_p[:, None]) | (top_p[:, None] >= 1)  # the first token is always kept
    return torch.zeros_like(probs).scatter(-1, order, ordered.masked_fill(~keep, 0.0))


def prompt_logprobs(logits: torch.Tensor, prompt_ids: list[int], n: int) -> list[tuple[float, TopLogprobs] | None]:
    """logits: [L, V] float32 of every prompt position. Entry i > 0 is token i's log-prob given
    tokens 0..i-1, with the top-n at that position; entry 0 has no context and is None."""
    if len(prompt_ids) < 2:
        return [None] * len(prompt_ids)
    lp = torch.log_softmax(logits[:-1], dim=-1)  # [L-1, V]: position i predicts token i+1
    target = torch.tensor(prompt_ids[1:], dtype=torch.int64, device=logits.device)
    chosen = lp.gather(1, target[:, None]).squeeze(1).tolist()  # [L-1]
    top_lp, top_ids = lp.topk(n, dim=-1)  # [L-1, n]
    return [None] + [(c, tuple(zip(i, v))) for c, i, v in zip(chosen, top_ids.tolist(), top_lp.tolist())]


def _histories(draws: list[Draw], vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """[S, V] prompt-token presence and output-token counts of the penalised draws (zeros elsewhere)."""
    seen = torch.zeros(len(draws), vocab, dtype=torch.bool, device=device)
    counts = torch.zeros(len(draws), vocab, dtype=torch.float32, device=device)
    prow, pids, orow, oids = [], [], [], []
    for s, d in enumerate(draws):
        if d.spec.penalised:
            prow += [s] * len(d.prompt_ids)
            pids += d.prompt_ids
            orow += [s] * len(d.output_ids)
            oids += d.output_ids
    if pids:
        seen[torch.tensor(prow, device=device), torch.tensor(pids, device=device)] = True
    if oids:
        idx = (torch.tensor(orow, device=device), torch.tensor(oids, device=device))
        counts.index_put_(idx, torch.ones(len(oids), device=device), accumulate=True)
    return seen, counts
