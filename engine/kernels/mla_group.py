"""An opt-in first merge level for the batch-invariant split attention (engine/kernels/mla_fixed.py,
a step's split_plan(..., G) with G > 0, KernelConfig.decode_merge_group; not the default): the merge
walks a row's partials one split after another, so a long row's 64 splits are 64 dependent steps. Here each
group of G consecutive splits of a row with more than max_splits splits (a long row) is merged
first, by programs side by side (a per-step group list as the split list is), into one partial of
the same form (max, sum, unnormalised output), and the merge then walks the row's groups; a row with
at most max_splits splits passes its splits through one by one (groups of 1: the one-level merge's
bits), and where the step's bound allows no long row the level is not launched at all (the same
bits). The groups follow the row's own split count only, and each group and the row take their
parts in split order, so a row's bits still depend on nothing but itself (a long row's differ from
the one-level merge's: another tree of the same sums). On an H100 (2026-12-06, mla_tune bwg: groups
of 8 for every row, 3 split stages): 16k / 32k keys at batch 1 38.2 / 57.7 µs a layer, against 48.0 /
64.6 for the default shape one-level (2 stages), and +4.7 µs at 1k (its launches; skipped only where
the step's bound allows no long row, which in the engine means max_len <= 2,048)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pegainfer.engine.kernels.mla_decode import store_partial
from pegainfer.engine.kernels.mla_rule import SplitPlan, SplitRule, row_group, row_splits


@triton.jit
def _group_kernel(part_o_ptr, part_ml_ptr, lens_ptr, off_ptr, groups_ptr, gtotal_ptr, grp_o_ptr, grp_ml_ptr, n_most,
                  H: tl.constexpr, RANK: tl.constexpr, H_P: tl.constexpr, RANK_P: tl.constexpr,
                  SPLIT: tl.constexpr, MAX_SPLITS: tl.constexpr, LONG: tl.constexpr, MOST: tl.constexpr,
                  G: tl.constexpr):
    # program p takes groups p, p + programs, ...: group g of row b merges the row's splits g*n ..
    # g*n + n - 1 (n = row_group's, fewer in its last group), in order, every head at once, into group
    # partial w
    heads = tl.arange(0, H_P)
    dl = tl.arange(0, RANK_P)
    hm, lm = heads < H, dl < RANK
    total = tl.load(gtotal_ptr)
    for w in range(tl.program_id(0), total, tl.num_programs(0)):
        item = tl.load(groups_ptr + w)
        b = item // 65536
        g = item % 65536
        length = tl.load(lens_ptr + b).to(tl.int32)
        own = row_splits(length, n_most, SPLIT, MAX_SPLITS, LONG, MOST)
        n = row_group(own, MAX_SPLITS, G)
        first = tl.load(off_ptr + b) + g * n
        count = tl.minimum(n, own - g * n)
        m = tl.full([H_P], float("-inf"), tl.float32)
        for s in range(0, count):
            m = tl.maximum(m, tl.load(part_ml_ptr + ((first + s) * H + heads) * 2, mask=hm, other=float("-inf")))
        lsum = tl.zeros([H_P], tl.float32)
        acc = tl.zeros([H_P, RANK_P], tl.float32)
        for s in range(0, count):
            idx = ((first + s) * H + heads).to(tl.int64)  # [H_P]
            ms = tl.load(part_ml_ptr + idx * 2, mask=hm, other=float("-inf"))
            wt = tl.where(ms == float("-inf"), 0.0, tl.exp(ms - m))
            lsum += tl.load(part_ml_ptr + idx * 2 + 1, mask=hm, other=0.0) * wt
            part = tl.load(part_o_ptr + idx[:, None] * RANK + dl[None, :], mask=hm[:, None] & lm[None, :], other=0.0)
            acc += tl.where(wt[:, None] > 0, part * wt[:, None], 0.0)
        store_partial(grp_o_ptr, grp_ml_ptr, w, acc, m, lsum, H, RANK, H_P, RANK_P)


def group_partials(part_o: torch.Tensor, part_ml: torch.Tensor, lens: torch.Tensor, plan: SplitPlan, rule: SplitRule,
                   programs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first merge level: (group outputs [B x list_bound, H, rank], group (max, sum), each row's
    first group [B] int32), for mla_fixed's merge to walk as it walks splits. The group list is the
    step's (plan.groups, made once a step by split_plan). One launch, graph-safe."""
    b, h, rank = lens.shape[0], part_o.shape[1], part_o.shape[2]
    group, goff, groups, gtotal, bound = plan.groups
    bound = max(bound, 1)
    grp_o = torch.empty(bound, h, rank, dtype=torch.float32, device=lens.device)
    grp_ml = torch.empty(bound, h, 2, dtype=torch.float32, device=lens.device)
    _group_kernel[(max(1, min(bound, max(programs, b))),)](
        part_o, part_ml, lens, plan.off, groups, gtotal, grp_o, grp_ml, plan.most, H=h, RANK=rank,
        H_P=max(16, triton.next_power_of_2(h)), RANK_P=triton.next_power_of_2(rank), **rule.constexprs(), G=group,
        num_warps=8)
    return grp_o, grp_ml, goff
