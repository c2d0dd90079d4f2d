"""engine/kernels/mla_rule.py: the batch-invariant split attention's rule (a row's keys a split, from
its own length only, and the bounds a graph's static length gives), the grouped work list's room,
KernelConfig's check of the split kernel's step, and the per-step work list (Triton's interpreter)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_own_split_follows_the_rows_length_alone():
    from pegainfer.engine.kernels.mla_rule import SplitRule, fixed_splits, own_split
    old, new = SplitRule(32, 8), SplitRule(32, 8, 256, 64)
    # the rule before (no long splits): at most 8 splits, the split growing by 32 keys
    assert [own_split(n, old) for n in (1, 32, 256, 257, 512, 513, 8192)] == [32, 32, 32, 64, 64, 96, 1024]
    # with long splits: 8 up to 2,048 keys, then 256-key splits up to 64 of them (16,384), then growing
    assert [own_split(n, new) for n in (1, 256, 257, 2048, 2049, 16384, 16385, 32768)] == [
        32, 32, 64, 256, 256, 256, 288, 512]
    for rule in (old, new, SplitRule(32, 2, 64, 4), SplitRule(64, 3, 128, 5)):
        most = rule.most_splits if rule.long_split else rule.max_splits
        bound = 0
        for n in range(1, 40000, 13):
            split = own_split(n, rule)
            assert split % rule.split_len == 0 and _cdiv(n, split) <= most
            bound = max(bound, _cdiv(n, split))
            assert bound <= fixed_splits(n, rule) <= fixed_splits(n + 100, rule) <= most  # a bucket holds its rows
    assert fixed_splits(256, old) == 8 and fixed_splits(33, old) == 2 and fixed_splits(8192, old) == 8
    assert fixed_splits(16384, new) == 64 and fixed_splits(4096, new) == 16 and fixed_splits(100, new) == 4


def test_group_lists_and_the_launch_shape_are_checked():
    """list_bound: a row's units in a grouped work list (long rows' groups, short rows' splits);
    KernelConfig refuses a split kernel step that does not divide the page and the split length."""
    from pegainfer.engine.kernels.config import KernelConfig
    from pegainfer.engine.kernels.mla_rule import SplitRule, list_bound
    rule = SplitRule(64, 8, 256, 64)
    assert [list_bound(most, rule, 8) for most in (1, 8, 9, 64, 65)] == [1, 8, 8, 8, 9]
    assert [list_bound(most, rule, 4) for most in (8, 16, 64)] == [8, 8, 16]
    assert list_bound(64, rule, 1) == list_bound(64, rule, 0) == 64
    for bad in (dict(decode_block_n=128), dict(decode_block_n=48), dict(decode_block_n=64, decode_split_len=32),
                dict(decode_block_n=8, decode_split_len=32), dict(decode_merge_group=-1),
                dict(decode_merge_unroll=3)):
        with pytest.raises(ValueError, match="decode_block_n"):
            KernelConfig(**bad)
    assert KernelConfig(decode_block_n=32, decode_split_len=32).decode_block_n == 32


def test_the_work_list_holds_each_rows_splits_in_order(triton_interpreter):
    from pegainfer.engine.kernels.mla_fixed import split_plan
    from pegainfer.engine.kernels.mla_rule import SplitRule, fixed_splits, own_split
    rule = SplitRule(32, 2, 64, 4)
    lens = [1, 300, 64, 65, 200, 33]
    plan = split_plan(torch.tensor(lens), 320, rule)
    counts = [_cdiv(n, own_split(n, rule)) for n in lens]
    assert plan.bound == len(lens) * fixed_splits(320, rule) and int(plan.total) == sum(counts)
    want = [(r << 16) | s for r, c in enumerate(counts) for s in range(c)]
    assert plan.items[:sum(counts)].tolist() == want
    assert plan.off.tolist() == [sum(counts[:r]) for r in range(len(lens))]
