"""The KV cache's page pool: which pages of P tokens are free, who references each page, and the
prefix cache over full prompt pages.

A page is referenced by every sequence whose page table holds it (the choices of one request share
their prompt's full pages). A page whose count drops to zero goes back to the free list, or, when it
holds a full page of some prompt (prefix caching), to an LRU of unreferenced cached pages: a later
prompt with the same tokens up to the end of that page takes it again instead of recomputing it.
Taking a page prefers the free list and evicts the least recently released cached page only when
the free list is empty, so `available` (free + evictable) is what admission may count on.

A full page is known by a chain digest: blake2b over the digest of the page before it and the page's
own token ids, so a digest names the whole prefix up to the end of its page (vLLM's block hashes).
Pages hold the latents of tokens computed as a prompt from position 0; the batch-invariant kernels
(issue 26) make them the same bits whoever computed them, so a hit changes no output."""
from __future__ import annotations

import collections
import hashlib
from array import array


def page_digests(token_ids: list[int], page_size: int, count: int | None = None) -> list[bytes]:
    """The chain digests of the full pages of token_ids (at most `count`)."""
    full = len(token_ids) // page_size
    if count is not None:
        full = min(full, count)
    out, prev = [], b""
    for i in range(full):
        h = hashlib.blake2b(prev, digest_size=16)
        h.update(array("q", token_ids[i * page_size:(i + 1) * page_size]).tobytes())
        prev = h.digest()
        out.append(prev)
    return out


class PagePool:
    """num_pages pages, reference counted; caching: keep released full prompt pages for reuse."""

    def __init__(self, num_pages: int, caching: bool = False):
        self.num_pages = num_pages
        self.caching = caching
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: page 0 is taken first
        self.refs = [0] * num_pages
        self._digest: list[bytes | None] = [None] * num_pages
        self._by_digest: dict[bytes, int] = {}
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # unreferenced cached pages

    @property
    def available(self) -> int:
        """Pages a request may take: free ones and unreferenced cached ones (evicted on demand)."""
        return len(self._free) + len(self._lru)

    @property
    def used(self) -> int:
        """Pages some sequence references."""
        return self.num_pages - self.available

    @property
    def cached(self) -> int:
        """Pages holding a registered prompt prefix (referenced or not)."""
        return len(self._by_digest)

    def take(self, n: int) -> list[int] | None:
        """n fresh pages (referenced once each), or None, taking nothing, if fewer are available."""
        if n > self.available:
            return None
        out = []
        for _ in range(n):
            if self._free:
                page = self._free.pop()
            else:  # evict the least recently released cached page
                page, _ = self._lru.popitem(last=False)
                del self._by_digest[self._digest[page]]
                self._digest[page] = None
            self.refs[page] = 1
            out.append(page)
        return out

    def retain(self, page: int) -> None:
        """One more reference to a page already held (or cached and unreferenced)."""
        if self.refs[page] == 0:
            if page not in self._lru:
                raise ValueError(f"KV page {page} is free: it cannot be shared")
            del self._lru[page]
        self.refs[page] += 1

    def release(self, page: int) -> None:
        """One reference fewer; at zero the page is free again (or cached, when it holds a prefix)."""
        if not 0 <= page < self.num_pages or self.refs[page] <= 0:
            raise ValueError(f"KV page {page} released twice or out of range")
        self.refs[page] -= 1
        if self.refs[page] == 0:
            if self._digest[page] is not None:
                self._lru[page] = None
            else:
                self._free.append(page)

    def register(self, page: int, digest: bytes) -> None:
        """The page now holds the full prompt page named by digest (a held page; a digest already
        registered keeps its first page)."""
        if self.caching and digest not in self._by_digest and self._digest[page] is None:
            self._by_digest[digest] = page
            self._digest[page] = digest

    def match(self, digests: list[bytes]) -> list[int]:
        """The cached pages of the longest prefix of `digests`, each retained."""
        out = []
        for d in digests:
            page = self._by_digest.get(d)
            if page is None:
                break
            self.retain(page)
            out.append(page)
        return out

    def check(self) -> None:
        """The pool's invariants (tests): every page free, cached-unreferenced or referenced, once."""
        free, lru = set(self._free), set(self._lru)
        assert len(free) == len(self._free) and not free & lru
        for p in range(self.num_pages):
            assert (self.refs[p] == 0) == (p in free or p in lru), p
            assert (p in lru) <= (self._digest[p] is not None), p
        assert all(self._digest[p] == d for d, p in self._by_digest.items())
