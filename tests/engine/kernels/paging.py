"""A slot-shaped test cache [S, N, W] laid out as the paged cache holds it (engine/kv_cache.py): its
pages scattered over a pool in a random order, a page table [S, N / P] naming them, and the pool's
last page the scratch page, so a kernel reading through the table must find the slot's positions
wherever its pages went, and a write through it can be read back as slots."""
from __future__ import annotations

import torch

_gen = torch.Generator().manual_seed(1234)


def paged(cache: torch.Tensor, page: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(pages [S * N/P + 1, P, W], table [S, N/P] int32): cache's rows on scrambled pages."""
    s, n, w = cache.shape
    per = -(-n // page)
    padded = cache.new_zeros(s, per * page, w)
    padded[:, :n] = cache
    perm = torch.randperm(s * per, generator=_gen).to(cache.device)
    pages = cache.new_zeros(s * per + 1, page, w)
    pages[perm] = padded.view(s * per, page, w)
    return pages, perm.view(s, per).to(torch.int32)


def unpaged(pages: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """The slot-shaped view back: [S, N, W]."""
    s, per = table.shape
    return pages[table.long()].reshape(s, per * pages.shape[1], pages.shape[2])[:, :n]
