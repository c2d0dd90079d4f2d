"""Token choice for a step: penalties, temperature, min-p, top-k, top-p and the seeded draw, for every
row of the step in one batched call on the device (no per-row Python loop), plus the log-probs.

Semantics, in the order applied (vLLM's):
- repetition_penalty divides positive logits (multiplies negative ones) of every token seen in the
  prompt or the output; frequency_penalty subtracts penalty * count and presence_penalty subtracts
  penalty once, for tokens of the output only.
- logit_bias is added to the logits first (before the penalties), as vLLM does.
- temperature 0 (or below GREEDY_BELOW) is greedy: the argmax of the (biased, penalised) logits, bit
  for bit what torch.argmax gives.
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
from collections.abc import Callable

import torch

from pegainfer.engine.counter_rng import exponential
from pegainfer.engine.draw_params import DrawParams
from pegainfer.engine.contract import SamplingParams, TopLogprobs


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


# Shaped logits (bias, penalties) are kept within this: divided by a temperature >= GREEDY_BELOW they
# stay finite, so a softmax never sees inf - inf (NaN), whatever a request's penalties do to them.
LOGIT_LIMIT = 1e30


@dataclasses.dataclass(frozen=True, slots=True)
class Draw:
    """One token to choose this step: which forward row's logits, for which sequence. `params` are
    the sequence's DrawParams from its admission; without them (tools, tests) the batch converts
    `spec` and `seed` itself."""
    row: int  # index of the forward row whose logits it draws from
    spec: SamplingParams
    seed: int  # the request's seed, as a signed 64-bit integer
    index: int  # the sequence's choice index
    step: int  # tokens the sequence generated before this one
    prompt_ids: list[int] = dataclasses.field(default_factory=list)  # for the penalties only
    output_ids: list[int] = dataclasses.field(default_factory=list)
    params: DrawParams | None = None

    def checked(self, vocab: int) -> DrawParams:
        return self.params if self.params is not None else DrawParams.of(self.spec, self.seed, vocab)


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
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # [B] draw, [B] token, [B] float32 bias
    hot: torch.Tensor | None  # [H] int64 the draws with temperature > 0, when not all of them are
    all_greedy: bool
    use_min_p: bool
    use_top_k_top_p: bool
    num_logprobs: int | None  # the largest N any draw asked for; None: no log-probs at all

    @classmethod
    def build(cls, draws: list[Draw], vocab: int, device: torch.device | str) -> SamplingBatch:
        ps = [d.checked(vocab) for d in draws]
        floats = torch.tensor([[p.temperature for p in ps], [p.top_p for p in ps], [p.min_p for p in ps],
                               [p.presence for p in ps], [p.frequency for p in ps],
                               [p.repetition for p in ps]], dtype=torch.float32).to(device)  # [6, S]
        ints = torch.tensor([[d.row for d in draws], [p.top_k for p in ps], [p.seed for p in ps],
                             [d.index for d in draws], [d.step for d in draws]], dtype=torch.int64).to(device)  # [5, S]
        hot = [i for i, p in enumerate(ps) if p.hot]
        wanted = [p.logprobs for p in ps if p.logprobs is not None]
        seen = counts = None
        if any(p.penalised for p in ps):
            seen, counts = _histories(draws, ps, vocab, device)
        bias = None
        if any(p.bias_ids for p in ps):
            bias = (torch.tensor([s for s, p in enumerate(ps) for _ in p.bias_ids], dtype=torch.int64).to(device),
                    torch.tensor([t for p in ps for t in p.bias_ids], dtype=torch.int64).to(device),
                    torch.tensor([v for p in ps for v in p.bias_values], dtype=torch.float32).to(device))
        identity = all(d.row == i for i, d in enumerate(draws))
        return cls(
            rows=None if identity else ints[0], temperature=floats[0], top_p=floats[1], min_p=floats[2],
            presence=floats[3], frequency=floats[4], repetition=floats[5], top_k=ints[1], seed=ints[2],
            index=ints[3], step=ints[4], seen_in_prompt=seen, output_counts=counts, bias=bias,
            hot=None if len(hot) in (0, len(draws)) else torch.tensor(hot, dtype=torch.int64).to(device),
            all_greedy=not hot, use_min_p=any(ps[i].min_p > 0 for i in hot),
            use_top_k_top_p=any(ps[i].top_k > 0 or ps[i].top_p < 1 for i in hot),
            num_logprobs=max(wanted) if wanted else None)


@dataclasses.dataclass(slots=True)
class Sampled:
    tokens: torch.Tensor  # [S] int64
    logprobs: torch.Tensor | None  # [S] float32, the chosen tokens' raw log-probs
    top_ids: torch.Tensor | None  # [S, N] int64
    top_logprobs: torch.Tensor | None  # [S, N] float32


def sample(logits: torch.Tensor, b: SamplingBatch) -> Sampled:
    """logits: [R, V] float32, one row per forward row; returns one token per draw."""
    # [S, V]; with rows None draw s reads row s, and the draws may be fewer than the rows
    raw = logits[:b.seed.shape[0]] if b.rows is None else logits.index_select(0, b.rows)
    x = raw
    if b.bias is not None:  # added to a copy: the log-probs stay those of the raw logits
        x = x.index_put((b.bias[0], b.bias[1]), b.bias[2], accumulate=True).clamp(-LOGIT_LIMIT, LOGIT_LIMIT)
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
    """[S, V] -> [S, V]. A draw with neutral penalties (0, 0, 1) keeps its logits bit for bit. The
    result stays within +-LOGIT_LIMIT (a tiny repetition penalty would send logits to inf, and
    inf - inf is NaN)."""
    in_output = counts > 0  # [S, V]
    rep = repetition[:, None]
    scaled = torch.where(logits > 0, logits / rep, logits * rep).clamp(-LOGIT_LIMIT, LOGIT_LIMIT)
    x = torch.where(seen_in_prompt | in_output, scaled, logits)
    x = x - frequency[:, None] * counts - presence[:, None] * in_output.to(logits.dtype)
    return x.clamp(-LOGIT_LIMIT, LOGIT_LIMIT)


def top_k_top_p(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero every probability outside each row's top-k and then its top-p nucleus. [S, V] -> [S, V]."""
    vocab = probs.shape[-1]
    ordered, order = probs.sort(dim=-1, descending=True)  # [S, V]
    rank = torch.arange(vocab, device=probs.device)[None, :]  # [1, V]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))  # [S]
    keep = rank < k[:, None]  # [S, V]
    ordered = ordered.masked_fill(~keep, 0.0)
    running = ordered.cumsum(dim=-1)  # [S, V]: one scan per row, the same whatever the other rows
    # the total as the scan's last entry, not a sum(): a reduction over few rows may split each row
    # between threads or blocks, an order that depends on how many rows share the call
    mass_before = (running - ordered) / running[:, -1:]  # [S, V]
    keep &= (mass_before < top_p[:, None]) | (top_p[:, None] >= 1)  # the first token is always kept
    return torch.zeros_like(probs).scatter(-1, order, ordered.masked_fill(~keep, 0.0))


# [slice, V] float32 logits of prompt positions (and their log-softmax) held at once: 40 positions
# at DeepSeek's vocabulary of 102,400, however long the prompt or its chunk
PROMPT_SLICE_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class PromptWant:
    """The prompt log-probs one forward row (a prompt chunk) asks for."""
    n: int  # the top-N at each position
    targets: list[int]  # the prompt token each chunk position predicts (one fewer in the prompt's last chunk)
    first: bool  # the chunk starts the prompt: its entries begin with the first token's None


def prompt_logprobs(logits_of: Callable[[int, int], torch.Tensor], targets: list[int], n: int, vocab: int,
                    slice_bytes: int = PROMPT_SLICE_BYTES) -> list[tuple[float, TopLogprobs]]:
    """Log-probs of the prompt tokens a chunk of positions predicts: entry j is targets[j]'s log-prob
    given the prompt up to chunk position j, with the top-n there. logits_of(a, b) returns the
    [b - a, V] float32 logits of chunk positions a..b-1; it is asked slice by slice, so at most
    slice_bytes of logits exist at once. Only the small per-position results are kept."""
    step = max(1, slice_bytes // (4 * vocab))
    out: list[tuple[float, TopLogprobs]] = []
    for a in range(0, len(targets), step):
        b = min(a + step, len(targets))
        lp = torch.log_softmax(logits_of(a, b), dim=-1)  # [b - a, V]
        target = torch.tensor(targets[a:b], dtype=torch.int64, device=lp.device)  # [b - a]
        chosen = lp.gather(1, target[:, None]).squeeze(1).tolist()  # [b - a]
        top_lp, top_ids = lp.topk(n, dim=-1)  # [b - a, n]
        out += [(c, tuple(zip(i, v))) for c, i, v in zip(chosen, top_ids.tolist(), top_lp.tolist())]
    return out


def _histories(draws: list[Draw], ps: list[DrawParams], vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """[S, V] prompt-token presence and output-token counts of the penalised draws (zeros elsewhere)."""
    seen = torch.zeros(len(draws), vocab, dtype=torch.bool, device=device)
    counts = torch.zeros(len(draws), vocab, dtype=torch.float32, device=device)
    prow, pids, orow, oids = [], [], [], []
    for s, (d, p) in enumerate(zip(draws, ps)):
        if p.penalised:
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
