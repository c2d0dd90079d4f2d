"""No cold start (issue 28): the warm-up captures every graph key a step can ask for, and the later
chunks of a long prompt run in a prefill graph with the eager path's bits.

- PrefillGraphs.keys() holds the key of every step of prompts that fits (fresh packs and chunks over an
  earlier cache, drawn at random against the buckets), DecodeGraphs.keys() every decode batch and
  length, and engine.warmup captures exactly those lists, then runs its requests;
- on the CPU, with the Triton prompt attention in its interpreter and the graphs replaying their step
  (no CUDA), a prompt cut in two chunks through the graphs gives the logits and the cache of the eager
  path bit for bit, chunked or whole."""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.batch import Batch, RowInput  # noqa: E402
from pegainfer.engine.cuda_graphs import DecodeGraphs, bucket  # noqa: E402
from pegainfer.engine.engine import EngineSpec, build_engine  # noqa: E402
from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from pegainfer.engine.prefill_graphs import PrefillGraphs  # noqa: E402
from pegainfer.engine.contract import MAX_LOGPROBS  # noqa: E402
from pegainfer.engine.warmup import warm_requests, warm_up  # noqa: E402
from tests.engine.model_builds import rebuild  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    engine = build_engine(EngineSpec(random_preset="tiny", num_slots=4, max_model_len=3000))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def fused(tiny):
    model = rebuild(tiny, KernelConfig(), "loop")  # the same weights; the Triton prompt attention
    assert model.layers[0].attn.fused_prefill
    return model


def random_rows(rng: random.Random, max_tokens: int, max_len: int, chunk: bool) -> list[RowInput]:
    """Prompt rows as the batcher cuts them: at most one chunk over an earlier cache, first, then
    fresh prompts, within the token budget."""
    rows, left = [], rng.randint(1, max_tokens)
    if chunk:
        n = rng.randint(1, min(left, max_len - 1))
        rows.append(RowInput(0, [1] * n, rng.randint(1, max_len - n), prompt=True))
        left -= n
    while left > 0 and len(rows) < 64:
        n = rng.randint(1, left)
        rows.append(RowInput(len(rows) % 4, [1] * n, 0, prompt=True))
        left -= n if rng.random() < 0.7 else left
    return rows


@pytest.mark.parametrize("max_tokens", [8192, 2048, 700])
def test_every_prefill_step_that_fits_asks_for_a_warmed_key(tiny, fused, max_tokens):
    pg = PrefillGraphs(fused, tiny.cache, None, max_tokens=max_tokens)
    keys = set(pg.keys())
    assert len(keys) == len(pg.keys())
    rng = random.Random(max_tokens)
    asked = set()
    for i in range(3000):
        rows = random_rows(rng, max_tokens, tiny.cache.max_len, chunk=i % 2 == 0)
        assert pg.fits(rows)
        for logits in (False, True):
            asked.add(pg.key(rows, logits))
    assert asked <= keys, sorted(asked - keys)[:5]
    # both forms were drawn: fresh packs (their bank is their token bucket) and packs over a cache
    assert {k for k in asked if k[1] > k[0]} and {k for k in asked if k[1] == k[0]}
    t_max, n_max = pg.buckets[-1], pg.bank_buckets[-1]
    n = min(t_max, tiny.cache.max_len - 1)
    edge = [RowInput(0, [1] * n, tiny.cache.max_len - n, prompt=True)]  # the last chunk of a longest prompt
    edge += [RowInput(1, [1] * (t_max - n), 0, prompt=True)] if t_max > n else []  # and fresh ones to the budget
    assert pg.fits(edge) and pg.key(edge, False) in keys and pg.key(edge, False)[1] <= n_max


def test_every_decode_step_asks_for_a_warmed_key(tiny):
    dg = DecodeGraphs(tiny.model, tiny.cache, 37, tiny.cache.scratch_slot)
    keys = set(dg.keys())
    rng = random.Random(0)
    for _ in range(500):
        n, top = rng.randint(1, 37), rng.randint(0, tiny.cache.max_len - 1)
        key = (bucket(n, dg.batch_buckets), bucket(top + 1, dg.length_buckets), rng.choice(dg.kinds()))
        assert key in keys
    assert len(keys) == len(dg.kinds()) * len(dg.batch_buckets) * len(dg.length_buckets)
    # the device sampler's kinds are warmed where it is on, and only there
    assert set(dg.kinds()) == ({"tokens", "logits", "sample", "sample_lp"} if dg.sampler is not None
                               else {"tokens", "logits"})


def test_warm_up_captures_every_key_then_runs_its_requests(tiny, fused, monkeypatch):
    dg = DecodeGraphs(tiny.model, tiny.cache, 4, tiny.cache.scratch_slot)
    pg = PrefillGraphs(fused, tiny.cache, None, max_tokens=512)
    captured = []
    monkeypatch.setattr(DecodeGraphs, "_capture", lambda self, *k: captured.append(("decode", *k)))
    monkeypatch.setattr(PrefillGraphs, "_capture", lambda self, *k: captured.append(("prefill", *k)))
    monkeypatch.setattr(tiny.runner, "graphs", dg)
    monkeypatch.setattr(tiny.runner, "prefill_graphs", pg)
    ran = []
    monkeypatch.setattr("pegainfer.engine.warmup.run_requests", lambda engine, admits, *a: ran.append(admits))
    report = warm_up(tiny, max_prefill_tokens=512)
    assert captured == [("decode", *k) for k in dg.keys()] + [("prefill", *k) for k in pg.keys()]
    assert report.decode_keys == tuple(dg.keys()) and report.prefill_keys == tuple(pg.keys())
    assert len(ran) == 1 and report.requests == len(ran[0]) == 1  # no Triton here: one greedy request


def test_with_the_triton_kernels_the_requests_cover_every_top_n_and_the_chunked_path(tiny, fused, monkeypatch):
    monkeypatch.setattr(tiny, "model", fused)
    batches = warm_requests(tiny, max_prefill_tokens=512)
    tops = {(b[0].sampling.logprobs, b[0].sampling.presence_penalty) for b in batches[1:]}
    assert tops == {(k, p) for k in (None, *range(MAX_LOGPROBS + 1)) for p in (0.0, 0.5)}
    assert all(len(b) == 1 for b in batches[1:])  # each its own batch: its top-N is the batch's largest
    first = {a.request_id: a for a in batches[0]}
    assert len(first["warmup-long"].prompt_ids) == 612 and first["warmup-sampled"].n == 2
    assert {len(a.prompt_ids) for k, a in first.items() if k.startswith("warmup-echo")} == {1, 17, 32, 40}


def test_warm_up_requests_run_and_give_their_slots_back(tiny):
    report = warm_up(tiny)  # the CPU engine: no graphs, one request
    assert report.decode_keys == report.prefill_keys == () and report.requests == 1
    assert tiny.cache.free_slots == tiny.cache.num_slots


def test_with_the_fixed_plan_one_length_bucket_gives_every_bound_the_same_bits(tiny, fused, triton_interpreter):
    """Batch-invariant fused decode: the decode graphs keep one attention-length bucket (max_len), since
    the fixed split plan gives a row the same bits under any bound (a split past its length stores
    nothing the merge reads); the other forms keep one bucket per doubling."""
    from pegainfer.engine.model.decode import decode_logits
    from pegainfer.engine.model.inputs import DecodeInputs
    cache = tiny.cache
    assert DecodeGraphs(fused, cache, 4, cache.scratch_slot).length_buckets == [cache.max_len]
    assert len(DecodeGraphs(tiny.model, cache, 4, cache.scratch_slot).length_buckets) > 1
    prompt = [(11 * i + 5) % 1000 for i in range(40)]
    slot = cache.allocate(64)
    try:
        fused.forward(Batch.build([RowInput(slot, prompt, 0, prompt=True)], "cpu"), cache)

        def step(bound: int) -> torch.Tensor:
            t = lambda v: torch.tensor([v], dtype=torch.int64)  # noqa: E731
            return decode_logits(fused, DecodeInputs(t(7), t(40), t(slot), t(41), bound), cache)
        assert torch.equal(step(64), step(cache.max_len))
        assert torch.equal(step(256), step(cache.max_len))
    finally:
        cache.release(slot)
