"""The paged cache's capacity: tokens sized from free memory (or --kv-cache-tokens), sequences capped by
--max-active, a context that cannot fit once is a clear error; the page pool's reference counts and
prefix cache (engine/kv_pages.py), the cache's slots and page table (engine/kv_cache.py) and the
batcher's view of them (PagedCapacity)."""
from __future__ import annotations

import pytest
import torch

from pegainfer.engine.contract import Admit, SamplingParams
from pegainfer.engine.kv_cache import PAGE_SIZE, CacheFull, MLACache
from pegainfer.engine.kv_capacity import (
    CPU_DEFAULT_SLOTS,
    MAX_AUTO_SLOTS,
    RESERVE_BYTES,
    CapacityError,
    PagedCapacity,
    kv_tokens,
    max_new_tokens,
    max_sequences,
    request_pages,
    tokens_that_fit,
)
from pegainfer.engine.kv_pages import PagePool, page_digests
from tests.engine.fake_engine import FakeEngine

LITE_BYTES_PER_TOKEN = 27 * 576 * 2  # layers x (512 latent + 64 rope) x bf16


def test_lite_on_an_h200_after_weights():
    free = 83 << 30  # what the issue measured free after the weights
    tokens = tokens_that_fit(free, 4096, LITE_BYTES_PER_TOKEN, PAGE_SIZE)
    assert tokens % PAGE_SIZE == 0 and 2_000_000 < tokens < 2_700_000  # ≈2.4 M tokens of latent
    assert (tokens + PAGE_SIZE) * LITE_BYTES_PER_TOKEN <= free * 0.9 - RESERVE_BYTES
    # the same tokens at any context limit: 131072-token requests no longer reserve 131072 each
    assert tokens_that_fit(free, 131072, LITE_BYTES_PER_TOKEN, PAGE_SIZE) == tokens


def test_nothing_fits_is_a_clear_error():
    with pytest.raises(CapacityError, match="--max-model-len"):
        tokens_that_fit(RESERVE_BYTES, 4096, LITE_BYTES_PER_TOKEN, PAGE_SIZE)
    with pytest.raises(CapacityError, match="one page"):
        kv_tokens(torch.device("cpu"), 4096, 100, PAGE_SIZE, requested=PAGE_SIZE - 1)


def test_defaults_and_the_flags():
    cpu = torch.device("cpu")
    assert kv_tokens(cpu, 4096, 100, PAGE_SIZE, None) == (CPU_DEFAULT_SLOTS * 4096, None)
    assert kv_tokens(cpu, 100, 100, PAGE_SIZE, None, slots=12) == (12 * 128, None)  # a whole context each
    assert kv_tokens(cpu, 4096, 100, PAGE_SIZE, requested=1000) == (960, None)  # whole pages
    assert max_sequences(cpu, None) == CPU_DEFAULT_SLOTS and max_sequences(torch.device("cuda"), None) == MAX_AUTO_SLOTS
    assert max_sequences(torch.device("cuda"), 3) == 3 and MAX_AUTO_SLOTS >= 1024


def test_request_pages_counts_shared_prompt_pages_once():
    assert request_pages(100, 28, 1, 64) == 2
    assert request_pages(130, 10, 3, 64) == 2 + 3 * 1  # two full prompt pages shared, one own page each
    assert request_pages(128, 1, 2, 64) == 2 + 2 * 1


def test_max_new_tokens_is_the_largest_request_that_fits_alone():
    for plen, n, pages in [(100, 1, 6), (130, 3, 8), (64, 2, 5), (10, 1, 1), (300, 1, 4)]:
        m = max_new_tokens(plen, n, pages, 64)
        if m >= 1:
            assert request_pages(plen, m, n, 64) <= pages < request_pages(plen, m + 1, n, 64)
        else:  # not even the prompt and one token
            assert request_pages(plen, 1, n, 64) > pages


def test_pool_takes_releases_and_refuses_without_side_effects():
    pool = PagePool(4)
    a = pool.take(3)
    assert sorted(a) == [0, 1, 2] and pool.available == 1 and pool.used == 3
    assert pool.take(2) is None and pool.available == 1  # nothing taken
    pool.retain(a[0])
    pool.release(a[0])
    assert pool.used == 3  # still referenced once
    for p in a:
        pool.release(p)
    assert pool.available == 4 and pool.used == 0
    with pytest.raises(ValueError, match="released twice"):
        pool.release(a[0])
    with pytest.raises(ValueError, match="free"):
        pool.retain(a[0])
    pool.check()


def test_prefix_cache_keeps_released_full_pages_until_evicted_lru_first():
    pool = PagePool(3, caching=True)
    d = page_digests(list(range(40)), 8)  # 5 full pages of 8
    assert len(d) == 5 and len(set(d)) == 5
    assert page_digests([7] + list(range(1, 40)), 8)[4] != d[4]  # a digest names the whole prefix
    a, b = pool.take(2)
    pool.register(a, d[0])
    pool.register(b, d[1])
    pool.release(a)
    pool.release(b)
    assert pool.available == 3 and pool.cached == 2
    assert pool.match(d[:3]) == [a, b] and pool.used == 2  # retained; the third digest is unknown
    pool.release(b)
    pool.release(a)  # a is now the most recently released
    (c,) = pool.take(1)
    assert c not in (a, b) and pool.cached == 2  # the free page first
    (e,) = pool.take(1)
    assert e == b and pool.cached == 1  # then the least recently released cached page, evicted
    assert pool.match(d[:2]) == [a]  # the chain breaks where b was evicted
    pool.check()


def test_cache_slots_grow_page_by_page_through_the_table():
    cache = MLACache(2, 3, 40, 4, "cpu", torch.float32, num_pages=6, page_size=8)
    s = cache.take_slot()
    assert cache.extend(s, 9) and cache.slot_pages[s] == cache.table[s, :2].tolist()
    assert cache.table[s, 2:].eq(cache.scratch_page).all()  # unset entries: the scratch page
    values = torch.arange(9 * 4, dtype=torch.float32).view(9, 4)
    cache.write(1, torch.full((9,), s), torch.arange(9), values)
    assert torch.equal(cache.read(1, s, 9), values) and torch.equal(cache.read_rows(1, torch.tensor([s]), 9)[0], values)
    t = cache.allocate(24)
    assert len(cache.slot_pages[t]) == 3 and cache.pool.available == 1
    assert not cache.extend(s, 40) and len(cache.slot_pages[s]) == 2  # 3 more pages > the 1 free: none taken
    with pytest.raises(CacheFull):
        cache.allocate(16)
    assert cache.free_slots == 1  # the refused slot went back
    cache.release(s)
    cache.release(t)
    assert cache.pool.available == 6 and cache.free_slots == 3
    cache.pool.check()


def _seq(eng: FakeEngine, rid: str, prompt: list[int], n: int = 1, **kw):
    return eng.sequence(Admit(rid, prompt, 4, n=n, sampling=SamplingParams(**kw)))


def test_admission_counts_prompt_pages_forks_share_full_ones():
    eng = FakeEngine(slots=8, kv_tokens=8 * 8, page_size=8)  # 8 pages, watermark 1
    cap = PagedCapacity(eng.cache)
    seq = _seq(eng, "a", list(range(1, 21)), n=3)  # 20 tokens: 2 full pages + a partial one
    assert cap.needs(seq) == 3 + 2 and cap.fits(seq)
    cap.take(seq)
    pages = eng.cache.slot_pages
    for f in seq.forks:  # the full pages shared, the partial last one their own
        assert pages[f.slot][:2] == pages[seq.slot][:2] and pages[f.slot][2] != pages[seq.slot][2]
        assert f.room == 24
    assert cap.pages_used == 5 and cap.used == 3
    other = _seq(eng, "b", [1] * 17)  # 3 pages + the watermark: 4 > 3 available
    assert not cap.fits(other)
    for s in (seq, *seq.forks):
        cap.release(s)
    assert cap.pages_used == 0 and cap.used == 0 and cap.fits(other)
    eng.cache.pool.check()


def test_prefix_hits_leave_a_token_to_compute_and_skip_prompt_logprob_requests():
    eng = FakeEngine(slots=4, kv_tokens=16 * 8, page_size=8, prefix_caching=True)
    cap = PagedCapacity(eng.cache)
    prompt = list(range(1, 25))  # exactly 3 pages
    first = _seq(eng, "a", prompt)
    cap.take(first)
    assert first.cached == 0 and cap.prefix_queries == 24 and cap.prefix_hits == 0
    cap.written(first, 24)
    cap.release(first)
    again = _seq(eng, "b", prompt)
    cap.take(again)
    assert again.cached == 16 and cap.prefix_hits == 16  # 2 pages: the last token still runs
    echo = _seq(eng, "c", prompt, prompt_logprobs=1)
    cap.take(echo)
    assert echo.cached == 0  # every prompt position's log-prob needs computing
    eng.cache.pool.check()


def test_the_split_attentions_partials_are_kept_out_of_the_kv_cache():
    import dataclasses

    from pegainfer.engine.config import ModelConfig
    from pegainfer.engine.engine import split_partials
    from pegainfer.engine.kernels.config import KernelConfig
    from pegainfer.engine.presets import PRESETS
    cfg = ModelConfig.from_dict(PRESETS["lite"])
    k = KernelConfig()
    # 1,024 rows of 64 splits (16k tokens of context and more), 16 heads x (512 + 2) float32 each
    assert split_partials(k, cfg, 1024, 16384) == 1024 * 64 * 16 * 514 * 4
    assert split_partials(k, cfg, 1024, 4096) == 1024 * 16 * 16 * 514 * 4  # 256-key splits: 16 a row
    # with the first merge level (groups of 8 of a long row's 64 splits): 8 group partials a row more;
    # a bound that allows no long row (2,048 keys: 8 splits of 256) launches none
    grouped = dataclasses.replace(k, decode_merge_group=8)
    assert split_partials(grouped, cfg, 1024, 16384) == 1024 * (64 + 8) * 16 * 514 * 4
    assert split_partials(grouped, cfg, 1024, 2048) == split_partials(k, cfg, 1024, 2048) == 1024 * 8 * 16 * 514 * 4
    assert split_partials(dataclasses.replace(k, decode_merge_group=32), cfg, 1, 4096) == (16 + 8) * 16 * 514 * 4
    assert split_partials(dataclasses.replace(k, batch_invariant=False), cfg, 1024, 16384) == 0
    assert split_partials(dataclasses.replace(k, triton=False), cfg, 1024, 16384) == 0
    free = 83 << 30
    extra = split_partials(k, cfg, 1024, 16384)
    fewer = tokens_that_fit(free, 16384, LITE_BYTES_PER_TOKEN, PAGE_SIZE, extra)
    assert fewer < tokens_that_fit(free, 16384, LITE_BYTES_PER_TOKEN, PAGE_SIZE)
    assert (fewer + PAGE_SIZE) * LITE_BYTES_PER_TOKEN <= free * 0.9 - RESERVE_BYTES - extra
