"""The sampler on fake logits: draws follow the (masked) softmax by a chi-square test, greedy rows are
exactly torch.argmax whatever else is in the batch, a seed gives the same token in any batch, the
penalties follow vLLM, log-probs come from the raw logits, and the counter RNG's hash is exact."""
from __future__ import annotations

import math
import random

import pytest
import torch

from pegainfer.engine.counter_rng import mix32, uniform
from pegainfer.engine.contract import SamplingParams
from pegainfer.engine.sampler import Draw, SamplingBatch, apply_penalties, sample

LOGITS = [2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -3.0]  # V = 8
DRAWS = 20_000
P_MIN = 1e-3  # the draws are a fixed function of the seeds: the test is deterministic, not flaky


def expected(logits: list[float], t: float, top_k: int = -1, top_p: float = 1.0, min_p: float = 0.0) -> list[float]:
    """The target distribution, computed independently in float64 (min_p, then top_k, then top_p)."""
    e = [math.exp(x / t) for x in logits]
    p = [x / sum(e) for x in e]
    p = [x if x >= min_p * max(p) else 0.0 for x in p]
    order = sorted(range(len(p)), key=lambda i: -p[i])
    if top_k > 0:
        for i in order[top_k:]:
            p[i] = 0.0
    total, before = sum(p), 0.0
    for i in order:
        if before >= top_p:
            before += p[i] / total
            p[i] = 0.0
        else:
            before += p[i] / total
    return [x / sum(p) for x in p]


def chi_square_p(counts: list[int], probs: list[float]) -> float:
    """Upper tail of the chi-square statistic over the tokens with nonzero probability."""
    n = sum(counts)
    cells = [(c, n * p) for c, p in zip(counts, probs) if p > 0]
    stat = sum((c - e) ** 2 / e for c, e in cells)
    df = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def draw_counts(spec: SamplingParams, *, vary: str = "step") -> list[int]:
    """DRAWS tokens from one logits row: one draw per step of one seed, or one per seed."""
    draws = [Draw(0, spec, 12345 if vary == "step" else i * 7919, 0, i if vary == "step" else 0)
             for i in range(DRAWS)]
    batch = SamplingBatch.build(draws, len(LOGITS), "cpu")
    tokens = sample(torch.tensor([LOGITS]), batch).tokens
    return torch.bincount(tokens, minlength=len(LOGITS)).tolist()


@pytest.mark.parametrize("kw", [
    {"temperature": 1.0},
    {"temperature": 0.6},
    {"temperature": 1.7},
    {"temperature": 1.0, "top_k": 2},  # keeps 2 tokens
    {"temperature": 1.0, "top_p": 0.9},  # keeps 4
    {"temperature": 1.0, "min_p": 0.05},  # keeps 5
    {"temperature": 1.3, "top_k": 5, "top_p": 0.9, "min_p": 0.05},
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_draws_follow_the_masked_softmax(kw):
    probs = expected(LOGITS, kw["temperature"], kw.get("top_k", -1), kw.get("top_p", 1.0), kw.get("min_p", 0.0))
    counts = draw_counts(SamplingParams(**kw))
    assert all(c == 0 for c, p in zip(counts, probs) if p == 0), (counts, probs)  # masked: never drawn
    assert chi_square_p(counts, probs) > P_MIN, (counts, [round(p * DRAWS) for p in probs])


def test_draws_across_seeds_follow_the_softmax():
    counts = draw_counts(SamplingParams(temperature=0.8), vary="seed")
    assert chi_square_p(counts, expected(LOGITS, 0.8)) > P_MIN


def test_the_chi_square_check_has_power():
    """The same counts against a slightly wrong distribution (temperature 1.1 instead of 1) fail."""
    counts = draw_counts(SamplingParams(temperature=1.0))
    assert chi_square_p(counts, expected(LOGITS, 1.1)) < 1e-6


def _mixed_batch(gen: torch.Generator, vocab: int, rows: int) -> tuple[torch.Tensor, list[Draw]]:
    logits = torch.randn(rows, vocab, generator=gen) * 3  # [R, V]
    specs = [SamplingParams(), SamplingParams(temperature=0.9, top_k=20), SamplingParams(repetition_penalty=1.3),
             SamplingParams(temperature=1.2, top_p=0.7, min_p=0.01, frequency_penalty=0.4), SamplingParams(logprobs=3)]
    draws = [Draw(r, specs[r % len(specs)], r * 31 + 1, 0, r, [1, 2, 3], [4, 4, 5]) for r in range(rows)]
    return logits, draws


def test_greedy_rows_are_exactly_argmax_in_a_mixed_batch():
    gen = torch.Generator().manual_seed(0)
    logits, draws = _mixed_batch(gen, 1000, 25)
    out = sample(logits, SamplingBatch.build(draws, 1000, "cpu")).tokens
    want = torch.argmax(logits, dim=-1)
    for r, d in enumerate(draws):
        if d.spec.temperature == 0 and not d.spec.penalised:
            assert out[r] == want[r]
    # a greedy row with a penalty is the argmax of its penalised logits
    r = 2
    seen = torch.zeros(1, 1000, dtype=torch.bool)
    seen[0, [1, 2, 3]] = True
    counts = torch.zeros(1, 1000)
    counts[0, 4], counts[0, 5] = 2, 1
    penalised = apply_penalties(logits[r:r + 1], seen, counts, torch.tensor([0.0]), torch.tensor([0.0]),
                                torch.tensor([1.3]))
    assert out[r] == torch.argmax(penalised)


def test_a_seed_draws_the_same_token_in_any_batch():
    """One (seed, choice, step) row alone, first in a batch, and last in another batch of other rows."""
    gen = torch.Generator().manual_seed(1)
    logits, draws = _mixed_batch(gen, 500, 12)
    row = torch.randn(1, 500, generator=gen)
    mine = Draw(0, SamplingParams(temperature=1.0, top_p=0.95), -987654321, 2, 17)
    alone = sample(row, SamplingBatch.build([mine], 500, "cpu")).tokens[0]
    first = sample(torch.cat([row, logits]), SamplingBatch.build(
        [mine] + [Draw(d.row + 1, d.spec, d.seed, d.index, d.step, d.prompt_ids, d.output_ids) for d in draws],
        500, "cpu")).tokens[0]
    last = sample(torch.cat([logits, row]), SamplingBatch.build(
        draws + [Draw(len(draws), mine.spec, mine.seed, mine.index, mine.step)], 500, "cpu")).tokens[-1]
    assert alone == first == last
    # and the seed matters: other seeds draw other tokens from the same near-flat row
    others = {int(sample(row, SamplingBatch.build([Draw(0, mine.spec, s, 2, 17)], 500, "cpu")).tokens[0])
              for s in range(20)}
    assert len(others) > 5


def test_penalties_follow_vllm():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    seen = torch.tensor([[True, False, False, False]])  # token 0 is in the prompt
    counts = torch.tensor([[0.0, 2.0, 0.0, 1.0]])  # the output has token 1 twice and token 3 once
    got = apply_penalties(logits, seen, counts, presence=torch.tensor([0.25]), frequency=torch.tensor([0.5]),
                          repetition=torch.tensor([2.0]))
    # token 0: prompt only, positive: 2 / 2; token 1: negative, *2, then -0.5*2 - 0.25; token 2 untouched;
    # token 3: 3 / 2 - 0.5*1 - 0.25
    assert got.tolist() == [[1.0, -3.25, 0.5, 0.75]]
    neutral = apply_penalties(logits, seen, counts, torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([1.0]))
    assert torch.equal(neutral, logits)


def test_penalties_change_the_choice_through_sample():
    logits = torch.tensor([[3.0, 2.9, 0.0, 0.0]])
    plain = Draw(0, SamplingParams(), 0, 0, 1, [9], [0])
    penalised = Draw(0, SamplingParams(repetition_penalty=1.5), 0, 0, 1, [], [0])
    presence = Draw(0, SamplingParams(presence_penalty=0.5), 0, 0, 1, [], [0])
    tokens = [int(sample(logits, SamplingBatch.build([d], 4, "cpu")).tokens[0]) for d in (plain, penalised, presence)]
    assert tokens == [0, 1, 1]


def test_logprobs_are_from_the_raw_logits():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 64, generator=gen)
    specs = [SamplingParams(temperature=0.5, logprobs=4, presence_penalty=1.0), SamplingParams(logprobs=0),
             SamplingParams(temperature=1.5, top_k=3, logprobs=2)]
    draws = [Draw(r, s, 7, 0, 0, [], [1, 2]) for r, s in enumerate(specs)]
    out = sample(logits, SamplingBatch.build(draws, 64, "cpu"))
    ref = torch.log_softmax(logits, dim=-1)
    for r in range(3):
        assert out.logprobs[r] == ref[r, out.tokens[r]]
    top_lp, top_ids = ref.topk(4, dim=-1)
    assert torch.equal(out.top_ids, top_ids) and torch.equal(out.top_logprobs, top_lp)


def test_mix32_is_lowbias32():
    def lowbias32(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    rng = random.Random(0)
    xs = [0, 1, 0xFFFFFFFF, 0x80000000] + [rng.getrandbits(32) for _ in range(2000)]
    assert mix32(torch.tensor(xs, dtype=torch.int64)).tolist() == [lowbias32(x) for x in xs]


def test_uniforms_are_in_the_open_unit_interval_and_spread():
    from pegainfer.engine.counter_rng import to_unit
    u = uniform(torch.tensor([0, 1, 2**31], dtype=torch.int64), 4096)  # [3, 4096]
    assert 0 < u.min() and u.max() < 1
    # every hash, the extremes included (a uniform of 1 is an Exp(1) noise of 0: an infinite weight)
    edges = to_unit(torch.tensor([0, 1, 511, 512, 2**31, 2**32 - 513, 2**32 - 512, 2**32 - 1], dtype=torch.int64))
    assert 0 < edges.min() and edges.max() < 1 and edges.max() == 1 - 2**-24 and edges.min() == 2**-24
    noise = -torch.log(edges)
    assert (noise > 0).all() and torch.isfinite(torch.log(noise)).all()
    from pegainfer.engine.counter_rng import MIN_NOISE, exponential
    e = exponential(torch.tensor([0, 7]), torch.tensor([0, 1]), torch.tensor([3, 9]), 4096)
    assert e.min() >= MIN_NOISE and noise.min() > MIN_NOISE  # the floor never bites with an exact log
    assert abs(u.mean().item() - 0.5) < 0.01 and not torch.equal(u[0], u[1])


def test_argmax_rows_is_torch_argmax_ties_included():
    from pegainfer.engine.sampler import argmax_rows
    g = torch.Generator().manual_seed(3)
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(6, 102400, generator=g).to(dt)
        x[1] = 0  # every entry ties: the first index
        x[2, 4000] = x[2, 95000] = 50  # a tie across blocks: the earlier block
        x[3, 1601] = x[3, 1650] = 50  # a tie inside one block
        x[4] = (torch.randn(102400, generator=g) * 0.01).to(dt).round()  # many ties at 0 and ±0.0
        assert torch.equal(argmax_rows(x), torch.argmax(x, dim=-1))
    odd = torch.randn(3, 1000, generator=g)  # not divisible into blocks: torch.argmax itself
    assert torch.equal(argmax_rows(odd), torch.argmax(odd, dim=-1))


def test_extreme_penalties_and_biases_never_make_nan_or_inf():
    """The sampler's domain at its edges (engine.draw_params): a repetition penalty rounded up to the
    smallest normal float32, penalties and biases as large as float32 holds, the smallest hot
    temperature. The shaped logits stay finite and every draw is a real token."""
    logits = torch.tensor([[0.0, 5.0, -5.0, 1e-3, 2.0]])  # [1, V]
    seen = torch.ones(1, 5, dtype=torch.bool)
    counts = torch.tensor([[1.0, 2.0, 0.0, 3.0, 0.0]])
    for presence, frequency in ((3e38, -3e38), (-3e38, 3e38), (0.0, 3e38)):
        got = apply_penalties(logits, seen, counts, torch.tensor([presence]), torch.tensor([frequency]),
                              torch.tensor([1.1754944e-38]))
        assert torch.isfinite(got).all(), got
    specs = [SamplingParams(temperature=1e-5, repetition_penalty=1e-300, frequency_penalty=-2, presence_penalty=2),
             SamplingParams(temperature=2.0, logit_bias=((2, 100.0), (1, -100.0)), top_p=1e-300),
             SamplingParams(temperature=1.0, logit_bias=((0, 3e38), (4, 3e38)), repetition_penalty=1e-40)]
    draws = [Draw(0, s, i, 0, 3, [0, 1], [1, 3, 3]) for i, s in enumerate(specs)]
    out = sample(logits, SamplingBatch.build(draws, 5, "cpu")).tokens.tolist()
    assert all(0 <= t < 5 for t in out) and out[1] == 2


def test_a_temperature_below_the_greedy_threshold_is_greedy():
    assert SamplingParams(temperature=1e-6).plain_greedy and not SamplingParams(temperature=1e-5).plain_greedy
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    draws = [Draw(r, SamplingParams(temperature=1e-6, top_k=3), r, 0, 0) for r in range(4)]
    assert torch.equal(sample(logits, SamplingBatch.build(draws, 50, "cpu")).tokens, torch.argmax(logits, dim=-1))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
@pytest.mark.parametrize("rows", [2, 7, 64, 256])
def test_the_nucleus_of_a_row_is_bitwise_the_same_in_any_batch(rows, device):
    """top_k_top_p keeps and rescales nothing by a reduction whose order depends on the rows beside
    it (a sum over few rows may split each row between threads): at DeepSeek's vocabulary, a row's
    kept probabilities equal bitwise alone and in a batch."""
    from pegainfer.engine.sampler import top_k_top_p
    gen = torch.Generator().manual_seed(rows)
    probs = torch.softmax(torch.randn(rows, 102_400, generator=gen) * 3, dim=-1).to(device)
    top_k = torch.full((rows,), -1, dtype=torch.int64, device=device)
    top_p = torch.full((rows,), 0.9, device=device)
    together = top_k_top_p(probs, top_k, top_p)
    for r in (0, rows // 2, rows - 1):
        alone = top_k_top_p(probs[r:r + 1], top_k[r:r + 1], top_p[r:r + 1])
        assert torch.equal(together[r], alone[0]), r
