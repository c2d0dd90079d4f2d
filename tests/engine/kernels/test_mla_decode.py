"""engine/kernels/mla_decode.py: the split MLA decode attention is a softmax over each row's own length
of the cached latent, and both merge kernels apply W_UV as the direct product does. Through the
attention (MLAttention.decode_absorbed: the prep, split and merge launches, then o_proj), the torch
path's output for the tiny preset's heads, the q LoRA path, non-power-of-two head dims and bfloat16
(there judged against float32 arithmetic on the same bf16 values: as accurate as the torch path).
Every call reads the cache through a page table of scrambled pages (tests/engine/kernels/paging.py).
The fixed plan (KernelConfig.batch_invariant): a row computed alone and inside batches of other
rows at other lengths, at any row index, under any static bound, on any pages, gives the same bits, with and
without W_UV (the rule and the work list: test_mla_rule.py). Triton's CPU interpreter; the GPU
variants (lite's shapes, batches up to 256, contexts up to 8,192) at the end."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from tests.engine.kernels import mla_cases  # noqa: E402
from tests.engine.kernels.paging import paged  # noqa: E402

B, H, RANK, ROPE, SLOTS, N = 3, 16, 64, 16, 4, 80


def _inputs(gen: torch.Generator) -> tuple:
    cache = torch.randn(SLOTS, N, RANK + ROPE, generator=gen)
    q = torch.randn(B, H, RANK + ROPE, generator=gen)
    return cache, q, torch.tensor([2, 0, 3]), torch.tensor([1, 37, 80])


def test_split_attention_is_a_softmax_over_each_rows_length(triton_interpreter, gen):
    from pegainfer.engine.kernels.mla_decode import mla_decode
    cache, q, slots, lens = _inputs(gen)
    got = mla_decode(q, *paged(cache), slots, lens, 80, 0.3, RANK, split_len=32, merge="row")
    for b in range(B):
        kv = cache[slots[b], : lens[b]]
        p = ((q[b] @ kv.T) * 0.3).softmax(-1)
        want = p @ kv[:, :RANK]
        assert torch.allclose(got[b], want, atol=1e-4), (b, (got[b] - want).abs().max())


def test_both_merges_apply_w_uv(triton_interpreter, gen):
    from pegainfer.engine.kernels.mla_decode import mla_decode
    cache, q, slots, lens = _inputs(gen)
    v = 24
    w_uv = torch.randn(H, RANK, v, generator=gen)
    o_lat = mla_decode(q, *paged(cache), slots, lens, 80, 0.3, RANK, split_len=32, merge="row")  # [B, H, RANK]
    want = torch.einsum("bhr,hrv->bhv", o_lat, w_uv).reshape(B, H * v)
    for merge in ("row", "block"):
        got = mla_decode(q, *paged(cache), slots, lens, 80, 0.3, RANK, split_len=32, merge=merge, w_uv_t=w_uv)
        assert torch.allclose(got, want, atol=1e-4), (merge, (got - want).abs().max())


def test_split_and_merge_follow_the_config():
    from pegainfer.engine.kernels.mla_decode import auto_split, merge_form
    # enough splits that rows x splits reach the program target, no split under one block of 32 keys
    assert auto_split(1, 1024, 264) == 32 and auto_split(64, 1024, 264) == 224 and auto_split(1, 1024, 8) == 128
    assert auto_split(300, 300, 264) == 320  # one split: the whole bound in blocks of 32
    assert merge_form(32, 32) == "row" and merge_form(33, 32) == "block"


@pytest.mark.parametrize("overrides,dtype,positions,seed", mla_cases.CASES, ids=mla_cases.IDS)
def test_decode_absorbed_matches_the_torch_path(triton_interpreter, request, overrides, dtype, positions, seed):
    if dtype == torch.bfloat16:
        request.getfixturevalue("bf16_as_gpu")
    c = mla_cases.case(overrides, dtype, positions, seed)
    o_ref, o_got, _, _ = c.both(lambda attn, cache: attn.decode_absorbed(c.x, c.inp, cache))
    assert o_got.shape == (c.x.shape[0], c.cfg.hidden_size) and o_got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(o_got, o_ref, rtol=1e-4, atol=1e-4)
        return
    # no closer to the torch path than rounding allows: judge both against float32 arithmetic on the
    # same bf16 values; the fused path must be as accurate as the torch path
    _, exact = mla_cases.attention(overrides, torch.float32, mla_cases.FUSED, grain=dtype)
    want = exact.decode_absorbed(c.x.float(), c.inp, mla_cases.copy(c.cache, torch.float32))  # [B, H]
    rel = mla_cases.rel
    assert rel(o_got, want) < 1.5 * rel(o_ref, want), (rel(o_got, want), rel(o_ref, want))
    assert rel(o_got, o_ref) < 1e-2, rel(o_got, o_ref)


def test_the_plans_refuse_what_they_do_not_take():
    from pegainfer.engine.kernels.mla_decode import mla_decode
    from pegainfer.engine.kernels.mla_rule import SplitRule, check_rule
    with pytest.raises(ValueError, match="fixed plan"):
        mla_decode(torch.zeros(1, H, RANK + ROPE), *paged(torch.zeros(1, N, RANK + ROPE)), torch.zeros(1, dtype=torch.long),
                   torch.ones(1, dtype=torch.long), N, 0.3, RANK, split_len=32, merge="fixed")
    for bad in (SplitRule(48, 8), SplitRule(32, 0), SplitRule(32, 8, 100, 64), SplitRule(32, 8, 256, 4)):
        with pytest.raises(ValueError):
            check_rule(bad)
    check_rule(SplitRule(32, 8, 256, 64))


# The fixed plan in the interpreter: 32-key splits, at most 2 a row up to 128 keys (65-128: 2 of 64),
# then 64-key splits, up to 4 (256 keys), then growing (300 keys: 4 splits of 96); 48 value columns:
# two tl.dot blocks, the second half masked
INV = dict(rule=(32, 2, 64, 4))
INV_SLOTS, INV_N, INV_V, SCALE = 40, 320, 48, 0.3


def _inputs_on(device, dtype: torch.dtype, slots: int, n: int, h: int, rank: int, rope: int, v: int,
               seed: int) -> tuple:
    """A cache of `slots` x `n` entries, a query per slot [slots, h, rank+rope] and W_UV [h, rank, v]."""
    g = torch.Generator(device=device).manual_seed(seed)
    cache = torch.randn(slots, n, rank + rope, generator=g, device=device, dtype=dtype)
    q = torch.randn(slots, h, rank + rope, generator=g, device=device, dtype=dtype)
    w_uv = (torch.randn(h, rank, v, generator=g, device=device, dtype=torch.float32) * 0.2).to(dtype)
    return cache, q, w_uv


def _run(cache, q, w_uv, slots: list[int], lens: list[int], length: int, w: bool, plan: dict) -> torch.Tensor:
    """The decode attention of the rows reading `slots` (each with that slot's query) at lengths
    `lens`: plan {"rule": SplitRule fields, "programs": n} the fixed plan (mla_fixed), else mla_decode's."""
    s = torch.tensor(slots, device=cache.device)
    lens_t = torch.tensor(lens, device=cache.device)
    if "rule" in plan:
        from pegainfer.engine.kernels.mla_fixed import Launches, mla_decode_fixed, split_plan
        from pegainfer.engine.kernels.mla_rule import SplitRule
        rule, launches = SplitRule(*plan["rule"]), plan.get("launches", Launches())
        step = split_plan(lens_t, length, rule, plan.get("group", 0))
        return mla_decode_fixed(q[s], *paged(cache), s, lens_t, plan=step, scale=SCALE, rank=w_uv.shape[1], rule=rule,
                                programs=plan.get("programs", 264), w_uv_t=w_uv if w else None, launches=launches)
    from pegainfer.engine.kernels.mla_decode import mla_decode
    return mla_decode(q[s], *paged(cache), s, lens_t, length, SCALE, w_uv.shape[1], w_uv_t=w_uv if w else None, **plan)


def _same_bits_in_any_batch(cache, q, w_uv, probes: list[tuple[int, int]], sizes: tuple[int, ...], plan: dict,
                            seed: int) -> None:
    """Each probe (slot, length) alone, then inside a batch of each size: as many probes as half the
    batch holds, the rest random neighbours (other slots, random lengths up to the cache's), every row
    at a random index, under a random static bound: the probes' rows bitwise equal, with and without
    W_UV."""
    g = torch.Generator().manual_seed(seed)
    n_max, first_free = cache.shape[1], 1 + max(slot for slot, _ in probes)

    def rand(lo: int, hi: int, k: int = 1) -> list[int]:  # k draws from [lo, hi]
        return torch.randint(lo, hi + 1, (k,), generator=g).tolist()

    for w in (False, True):
        alone = {slot: _run(cache, q, w_uv, [slot], [n], rand(n, min(n_max, n + 64))[0], w, plan)[0]
                 for slot, n in probes}
        for size in sizes:
            chosen = [probes[i] for i in torch.randperm(len(probes), generator=g)[:max(1, min(len(probes), size // 2))]]
            k = size - len(chosen)
            slots = [slot for slot, _ in chosen] + (rand(first_free, cache.shape[0] - 1, k) if k else [])
            lens = [n for _, n in chosen] + (rand(1, n_max, k) if k else [])
            order = torch.randperm(size, generator=g).tolist()
            slots, lens = [slots[i] for i in order], [lens[i] for i in order]
            got = _run(cache, q, w_uv, slots, lens, rand(max(lens), n_max)[0], w, plan)
            for slot, n in chosen:
                at = slots.index(slot)
                diff = (got[at].float() - alone[slot].float()).abs().max()
                assert torch.equal(got[at], alone[slot]), (w, size, n, at, diff)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_fixed_plan_gives_a_row_the_same_bits_in_any_batch(triton_interpreter, request, dtype):
    if dtype == torch.bfloat16:
        request.getfixturevalue("bf16_as_gpu")
    cache, q, w_uv = _inputs_on("cpu", dtype, INV_SLOTS, INV_N, H, RANK, ROPE, INV_V, 7)
    # one key, one split exactly, one key over it, the most 32-key splits, the splits grown (65, 128:
    # 2 x 64), more 64-key splits (129: 3, 256: 4), and grown again (300: 4 x 96)
    probes = [(0, 1), (1, 32), (2, 33), (3, 64), (4, 65), (5, 128), (6, 129), (7, 256), (8, 300)]
    _same_bits_in_any_batch(cache, q, w_uv, probes, (2, 5, 17, 33), INV, 7)


def _reference(cache, q, w_uv, slot: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention of `slot`'s query over its first n entries: o_lat [H, rank], and the value
    heads of o_lat rounded to the cache's dtype [H*V] (the kernels apply W_UV to the rounded o_lat)."""
    rank = w_uv.shape[1]
    kv = cache[slot, :n].double()
    o_lat = ((q[slot].double() @ kv.T) * SCALE).softmax(-1) @ kv[:, :rank]  # [H, rank]
    rounded = o_lat.to(cache.dtype).double()
    return o_lat, torch.einsum("hr,hrv->hv", rounded, w_uv.double()).reshape(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_fixed_plan_is_the_attention_over_each_rows_length(triton_interpreter, request, dtype):
    if dtype == torch.bfloat16:
        request.getfixturevalue("bf16_as_gpu")
    cache, q, w_uv = _inputs_on("cpu", dtype, INV_SLOTS, INV_N, H, RANK, ROPE, INV_V, 8)
    slots, lens = [3, 9, 0, 21, 30], [1, 40, 128, 200, 320]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    from pegainfer.engine.kernels.mla_fixed import Launches
    # the rule at 32-key splits and steps, and the engine's shape: 64-key splits of 64-key steps, 4 warps, 2 stages
    wide = dict(rule=(64, 2, 128, 4), launches=Launches(block_n=64, split_warps=4, split_stages=2))
    for plan in (INV, wide):
        o_lat = _run(cache, q, w_uv, slots, lens, 320, False, plan).double()  # [B, H, RANK]
        vals = _run(cache, q, w_uv, slots, lens, 320, True, plan).double()  # [B, H*V]
        for b, (slot, n) in enumerate(zip(slots, lens)):
            want, want_v = _reference(cache, q, w_uv, slot, n)
            assert torch.allclose(o_lat[b], want, atol=tol, rtol=tol), (b, (o_lat[b] - want).abs().max())
            assert torch.allclose(vals[b], want_v, atol=tol, rtol=tol), (b, (vals[b] - want_v).abs().max())


def test_fixed_merge_lanes_and_split_programs_change_no_bits(triton_interpreter, monkeypatch):
    from pegainfer.engine.kernels import mla_fixed as md
    cache, q, w_uv = _inputs_on("cpu", torch.float32, INV_SLOTS, INV_N, H, RANK, ROPE, INV_V, 9)
    slots, lens = list(range(1, 18)), list(range(5, 320, 19))
    assert -(-md.FIXED_PROGRAMS // (2 * H)) >= 2  # two tiles: a program per value block
    spread = _run(cache, q, w_uv, slots, lens, 320, True, INV)
    for programs in (1, 50):  # 17 rows: at least 17 x 2 programs walk the work list, or 50
        assert torch.equal(_run(cache, q, w_uv, slots, lens, 320, True, {**INV, "programs": programs}), spread)
    # three long rows, 4 + 4 + 3 items: 6 programs (the floor, some taking two items), 7, or one each
    few, few_lens = [2, 5, 9], [300, 250, 129]
    one_each = _run(cache, q, w_uv, few, few_lens, 320, True, {**INV, "programs": 300})
    for programs in (1, 7):
        assert torch.equal(_run(cache, q, w_uv, few, few_lens, 320, True, {**INV, "programs": programs}), one_each)
    from pegainfer.engine.kernels.mla_fixed import Launches
    # two splits' partials loaded at once, added in the same order; other warps and stages
    for launches in (Launches(merge_unroll=2), Launches(merge_block_v=16, merge_warps=8), Launches(merge_warps=4),
                     Launches(merge_block_v=64)):
        assert torch.equal(_run(cache, q, w_uv, slots, lens, 320, True, {**INV, "launches": launches}), spread)
    monkeypatch.setattr(md, "FIXED_PROGRAMS", 1)  # one program takes both value blocks
    assert torch.equal(_run(cache, q, w_uv, slots, lens, 320, True, INV), spread)


def test_grouped_merge_keeps_a_rows_bits_in_any_batch(triton_interpreter, monkeypatch):
    """mla_group's first merge level (opt-in): groups of 1 are the one-level merge bit for bit; groups
    of 3 keep a row's bits alone and in batches, and stay the attention over its length; a row with
    at most max_splits splits keeps the one-level bits beside long rows, and a step whose bound
    allows no long row launches no group level."""
    from pegainfer.engine.kernels import mla_fixed
    cache, q, w_uv = _inputs_on("cpu", torch.float32, INV_SLOTS, INV_N, H, RANK, ROPE, INV_V, 11)
    slots, lens = [1, 4, 7, 2], [1, 129, 300, 65]
    one = _run(cache, q, w_uv, slots, lens, 320, True, INV)
    assert torch.equal(_run(cache, q, w_uv, slots, lens, 320, True, {**INV, "group": 1}), one)
    grouped = {**INV, "group": 3}
    out = _run(cache, q, w_uv, slots, lens, 320, True, grouped)
    short = [0, 3]  # INV's rule: 1 key is one split, 65 keys two 64-key splits (at most max_splits 2)
    assert torch.equal(out[short], one[short])
    calls = []
    real = mla_fixed.group_partials
    monkeypatch.setattr(mla_fixed, "group_partials", lambda *a: calls.append(a[3].groups[0]) or real(*a))
    _run(cache, q, w_uv, slots, lens, 320, True, grouped)
    assert calls == [3]
    calls.clear()  # a bound of 64 keys: 2 splits at most, no row can be long
    assert torch.equal(_run(cache, q, w_uv, [1, 2], [1, 64], 64, True, grouped), _run(cache, q, w_uv, [1, 2], [1, 64],
                                                                                      64, True, INV))
    assert calls == []
    _same_bits_in_any_batch(cache, q, w_uv, [(0, 1), (1, 129), (2, 256), (3, 300)], (2, 9), grouped, 11)
    vals = _run(cache, q, w_uv, slots, lens, 320, True, grouped).double()
    for b, (slot, n) in enumerate(zip(slots, lens)):
        _, want = _reference(cache, q, w_uv, slot, n)
        assert torch.allclose(vals[b], want, atol=1e-5, rtol=1e-5), (b, (vals[b] - want).abs().max())


def test_decode_values_follow_the_batch_invariant_switch(triton_interpreter, monkeypatch):
    from pegainfer.engine.kernels import mla_decode as md
    from pegainfer.engine.kernels import mla_fixed as mf
    from pegainfer.engine.kernels.config import KernelConfig
    overrides, dtype, positions, seed = mla_cases.CASES[0]
    c = mla_cases.case(overrides, dtype, positions, seed)
    calls = {"auto": [], "fixed": [], "plans": 0}
    real, real_fixed, real_plan = md.mla_decode, mf.mla_decode_fixed, mf.split_plan
    monkeypatch.setattr(md, "mla_decode", lambda *a, **kw: calls["auto"].append(kw) or real(*a, **kw))
    monkeypatch.setattr(mf, "mla_decode_fixed", lambda *a, **kw: calls["fixed"].append(kw) or real_fixed(*a, **kw))
    monkeypatch.setattr(mf, "split_plan", lambda *a: calls.update(plans=calls["plans"] + 1) or real_plan(*a))
    outs = []
    for inv in (True, False):
        _, attn = mla_cases.attention(overrides, dtype, KernelConfig(batch_invariant=inv))
        c.inp.memo.clear()
        outs.append(attn.decode_absorbed(c.x, c.inp, mla_cases.copy(c.cache)))
        attn.decode_absorbed(c.x, c.inp, mla_cases.copy(c.cache))  # a second layer of the step: the same plan
    b, k = c.x.shape[0], KernelConfig()
    assert len(calls["fixed"]) == 2 and calls["plans"] == 1 and calls["fixed"][0]["plan"] is calls["fixed"][1]["plan"]
    assert calls["fixed"][0]["rule"] == mf.SplitRule(k.decode_split_len, k.decode_max_splits, k.decode_long_split,
                                                k.decode_most_splits)
    assert calls["fixed"][0]["launches"] == mf.launches_of(k) == mf.Launches(
        k.decode_block_n, k.decode_split_warps, k.decode_split_stages, 8, 3, k.decode_merge_unroll)
    assert calls["auto"][0]["merge"] == md.merge_form(b, k.row_merge_max_batch)
    assert calls["auto"][0]["split_len"] == md.auto_split(b, c.inp.length, k.split_programs)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)  # two orders of one sum


# GPU: lite's shapes (16 heads, latent 512 + RoPE 64, value heads 128), bfloat16, the KernelConfig's
# fixed plan, contexts up to 8,192 (257 slots: 2.4 GB of cache)
LITE = dict(h=16, rank=512, rope=64, v=128)
GPU_SLOTS, GPU_N = 257, 8192


def _lite_plan(**overrides) -> dict:
    from pegainfer.engine.kernels.config import KernelConfig
    from pegainfer.engine.kernels.mla_fixed import launches_of
    k = KernelConfig(**overrides)
    return dict(rule=(k.decode_split_len, k.decode_max_splits, k.decode_long_split, k.decode_most_splits),
                programs=k.split_programs, launches=launches_of(k), group=k.decode_merge_group)


def test_gpu_fixed_plan_gives_a_row_the_same_bits_in_any_batch(triton_gpu):
    cache, q, w_uv = _inputs_on(triton_gpu, torch.bfloat16, GPU_SLOTS, GPU_N, **LITE, seed=0)
    # around the split boundaries (64 keys; 512 = 8 splits, the most before they grow) and long rows
    probes = [(0, 1), (1, 63), (2, 64), (3, 65), (4, 150), (5, 512), (6, 513), (7, 1000), (8, 4097), (9, 8192)]
    _same_bits_in_any_batch(cache, q, w_uv, probes, (1, 2, 7, 33, 64, 128, 255, 256), _lite_plan(), 0)


def test_gpu_fixed_plan_is_as_accurate_as_the_auto_plan_and_replays_the_same_bits(triton_gpu):
    from pegainfer.engine.cuda_graphs import capture
    from pegainfer.engine.kernels.config import KernelConfig
    from pegainfer.engine.kernels.mla_decode import auto_split, merge_form
    k = KernelConfig()
    cache, q, w_uv = _inputs_on(triton_gpu, torch.bfloat16, GPU_SLOTS, GPU_N, **LITE, seed=1)
    g = torch.Generator().manual_seed(1)
    for b in (1, 7, 64, 256):
        slots = torch.randperm(GPU_SLOTS, generator=g)[:b].tolist()
        lens = torch.randint(1, GPU_N + 1, (b,), generator=g).tolist()
        length = GPU_N
        auto = dict(split_len=auto_split(b, length, k.split_programs), merge=merge_form(b, k.row_merge_max_batch))
        fixed = _run(cache, q, w_uv, slots, lens, length, True, _lite_plan())  # [B, H*V]
        other = _run(cache, q, w_uv, slots, lens, length, True, auto)
        for r in range(0, b, max(1, b // 8)):  # eight rows against float64
            _, want = _reference(cache, q, w_uv, slots[r], lens[r])
            err = float((fixed[r].double() - want).norm() / want.norm())
            err_auto = float((other[r].double() - want).norm() / want.norm())
            assert err < 1e-2 and err <= 1.5 * err_auto + 1e-3, (b, r, err, err_auto)
        # everything the launch reads made before the capture (no host copy may run inside one); the
        # work list is made inside the graph, so a replay at other lengths follows them
        from pegainfer.engine.kernels.mla_fixed import mla_decode_fixed, split_plan
        from pegainfer.engine.kernels.mla_rule import SplitRule
        lite = _lite_plan()
        rule, programs = SplitRule(*lite["rule"]), lite["programs"]
        s_t, lens_t = torch.tensor(slots, device=cache.device), torch.tensor(lens, device=cache.device)
        pages, table, q_rows = *paged(cache), q[s_t]
        graph, out = capture(lambda: mla_decode_fixed(q_rows, pages, table, s_t, lens_t,
                                                      plan=split_plan(lens_t, length, rule,
                                                                      lite["group"]), scale=SCALE,
                                                      rank=w_uv.shape[1], rule=rule, programs=programs, w_uv_t=w_uv,
                                                      launches=lite["launches"]),
                             None)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fixed), b
        other_lens = torch.randint(1, GPU_N + 1, (b,), generator=g).tolist()
        lens_t.copy_(torch.tensor(other_lens))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, _run(cache, q, w_uv, slots, other_lens, length, True, _lite_plan())), b


@pytest.mark.parametrize("group", [0, 8], ids=["one_level", "grouped"])
def test_gpu_long_rows_keep_their_bits_in_any_batch(triton_gpu, group):
    """Rows in the long regime (256-key splits from 2,048 keys, 64 of them at 16,384, then growing),
    with the one-level merge and with the opt-in first level over groups of 8 splits."""
    cache, q, w_uv = _inputs_on(triton_gpu, torch.bfloat16, 8, 40000, **LITE, seed=2)
    probes = [(0, 2048), (1, 2049), (2, 9000), (3, 16384), (4, 16385), (5, 33000)]
    plan = _lite_plan(decode_merge_group=group)
    _same_bits_in_any_batch(cache, q, w_uv, probes, (1, 2, 5, 12, 40), plan, 2)
    for slot, n in probes:
        _, want = _reference(cache, q, w_uv, slot, n)
        got = _run(cache, q, w_uv, [slot], [n], n, True, plan)[0].double()
        assert float((got - want).norm() / want.norm()) < 1e-2, n
