"""The batch-invariant split MLA decode (the fixed plan; the auto plan is engine/kernels/mla_decode.py; issues 26
and 28): a row's splits follow its own length only, so its bits never depend on the rows beside it,
and a long row gets enough splits to read its context from many SMs at once.

The rule (engine/kernels/mla_rule.py own_split): decode_split_len keys a split, grown so that a row has at most
decode_max_splits (8) splits, until a split reaches decode_long_split keys; past that the split
stays that long and the row gets more splits, up to decode_most_splits, after which the splits grow
again. So a short row splits as before, and a 16k-token row at batch 1 gets 64 programs where the
8-split cap gave it 8 (decode_long_split 0: the cap of 8 at every length, the rule before).

Rows get different numbers of splits, so the work is a list: one launch (mla_rule.work_list, once a step:
the first layer's call makes it and the step's other layers reuse it, inputs.DecodeInputs.memo)
gives each row its first item (an exclusive prefix sum of the rows' split counts) and writes the
(row, split) items back to back; the split kernel's programs (a fixed number, split_programs, each
taking items pid, pid + programs, ..., at least as many as B x decode_max_splits) walk the list to
the step's total read from the device, so a
graph replays any mix of lengths with no idle program per missing split, and the partials are packed
by item. Which program computes an item changes nothing: an item's sums are its own keys in order.
The merge takes each row's items in split order (16-row tiles, looping to the tile's most splits; a
row's missing splits add exact zeros), then W_UV per value block with one tl.dot, as before. Opt-in
(split_plan's group, KernelConfig.decode_merge_group; timed in mla_tune only): a first merge level
over groups of a long row's splits (mla_group.py)."""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.mla_decode import BLOCK_N, attend, attention_out, store_partial
from pegainfer.engine.kernels.mla_group import group_partials
from pegainfer.engine.kernels.mla_rule import (SplitPlan, SplitRule, fixed_splits, row_group, row_splits, split_keys,
                                               work_list)

FIXED_BLOCK_V = 32  # value columns per tl.dot of the fixed merge (fewer where V is smaller)
FIXED_PROGRAMS = 256  # the fixed merge spreads value blocks over programs up to about this many


@triton.jit
def _split_kernel(q_ptr, cache_ptr, table_ptr, slots_ptr, lens_ptr, items_ptr, total_ptr, part_o_ptr, part_ml_ptr,
                  scale, stride_cp, stride_cn, stride_t,
                  H: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_N: tl.constexpr,
                  SPLIT: tl.constexpr, H_P: tl.constexpr, RANK_P: tl.constexpr, ROPE_P: tl.constexpr,
                  PAGE: tl.constexpr, MAX_SPLITS: tl.constexpr, LONG: tl.constexpr, MOST: tl.constexpr):
    # program p takes items p, p + programs, ... up to the step's total; item w's partial goes to w
    total = tl.load(total_ptr)
    for w in range(tl.program_id(0), total, tl.num_programs(0)):
        item = tl.load(items_ptr + w)
        b = item // 65536
        split = item % 65536
        slot = tl.load(slots_ptr + b)
        length = tl.load(lens_ptr + b).to(tl.int32)
        keys = split_keys(length, SPLIT, MAX_SPLITS, LONG, MOST)
        start = split * keys
        end = tl.minimum(start + keys, length)
        m, lsum, acc = attend(q_ptr, cache_ptr, table_ptr + slot.to(tl.int64) * stride_t, b, start, end, end - start,
                              scale, stride_cp, stride_cn, H, RANK, ROPE, BLOCK_N, H_P, RANK_P, ROPE_P, PAGE)
        store_partial(part_o_ptr, part_ml_ptr, w, acc, m, lsum, H, RANK, H_P, RANK_P)


@triton.jit
def _partial(part_o_ptr, part_ml_ptr, first, s, own, h, dk, k_ok, H: tl.constexpr, RANK: tl.constexpr):
    # split s of each row of the tile (its item first + s): (max [BB], sum [BB], output [BB, RANK_P]);
    # a split past a row's count reads as (-inf, 0, 0)
    ok = s < own
    idx = (first + s) * H + h  # [BB]
    ms = tl.load(part_ml_ptr + idx * 2, mask=ok, other=float("-inf"))
    lsum = tl.load(part_ml_ptr + idx * 2 + 1, mask=ok, other=0.0)
    part = tl.load(part_o_ptr + idx[:, None].to(tl.int64) * RANK + dk[None, :], mask=ok[:, None] & k_ok[None, :],
                   other=0.0)
    return ms, lsum, part


@triton.jit(do_not_specialize=["n_rows", "n_most"])
def _merge_kernel(part_o_ptr, part_ml_ptr, lens_ptr, off_ptr, w_uv_ptr, out_ptr, n_rows, n_most,
                  H: tl.constexpr, RANK: tl.constexpr, RANK_P: tl.constexpr, V: tl.constexpr,
                  BLOCK_V: tl.constexpr, SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr, LONG: tl.constexpr,
                  MOST: tl.constexpr, APPLY_WUV: tl.constexpr, INPUT_PRECISION: tl.constexpr, UNROLL: tl.constexpr,
                  GROUP: tl.constexpr):
    # program (value-block lane, head, 16-row tile); one compiled kernel at every batch size (the row
    # count is not specialised on): each row's own splits, in index order, merged over the whole
    # latent, rounded, then one tl.dot per BLOCK_V columns of W_UV, for the value blocks lane,
    # lane + lanes, ... (the lanes spread W_UV's bytes over programs at small batches; every block
    # runs the same instructions whoever takes it). A split past a row's own count adds exact zeros
    # (its weight is 0; the sums are never -0.0), and a tl.dot row's sums do not depend on the other
    # rows of its tile, so a row's bits follow only its own partials
    BLOCK_B: tl.constexpr = 16
    rows = tl.program_id(2) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
    live = rows < n_rows
    h = tl.program_id(1)
    dk = tl.arange(0, RANK_P)
    k_ok = dk < RANK
    if APPLY_WUV:  # the first value block asked for before the merge: its latency under the merge's
        lane, lanes = tl.program_id(0), tl.num_programs(0)
        dv0 = tl.arange(0, BLOCK_V)
        w_uv = tl.load(w_uv_ptr + h * RANK * V + dk[:, None] * V + lane * BLOCK_V + dv0[None, :],
                       mask=k_ok[:, None] & (lane * BLOCK_V + dv0 < V)[None, :], other=0.0)  # [RANK_P, BV]
    length = tl.load(lens_ptr + rows, mask=live, other=0).to(tl.int32)
    own = tl.where(live, row_splits(length, n_most, SPLIT, MAX_SPLITS, LONG, MOST), 0)  # [BB]
    if GROUP > 0:  # the parts are mla_group's: a long row's groups of GROUP splits (a short row's splits)
        own = tl.cdiv(own, row_group(own, MAX_SPLITS, GROUP))
    first = tl.load(off_ptr + rows, mask=live, other=0)  # [BB] the row's first item
    most = tl.max(own, 0)
    # the splits' max, 16 splits a load (a max is exact in any order: the same bits as one by one)
    m = tl.full([BLOCK_B], float("-inf"), tl.float32)
    for s0 in range(0, most, 16):
        ss = s0 + tl.arange(0, 16)
        ok = ss[None, :] < own[:, None]  # [BB, 16]
        ms = tl.load(part_ml_ptr + ((first[:, None] + ss[None, :]) * H + h) * 2, mask=ok, other=float("-inf"))
        m = tl.maximum(m, tl.max(ms, axis=1))
    total = tl.zeros([BLOCK_B], tl.float32)
    acc = tl.zeros([BLOCK_B, RANK_P], tl.float32)
    # each split in index order; UNROLL 2 asks for two splits' partials before adding either (more
    # loads in flight), the adds in the same order: the same bits
    for s0 in range(0, most, UNROLL):
        ms0, l0, p0 = _partial(part_o_ptr, part_ml_ptr, first, s0, own, h, dk, k_ok, H, RANK)
        if UNROLL == 2:
            ms1, l1, p1 = _partial(part_o_ptr, part_ml_ptr, first, s0 + 1, own, h, dk, k_ok, H, RANK)
        w = tl.where(ms0 == float("-inf"), 0.0, tl.exp(ms0 - m))  # [BB]
        total += l0 * w
        acc += tl.where(w[:, None] > 0, p0 * w[:, None], 0.0)
        if UNROLL == 2:
            w = tl.where(ms1 == float("-inf"), 0.0, tl.exp(ms1 - m))
            total += l1 * w
            acc += tl.where(w[:, None] > 0, p1 * w[:, None], 0.0)
    total = tl.where(live, total, 1.0)  # rows past the batch: zeros, never stored
    o_lat = (acc / total[:, None]).to(out_ptr.dtype.element_ty)  # [BB, RANK_P]
    if APPLY_WUV:
        for j in range(lane, tl.cdiv(V, BLOCK_V), lanes):
            dv = j * BLOCK_V + dv0
            o = tl.dot(o_lat, w_uv, input_precision=INPUT_PRECISION)  # [BB, BV] fp32
            tl.store(out_ptr + rows[:, None] * (H * V) + h * V + dv[None, :], o.to(out_ptr.dtype.element_ty),
                     mask=live[:, None] & (dv < V)[None, :])
            nxt = dv + lanes * BLOCK_V  # the lane's next block (none past V: masked)
            w_uv = tl.load(w_uv_ptr + h * RANK * V + dk[:, None] * V + nxt[None, :],
                           mask=k_ok[:, None] & (nxt < V)[None, :], other=0.0)
    else:
        tl.store(out_ptr + (rows[:, None] * H + h) * RANK + dk[None, :], o_lat, mask=live[:, None] & k_ok[None, :])


class Launches(NamedTuple):
    """The launch shape of the two kernels: the keys a step of the split kernel takes (a multiple
    that divides the page size and the split length: it fixes the order of a split's sums), and each
    kernel's warps and pipeline stages (no bits change), and the merge's unroll (the same bits; a first
    merge level is the step's plan's: split_plan(..., group)). tools/dev/mla_tune.py times them."""
    block_n: int = BLOCK_N
    split_warps: int = 8
    split_stages: int = 3
    merge_warps: int = 8
    merge_stages: int = 3
    merge_unroll: int = 1  # 1 or 2 splits' partials asked for at once (the same bits)
    # value columns per tl.dot of the merge (no bits change; interpreter tests only: on the H100's Triton 3.6
    # 16 columns at 4 warps failed to compile for sm_90, 2026-12-06, so the KernelConfig sets neither)
    merge_block_v: int = FIXED_BLOCK_V


def launches_of(kernels) -> Launches:
    """The launch shape a KernelConfig sets (decode_block_n, decode_split_warps, decode_split_stages,
    decode_merge_unroll; the merge's warps, stages and value block Launches')."""
    return Launches(block_n=kernels.decode_block_n, split_warps=kernels.decode_split_warps,
                    split_stages=kernels.decode_split_stages, merge_unroll=kernels.decode_merge_unroll)


def split_plan(lens: torch.Tensor, length: int, rule: SplitRule, group: int = 0) -> SplitPlan:
    """The step's work list for rows of these lengths [B] under the static bound `length` (one launch),
    and with group > 0 (KernelConfig.decode_merge_group), where the bound allows a long row, the first
    merge level's group list (one more): mla_decode_fixed then merges in two levels."""
    n_most = fixed_splits(length, rule)
    off, items, total, _ = work_list(lens, n_most, rule)
    groups = (group, *work_list(lens, n_most, rule, group)) if group > 0 and n_most > rule.max_splits else None
    return SplitPlan(off, items, total, n_most, groups)


def mla_decode_fixed(q: torch.Tensor, cache_layer: torch.Tensor, table: torch.Tensor, slots: torch.Tensor,
                     lens: torch.Tensor, *, plan: SplitPlan, scale: float, rank: int, rule: SplitRule, programs: int,
                     w_uv_t: torch.Tensor | None, launches: Launches = Launches()) -> torch.Tensor:
    """mla_decode's fixed plan (its arguments; plan: split_plan's for these lens, programs: how many
    split programs walk the items at least, KernelConfig.split_programs, and at least B x max_splits).
    Two launches, graph-safe."""
    b, h, width = q.shape
    page, bn = cache_layer.shape[1], launches.block_n
    if page % bn or rule.split_len % bn:
        raise ValueError(f"the page size ({page}) and split length ({rule.split_len}) must be multiples of {bn}")
    part_o = torch.empty(plan.bound, h, rank, dtype=torch.float32, device=q.device)  # [items, H, rank]
    part_ml = torch.empty(plan.bound, h, 2, dtype=torch.float32, device=q.device)  # [items, H, (max, sum)]
    # at least a program per split that the rule before (at most max_splits a row, one program each)
    # launched, so short rows at large batches run as they did; long rows' further splits are walked
    # by the same programs; at small batches `programs` (about 2 per SM) of them
    n_programs = max(1, min(plan.bound, max(programs, b * rule.max_splits)))
    _split_kernel[(n_programs,)](
        q.contiguous(), cache_layer, table, slots, lens, plan.items, plan.total, part_o, part_ml, scale,
        cache_layer.stride(0), cache_layer.stride(1), table.stride(0), H=h, RANK=rank, ROPE=width - rank,
        BLOCK_N=bn, H_P=max(16, triton.next_power_of_2(h)), RANK_P=triton.next_power_of_2(rank),
        ROPE_P=max(16, triton.next_power_of_2(width - rank)), PAGE=page, **rule.constexprs(),
        num_warps=launches.split_warps, num_stages=launches.split_stages)
    v, out = attention_out(q, rank, w_uv_t)
    # value columns per tl.dot: set by V alone (never by the batch). Lanes per (head, tile): every
    # value block its own program while the tiles are few (W_UV's bytes over many SMs), fewer as they
    # grow (each program merges its rows' partials once for more blocks); the bits are the same
    block_v = max(16, min(launches.merge_block_v, triton.next_power_of_2(v))) if w_uv_t is not None else 1
    tiles = triton.cdiv(b, 16)
    lanes = min(triton.cdiv(v, block_v), triton.cdiv(FIXED_PROGRAMS, tiles * h)) if w_uv_t is not None else 1
    first, group = plan.off, plan.groups[0] if plan.groups else 0
    if group > 0:  # the first merge level: a long row's groups of splits, side by side
        part_o, part_ml, first = group_partials(part_o, part_ml, lens, plan, rule, programs)
    _merge_kernel[(lanes, h, tiles)](
        part_o, part_ml, lens, first, w_uv_t if w_uv_t is not None else part_o, out, b, plan.most,
        H=h, RANK=rank, RANK_P=triton.next_power_of_2(rank), V=v, BLOCK_V=block_v, **rule.constexprs(),
        APPLY_WUV=w_uv_t is not None, INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        UNROLL=launches.merge_unroll, GROUP=group, num_warps=launches.merge_warps,
        num_stages=launches.merge_stages)
    return out
