"""The batch-invariant split attention's rule (engine/kernels/mla_fixed.py): how many keys a split of a
row takes, from the row's own length only, and the bounds that follow from it. Shared by the split,
merge and group kernels (mla_fixed.py, mla_group.py) and the Python side that sizes their buffers."""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.kernels.mla_decode import BLOCK_N


@triton.jit
def split_keys(length, SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr, LONG: tl.constexpr, MOST: tl.constexpr):
    # keys per split of a row `length` long (own_split)
    keys = SPLIT * tl.maximum(tl.cdiv(tl.cdiv(length, SPLIT), MAX_SPLITS), 1)
    if LONG > 0:
        keys = tl.maximum(tl.minimum(keys, LONG), SPLIT * tl.cdiv(tl.cdiv(length, SPLIT), MOST))
    return keys


class SplitRule(NamedTuple):
    """The fixed plan's knobs (KernelConfig: decode_split_len, decode_max_splits, decode_long_split,
    decode_most_splits); long_split 0: at most max_splits splits at every length."""
    split_len: int
    max_splits: int
    long_split: int = 0
    most_splits: int = 0

    def constexprs(self) -> dict:
        return dict(SPLIT=self.split_len, MAX_SPLITS=self.max_splits, LONG=self.long_split, MOST=self.most_splits)


def rule_of(kernels: KernelConfig) -> SplitRule:
    """The rule a KernelConfig sets (decode_split_len, decode_max_splits, decode_long_split,
    decode_most_splits)."""
    return SplitRule(kernels.decode_split_len, kernels.decode_max_splits, kernels.decode_long_split,
                     kernels.decode_most_splits)


class SplitPlan(NamedTuple):
    """A step's work list (one per step, shared by its layers): off [B] int32 each row's first item,
    items [bound] int32 (row << 16 | split), total [1] int32; most: the most splits a row under the
    step's static length has (fixed_splits); groups: the first merge level's group size and list where
    it runs ((group, *work_list's (off, items, total, bound) over groups), mla_group.py), else None."""
    off: torch.Tensor
    items: torch.Tensor
    total: torch.Tensor
    most: int
    groups: tuple | None = None

    @property
    def bound(self) -> int:
        """B x most: the items' room (and the partials')."""
        return self.off.shape[0] * self.most


def own_split(length: int, rule: SplitRule) -> int:
    """Keys per split of a row `length` long (the kernels' split_keys): a function of its own length."""
    keys = rule.split_len * max(triton.cdiv(triton.cdiv(length, rule.split_len), rule.max_splits), 1)
    if rule.long_split > 0:
        keys = max(min(keys, rule.long_split),
                   rule.split_len * triton.cdiv(triton.cdiv(length, rule.split_len), rule.most_splits))
    return keys


def fixed_splits(length: int, rule: SplitRule) -> int:
    """The most splits a row of at most `length` keys has (every such row's own count is at most this)."""
    short = min(rule.max_splits, triton.cdiv(length, rule.split_len))
    if rule.long_split <= 0:
        return short
    return min(triton.cdiv(length, rule.split_len),
               max(rule.max_splits, min(rule.most_splits, triton.cdiv(length, rule.long_split))))


def partial_bytes(rows: int, length: int, heads: int, rank: int, rule: SplitRule, group: int = 0) -> int:
    """Bytes of one call's float32 partials at `rows` rows under the static bound `length`, with a
    first merge level's group partials where group > 0 and a row can be long: what the largest decode
    graph's pool holds for them (engine/kv_capacity.py keeps it out of the KV cache)."""
    most = fixed_splits(length, rule)
    items = most + (list_bound(most, rule, group) if group > 0 and most > rule.max_splits else 0)
    return rows * items * heads * (rank + 2) * 4


def check_rule(rule: SplitRule) -> None:
    if rule.split_len % BLOCK_N or rule.max_splits < 1:
        raise ValueError(f"split length {rule.split_len} must be a multiple of {BLOCK_N}, max_splits >= 1")
    if rule.long_split and (rule.long_split % rule.split_len or rule.most_splits < rule.max_splits):
        raise ValueError(f"long_split {rule.long_split} must be a multiple of the split length {rule.split_len} "
                         f"and most_splits ({rule.most_splits}) at least max_splits ({rule.max_splits})")


@triton.jit
def row_splits(length, n_most, SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr, LONG: tl.constexpr,
               MOST: tl.constexpr):
    # a row's split count (own_split's), cut to n_most, the most of the step's static bound (a row
    # longer than the bound, which the engine never sends, is cut rather than written past the room)
    return tl.minimum(tl.cdiv(length, split_keys(length, SPLIT, MAX_SPLITS, LONG, MOST)), n_most)


@triton.jit
def row_group(own, MAX_SPLITS: tl.constexpr, G: tl.constexpr):
    # the splits a row's first-level merge group takes (mla_group): G for a row with more than
    # MAX_SPLITS splits, else 1 (its splits pass through: the one-level merge's bits); G 1: splits
    return tl.where(own > MAX_SPLITS, G, 1)


def list_bound(n_most: int, rule: SplitRule, group: int) -> int:
    """The most items a row has in a work list of `group`-split units (row_group's) under n_most."""
    return max(min(n_most, rule.max_splits), triton.cdiv(n_most, group)) if group > 1 else n_most


@triton.jit
def _list_kernel(lens_ptr, off_ptr, items_ptr, total_ptr, n_rows, n_most, n_list, SPLIT: tl.constexpr,
                 MAX_SPLITS: tl.constexpr, LONG: tl.constexpr, MOST: tl.constexpr, G: tl.constexpr,
                 B_P: tl.constexpr):
    # one program: each row's count of units (row_group's: G splits for a long row, else 1; G 1: its
    # splits), their exclusive prefix sum (the row's first item), the total, and the items (row, unit)
    # back to back
    r = tl.arange(0, B_P)
    live = r < n_rows
    length = tl.load(lens_ptr + r, mask=live, other=0).to(tl.int32)
    own = row_splits(length, n_most, SPLIT, MAX_SPLITS, LONG, MOST)
    n = tl.where(live, tl.cdiv(own, row_group(own, MAX_SPLITS, G)), 0)
    off = tl.cumsum(n, 0) - n
    tl.store(off_ptr + r, off, mask=live)
    tl.store(total_ptr, tl.sum(n, 0))
    for s in range(0, n_list):
        tl.store(items_ptr + off + s, r * 65536 + s, mask=live & (s < n))


def work_list(lens: torch.Tensor, n_most: int, rule: SplitRule, group: int = 1
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """A step's list of (row, unit) items for rows of these lengths [B], a unit being `group` consecutive
    splits of a row with more than max_splits splits, else one split (row_group; group 1: splits),
    each row's cut to n_most splits: (each row's first item [B] int32, the items [bound] int32
    (row << 16 | unit), the total [1] int32, bound = B x list_bound). One launch."""
    check_rule(rule)
    b, dev = lens.shape[0], lens.device
    n_list = list_bound(n_most, rule, group)
    if b >= 1 << 15 or n_list >= 1 << 16:
        raise ValueError(f"{b} rows of up to {n_list} items do not fit an item")
    bound = b * n_list
    off = torch.empty(b, dtype=torch.int32, device=dev)
    items = torch.empty(max(bound, 1), dtype=torch.int32, device=dev)
    total = torch.empty(1, dtype=torch.int32, device=dev)
    _list_kernel[(1,)](lens, off, items, total, b, n_most, n_list, **rule.constexprs(), G=group,
                       B_P=max(16, triton.next_power_of_2(b)))
    return off, items, total, bound
