"""The paged MLA KV cache: per layer, pages of PAGE_SIZE positions of the normalised 512-wide latent
and the 64-wide roped shared key (576 values; not full K/V), and a page table.

A sequence holds a slot: a row of the page table [S+1, max_len / P] (int32, on the device), whose
entry i names the page holding its positions i*P .. i*P + P - 1. Slots are cheap (a table row);
pages are the memory, taken from engine/kv_pages.py's pool as a sequence grows and released when it
ends. Every reader and writer goes through the table: the torch paths gather (write, read,
read_rows), the Triton decode kernels load one table entry per block of keys. Table entries nobody
set point at a scratch page, as does the whole scratch slot that CUDA-graph padding rows write to.

The host keeps each slot's pages (slot_pages); table changes are queued and reach the device at
`flush()`, which the runner calls before each step (one small asynchronous copy when anything
changed), so the steps already queued on the stream read the table they were launched with. On the
CPU the table is written at once."""
from __future__ import annotations

import torch

from pegainfer.engine.kv_pages import PagePool

PAGE_SIZE = 64  # tokens per page: a multiple of the decode kernel's block of keys (32)


class CacheFull(RuntimeError):
    pass


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class MLACache:
    """num_slots sequences at once, num_pages pages of page_size positions. num_pages None: enough
    for every slot to hold max_len at once (what tools and tests that take whole slots expect)."""

    def __init__(self, num_layers: int, num_slots: int, max_len: int, width: int,
                 device: torch.device | str, dtype: torch.dtype, *, num_pages: int | None = None,
                 page_size: int = PAGE_SIZE, prefix_caching: bool = False):
        self.max_len = max_len
        self.num_slots = num_slots
        self.page_size = page_size
        self.pages_per_seq = cdiv(max_len, page_size)
        self.num_pages = num_slots * self.pages_per_seq if num_pages is None else num_pages
        self.scratch_slot = num_slots  # never allocated: padding rows of a CUDA-graph batch
        self.scratch_page = self.num_pages  # the scratch slot's pages, and every unset entry
        self.pool = PagePool(self.num_pages, prefix_caching)
        self.data = torch.zeros(num_layers, self.num_pages + 1, page_size, width, device=device,
                                dtype=dtype)  # [L, pages+1, P, W]
        self.table = torch.full((num_slots + 1, self.pages_per_seq), self.scratch_page, dtype=torch.int32,
                                device=device)  # [S+1, max pages per sequence]
        self.slot_pages: list[list[int]] = [[] for _ in range(num_slots)]
        self._free = list(range(num_slots - 1, -1, -1))
        self._pending: list[tuple[int, int, int]] = []  # (slot, index, page) not on the device yet
        self._on_cuda = self.data.device.type == "cuda"

    # ---- slots and pages ------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def take_slot(self) -> int:
        if not self._free:
            raise CacheFull(f"all {self.num_slots} KV slots are in use")
        return self._free.pop()

    def allocate(self, tokens: int | None = None) -> int:
        """A slot with pages for its first `tokens` positions (default max_len): the whole-slot
        interface of tools and tests. CacheFull if the slots or the pages run out."""
        slot = self.take_slot()
        if not self.extend(slot, self.max_len if tokens is None else tokens):
            self._free.append(slot)
            raise CacheFull(f"{tokens or self.max_len} tokens need more than the {self.pool.available} free KV pages")
        self.flush()
        return slot

    def release(self, slot: int) -> None:
        """The slot and its page references are free again."""
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise ValueError(f"KV slot {slot} released twice or out of range")
        for page in self.slot_pages[slot]:
            self.pool.release(page)
        self.slot_pages[slot] = []
        self._free.append(slot)

    def extend(self, slot: int, tokens: int) -> bool:
        """Fresh pages so that the slot covers its first `tokens` positions; False (taking nothing) if
        the pool has too few."""
        held = self.slot_pages[slot]
        n = cdiv(tokens, self.page_size) - len(held)
        if n <= 0:
            return True
        pages = self.pool.take(n)
        if pages is None:
            return False
        self._append(slot, pages)
        return True

    def attach(self, slot: int, pages: list[int], retain: bool = True) -> None:
        """Append pages already held elsewhere (a shared prompt's full pages) to the slot's table."""
        if retain:
            for p in pages:
                self.pool.retain(p)
        self._append(slot, pages)

    def _append(self, slot: int, pages: list[int]) -> None:
        held = self.slot_pages[slot]
        if len(held) + len(pages) > self.pages_per_seq:
            raise ValueError(f"slot {slot} would hold more than max_len ({self.max_len}) positions")
        if self._on_cuda:
            self._pending += [(slot, len(held) + i, p) for i, p in enumerate(pages)]
        else:  # the CPU's table is the host's: written at once
            self.table[slot, len(held):len(held) + len(pages)] = torch.tensor(pages, dtype=torch.int32)
        held += pages

    def flush(self) -> None:
        """The queued table changes, on the device (stream-ordered after the steps already launched)."""
        if not self._pending:
            return
        upd = torch.tensor(self._pending, dtype=torch.int64)  # [U, 3]
        self._pending = []
        if self._on_cuda:
            upd = upd.pin_memory().to(self.table.device, non_blocking=True)
        self.table[upd[:, 0], upd[:, 1]] = upd[:, 2].to(torch.int32)

    def copy_prefix(self, src: int, dst: tuple[int, ...], length: int) -> None:
        """Give slots `dst` the first `length` positions of slot `src` (n-choice forks): pages they
        share are skipped, the others (the prompt's partial last page) are copied in all layers."""
        n = cdiv(length, self.page_size)
        frm, to = [], []
        for d in dst:
            for a, b in zip(self.slot_pages[src][:n], self.slot_pages[d][:n]):
                if a != b:
                    frm.append(a)
                    to.append(b)
        if frm:
            dev = self.data.device
            self.data[:, torch.tensor(to, device=dev)] = self.data[:, torch.tensor(frm, device=dev)]

    # ---- the torch paths' reads and writes (graph-safe: device gathers through the table) -------
    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, values: torch.Tensor) -> None:
        """slots, positions: [T]; values: [T, W]."""
        pages = self.table[slots, positions // self.page_size]  # [T]
        self.data[layer, pages.long(), positions % self.page_size] = values.to(self.data.dtype)

    def read(self, layer: int, slot: int, length: int) -> torch.Tensor:
        pages = self.table[slot, :cdiv(length, self.page_size)].long()
        return self.data[layer, pages].flatten(0, 1)[:length]  # [length, W]

    def read_rows(self, layer: int, slots: torch.Tensor, length: int) -> torch.Tensor:
        pages = self.table[slots, :cdiv(length, self.page_size)].long()  # [R, n]
        return self.data[layer, pages].flatten(1, 2)[:, :length]  # [R, length, W]

    @staticmethod
    def bytes_per_token(num_layers: int, width: int, dtype: torch.dtype) -> int:
        return num_layers * width * torch.empty(0, dtype=dtype).element_size()
