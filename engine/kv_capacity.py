"""KV capacity: how many tokens the paged latent cache holds (on CUDA sized from the memory left after
the weights, minus a reserve for activations and CUDA graphs, unless --kv-cache-tokens says; on the
CPU a small default), how many sequences may hold a slot at once (--max-active, default the largest
decode graph bucket), and the batcher's view of the pages while serving (PagedCapacity).

Admission counts pages, not slots: a waiting request is admitted when its prompt's pages (and a copy
of the partial last page per extra choice) fit beside a small watermark; its decode pages are taken
as it grows (grow); when none is left the batcher preempts the newest sequences (engine/batcher.py).
With prefix caching, a prompt's full pages already cached are shared (take), and the pages a prompt
fills are offered to the cache as they are computed (written)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pegainfer.engine.kv_cache import cdiv
from pegainfer.engine.kv_pages import page_digests

if TYPE_CHECKING:
    from pegainfer.engine.kv_cache import MLACache
    from pegainfer.engine.sequence import Sequence

CPU_DEFAULT_SLOTS = 8
MAX_AUTO_SLOTS = 1024  # the largest CUDA-graph batch bucket (engine/cuda_graphs.py)
RESERVE_BYTES = 6 << 30  # activations, graph pools, the packed-prefill masks
USABLE_FRACTION = 0.9
WATERMARK = 0.01  # admission leaves this fraction of the pages free while anything runs


class CapacityError(ValueError):
    """Not even one request of the configured context fits in memory."""


def tokens_that_fit(free_bytes: int, max_len: int, bytes_per_token: int, page_size: int, extra: int = 0) -> int:
    """Tokens (whole pages) of latent cache that fit in free_bytes, one scratch page kept aside; extra:
    bytes reserved beside RESERVE_BYTES (the split attention's partials at the largest decode graph)."""
    usable = int(free_bytes * USABLE_FRACTION) - RESERVE_BYTES - extra
    pages = usable // (page_size * bytes_per_token) - 1
    if pages * page_size < max_len:
        raise CapacityError(f"the KV cache for one request of {max_len} tokens needs "
                            f"{max_len * bytes_per_token / 2**30:.2f} GiB; {free_bytes / 2**30:.1f} GiB are free after "
                            f"the weights — lower --max-model-len")
    return pages * page_size


def kv_tokens(device: torch.device, max_len: int, bytes_per_token: int, page_size: int,
              requested: int | None, slots: int = 0, extra: int = 0) -> tuple[int, int | None]:
    """(cache tokens, a multiple of page_size; free bytes seen or None). requested: --kv-cache-tokens;
    slots: the sequences that may hold pages at once (on the CPU the default holds a whole context
    for each of them, and for at least CPU_DEFAULT_SLOTS); extra: tokens_that_fit's."""
    if requested is not None:
        if requested < page_size:
            raise CapacityError(f"--kv-cache-tokens {requested} is less than one page ({page_size} tokens)")
        return requested // page_size * page_size, None
    if device.type != "cuda":
        return max(CPU_DEFAULT_SLOTS, slots) * cdiv(max_len, page_size) * page_size, None
    free, _total = torch.cuda.mem_get_info(device)
    return tokens_that_fit(free, max_len, bytes_per_token, page_size, extra), free


def max_sequences(device: torch.device, cap: int | None) -> int:
    """Sequences that may hold a slot at once: --max-active, else the CPU's default or the largest
    decode graph bucket."""
    if cap is not None:
        return cap
    return CPU_DEFAULT_SLOTS if device.type != "cuda" else MAX_AUTO_SLOTS


def request_pages(prompt_len: int, max_tokens: int, n: int, page_size: int) -> int:
    """The most pages one request ever holds: its prompt's full pages once (the choices share them),
    and each choice's own pages to the end of its context."""
    full = prompt_len // page_size
    return full + n * (cdiv(prompt_len + max_tokens, page_size) - full)


def max_new_tokens(prompt_len: int, n: int, num_pages: int, page_size: int) -> int:
    """The most tokens each of n choices may generate after the prompt with the request alone in a
    cache of num_pages (request_pages within it); below 1: not even one fits."""
    full = prompt_len // page_size
    return ((num_pages - full) // n + full) * page_size - prompt_len


class PagedCapacity:
    """The batcher's view of the cache: slots and pages for sequences, the prefix cache's counts."""

    def __init__(self, cache: MLACache):
        self.cache = cache
        self.pool = cache.pool
        self.page = cache.page_size
        self.watermark = max(1, int(cache.num_pages * WATERMARK))
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found there

    def needs(self, seq: Sequence) -> int:
        """Pages the request takes at admission: its prompt, a partial last page per extra choice."""
        plen = len(seq.prompt_ids)
        return cdiv(plen, self.page) + (len(seq.forks) if plen % self.page else 0)

    def fits(self, seq: Sequence) -> bool:
        """Room for a waiting request: a slot per choice, its prompt's pages, and (while other
        sequences hold pages) the watermark beside them."""
        c = self.cache
        if c.free_slots <= len(seq.forks):
            return False
        busy = c.free_slots < c.num_slots
        return self.needs(seq) + (self.watermark if busy else 0) <= self.pool.available

    def take(self, seq: Sequence) -> None:
        """Slots and prompt pages for the request's first sequence and its siblings (those share its
        full prompt pages); the prompt's cached prefix pages, when prefix caching finds them (never
        for a request that wants prompt log-probs: those need every position computed). Sets each
        sequence's slot and room, and the first one's cached count."""
        c, page = self.cache, self.page
        plen = len(seq.prompt_ids)
        seq.slot = c.take_slot()
        hits: list[int] = []
        if self.pool.caching:
            if seq.digests is None:
                seq.digests = page_digests(seq.prompt_ids, page)
            if seq.sampling.prompt_logprobs is None:  # at least the prompt's last token is left to run
                hits = self.pool.match(seq.digests[:(plen - 1) // page])
            if seq.preemptions == 0:  # a resumed sequence's lookup is not a client's query
                self.prefix_queries += plen
                self.prefix_hits += len(hits) * page
            c.attach(seq.slot, hits, retain=False)
        if not c.extend(seq.slot, plen):
            raise RuntimeError("admission took more KV pages than fits() counted")  # a bug, not a user's error
        seq.registered = len(hits)
        seq.cached = len(hits) * page
        seq.room = len(c.slot_pages[seq.slot]) * page
        shared = c.slot_pages[seq.slot][:plen // page]
        for f in seq.forks:
            f.slot = c.take_slot()
            c.attach(f.slot, shared)
            if not c.extend(f.slot, plen):
                raise RuntimeError("admission took more KV pages than fits() counted")
            f.room = seq.room

    def grow(self, seq: Sequence, end: int) -> bool:
        """Pages so that seq covers positions [0, end); False (taking none) if too few are free."""
        if not self.cache.extend(seq.slot, end):
            return False
        seq.room = len(self.cache.slot_pages[seq.slot]) * self.page
        return True

    def written(self, seq: Sequence, end: int) -> None:
        """The step being planned writes seq's prompt up to `end`: its full pages go to the prefix
        cache (a later admission, after this step, may share them)."""
        if seq.digests is None:
            return
        full = min(end // self.page, len(seq.digests))
        pages = self.cache.slot_pages[seq.slot]
        for i in range(seq.registered, full):
            self.pool.register(pages[i], seq.digests[i])
        seq.registered = max(seq.registered, full)

    def release(self, seq: Sequence) -> None:
        """One sequence ended, was dropped or preempted: its slot and page references are free."""
        self.cache.release(seq.slot)
        seq.slot, seq.room, seq.registered = -1, 0, 0

    @property
    def used(self) -> int:
        """Slots held now (the step record's kv_slots_used)."""
        return self.cache.num_slots - self.cache.free_slots

    @property
    def pages_used(self) -> int:
        return self.pool.used

    @property
    def available(self) -> int:
        """Pages a sequence may still take (free, or cached and unreferenced)."""
        return self.pool.available

    @property
    def caching(self) -> bool:
        return self.pool.caching
