"""engine/kernels/linear.py: a row's output is bitwise the same alone and inside batches of any size
with random neighbours at random positions, and close to F.linear: the torch form on the CPU's BLAS,
the Triton kernel in Triton's interpreter (both K walks: the chunks in one program and one program
per chunk, which must agree bitwise) and on a GPU at the lite preset's shapes, captured in a CUDA
graph too. `linear` dispatches by the KernelConfig."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from pegainfer.engine.kernels import linear as L
from pegainfer.engine.kernels.config import KernelConfig, LinearTiling

CPU_SIZES = (2, 3, 7, 16, 17, 33, 64, 100, 255, 256, 1000)
# small enough for the interpreter: K 200 is 4 chunks of 64 (the last 8 long, inside a 32-wide K
# block); at N 96 the programs target puts 1-16 rows on split chunks and 17+ on one program each
SMALL = LinearTiling(block_k=32, k_chunk=64, block_n_min=16, block_n_max=64, programs=12)
INTERP_SIZES = (1, 5, 16, 17, 40)
# the lite preset's projections, (N, K): o_proj, q/kv_a, shared gate_up, LM head, shared down (one
# expert, two), dense down, dense gate_up
LITE = ((2048, 2048), (3648, 2048), (2816, 2048), (102400, 2048), (2048, 1408), (2048, 2816), (2048, 10944),
        (21888, 2048))
# the tiny preset's (the GPU tests' engine): q_proj, kv_a, both fused, kv_b, o_proj, dense gate_up and down, shared
# gate_up and down, LM head; K 32 is less than one block_k
TINY = ((96, 64), (40, 64), (136, 64), (128, 32), (64, 64), (256, 64), (64, 128), (128, 64), (1024, 64))
GPU_SIZES = (1, 2, 7, 16, 33, 64, 128, 255, 256, 1024, 4096)
GPU_SIZES_F32 = (1, 2, 7, 16, 33, 64, 128, 255, 256)  # float32 sums on FMA units: the large sizes take minutes


def crowd_mismatches(fn, row: torch.Tensor, sizes, gen: torch.Generator, device: str = "cpu") -> list[int]:
    """The sizes M at which fn(batch)[p] != fn(row) bitwise, the batch being M random rows with
    `row` [1, K] at a random position p."""
    alone = fn(row)[0]
    bad = []
    for m in sizes:
        batch = torch.randn(m, row.shape[1], generator=gen).to(device=device, dtype=row.dtype)  # [M, K]
        p = int(torch.randint(m, (1,), generator=gen))
        batch[p] = row[0]
        if not torch.equal(fn(batch)[p], alone):
            bad.append(m)
    return bad


def assert_close_to_f_linear(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    ref = F.linear(x.float(), w.float())
    tol = 1e-2 if x.dtype == torch.bfloat16 else 1e-5  # bf16: the output's own rounding
    assert y.dtype == x.dtype and y.shape == ref.shape
    assert (y.float() - ref).abs().max() <= tol * ref.abs().max()


# --- the torch form, CPU ---

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocked_rows_are_the_same_alone_and_in_any_crowd(gen, dtype):
    w = (torch.randn(130, 300, generator=gen) * 0.05).to(dtype)
    row = torch.randn(1, 300, generator=gen).to(dtype)
    assert crowd_mismatches(lambda x: L.blocked(x, w), row, CPU_SIZES, gen) == []
    x = torch.randn(37, 300, generator=gen).to(dtype)
    assert_close_to_f_linear(L.blocked(x, w), x, w)


def test_linear_dispatch_on_cpu(gen):
    w = torch.randn(48, 64, generator=gen)
    x = torch.randn(2, 3, 64, generator=gen)
    assert torch.equal(L.linear(x, w, KernelConfig()), L.blocked(x.view(6, 64), w).view(2, 3, 48))
    off = KernelConfig(batch_invariant=False)
    assert torch.equal(L.linear(x, w, off), F.linear(x, w))


def test_float32_out_keeps_the_sums_on_cpu(gen):
    """out_dtype float32 (the LM head's logits): the sums of the bf16 products, not rounded to bf16,
    in both the invariant form (one order in any crowd) and the opt-out."""
    w = (torch.randn(130, 300, generator=gen) * 0.05).to(torch.bfloat16)
    x = torch.randn(37, 300, generator=gen).to(torch.bfloat16)
    ref = F.linear(x.float(), w.float())
    for k in (KernelConfig(), KernelConfig(batch_invariant=False)):
        y = L.linear(x, w, k, torch.float32)
        assert y.dtype == torch.float32 and (y - ref).abs().max() <= 1e-5 * ref.abs().max()
        assert (y != y.to(torch.bfloat16).float()).any()  # not rounded
    row = torch.randn(1, 300, generator=gen).to(torch.bfloat16)
    assert crowd_mismatches(lambda t: L.linear(t, w, KernelConfig(), torch.float32), row, CPU_SIZES, gen) == []
    assert L.linear(x, w, KernelConfig(), torch.bfloat16).dtype == torch.bfloat16  # its own dtype: as before


# --- the plan: which walk and column block a call takes (no bits depend on it) ---

def test_plan_spreads_one_row_over_the_gpu_and_keeps_many_rows_whole():
    t = LinearTiling()
    one_row = {(n, k): L.plan(1, n, k, t) for n, k in LITE}
    assert one_row[(102400, 2048)] == L.Plan(128, 8, False)  # the LM head fills the GPU with columns
    assert one_row[(21888, 2048)] == L.Plan(64, 8, False)
    for nk in ((2048, 2048), (3648, 2048), (2816, 2048), (2048, 1408), (2048, 2816), (2048, 10944)):
        assert one_row[nk].split and one_row[nk].programs(1, nk[0], t) >= t.programs, nk
    assert not L.plan(256, 2048, 2048, t).split and not L.plan(4096, 2048, 10944, t).split
    assert L.plan(5, 2048, 200, t) == L.Plan(32, 1, False)  # one chunk: nothing to split


# --- the Triton kernel in the interpreter ---

triton_only = pytest.mark.skipif(L.triton is None,
                                 reason="triton is a GPU-side dependency; CI installs it for the interpreter")


@triton_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [64, 200])
@pytest.mark.parametrize("n", [48, 96])
def test_kernel_rows_are_the_same_alone_and_in_any_crowd(triton_interpreter, request, gen, dtype, k, n):
    if dtype == torch.bfloat16:
        request.getfixturevalue("bf16_as_gpu")
    w = (torch.randn(n, k, generator=gen) * 0.05).to(dtype)
    row = torch.randn(1, k, generator=gen).to(dtype)
    assert crowd_mismatches(lambda x: L.triton_linear(x, w, SMALL), row, INTERP_SIZES, gen) == []
    x = torch.randn(23, k, generator=gen).to(dtype)
    assert_close_to_f_linear(L.triton_linear(x, w, SMALL), x, w)


@triton_only
def test_kernel_float32_out_is_the_total_its_bf16_out_rounds(triton_interpreter, bf16_as_gpu, gen):
    """out_dtype float32: the same total the bf16 output is rounded from, in both walks."""
    w = (torch.randn(96, 200, generator=gen) * 0.05).to(torch.bfloat16)
    x = torch.randn(33, 200, generator=gen).to(torch.bfloat16)
    for t in (dataclasses.replace(SMALL, programs=1), dataclasses.replace(SMALL, programs=10**6)):
        wide, narrow = L.triton_linear(x, w, t, torch.float32), L.triton_linear(x, w, t)
        assert wide.dtype == torch.float32 and torch.equal(wide.to(torch.bfloat16), narrow)
        assert (wide != narrow.float()).any()
    row = torch.randn(1, 200, generator=gen).to(torch.bfloat16)
    assert crowd_mismatches(lambda b: L.triton_linear(b, w, SMALL, torch.float32), row, INTERP_SIZES, gen) == []


@triton_only
def test_the_sizes_cross_both_walks():
    plans = {m: L.plan(m, 96, 200, SMALL) for m in INTERP_SIZES}
    assert {p.split for p in plans.values()} == {True, False} and plans[1].chunks == 4
    assert {L.plan(m, 48, 200, SMALL).split for m in INTERP_SIZES} == {True}


@triton_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_walks_and_any_column_block_give_the_same_bits(triton_interpreter, request, gen, dtype):
    if dtype == torch.bfloat16:
        request.getfixturevalue("bf16_as_gpu")
    w = (torch.randn(96, 200, generator=gen) * 0.05).to(dtype)
    x = torch.randn(33, 200, generator=gen).to(dtype)
    whole, split = dataclasses.replace(SMALL, programs=1), dataclasses.replace(SMALL, programs=10**6)
    assert L.plan(33, 96, 200, whole) == L.Plan(64, 4, False) and L.plan(33, 96, 200, split) == L.Plan(16, 4, True)
    assert torch.equal(L.triton_linear(x, w, whole), L.triton_linear(x, w, split))


@triton_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tickets_sum_as_the_second_launch_does_and_leave_the_counters_at_zero(triton_interpreter, request,
                                                                                   gen, dtype):
    if dtype == torch.bfloat16:
        request.getfixturevalue("bf16_as_gpu")
    w = (torch.randn(96, 200, generator=gen) * 0.05).to(dtype)
    split = dataclasses.replace(SMALL, programs=10**6)
    launches = dataclasses.replace(split, ticket=False)
    for m in (1, 5, 33):
        x = torch.randn(m, 200, generator=gen).to(dtype)
        assert L.plan(m, 96, 200, split).split
        assert torch.equal(L.triton_linear(x, w, split), L.triton_linear(x, w, launches))
        assert torch.equal(L.triton_linear(x, w, split), L.triton_linear(x, w, dataclasses.replace(SMALL, programs=1)))
    assert int(L._tickets.counters[torch.device("cpu")].abs().sum()) == 0


def test_tickets_are_handed_out_in_turn_and_wrap(monkeypatch):
    monkeypatch.setattr(L, "TICKETS", 10)
    t = L._Tickets()
    cpu = torch.device("cpu")
    a, b = t.take(cpu, 4), t.take(cpu, 4)
    assert a.data_ptr() != b.data_ptr() and a.shape == (4,)
    c = t.take(cpu, 4)  # 8 + 4 > 10: back to the start
    assert c.data_ptr() == a.data_ptr()
    assert t.take(cpu, 11) is None  # more than there are: the second launch sums


@triton_only
def test_the_crowd_check_catches_an_order_chosen_by_row_count(triton_interpreter, gen):
    """The invariance check can fail: a kernel whose K chunks were chosen by M (as a library's
    split-K is) changes a row's bits."""
    w = torch.randn(96, 200, generator=gen) * 0.05
    row = torch.randn(1, 200, generator=gen)

    def by_rows(x):
        return L.triton_linear(x, w, dataclasses.replace(SMALL, k_chunk=64 if x.shape[0] == 1 else 32))
    assert crowd_mismatches(by_rows, row, (5, 17), gen) == [5, 17]


@triton_only
def test_kernel_edges(triton_interpreter, gen):
    w = torch.randn(48, 64, generator=gen)
    assert L.triton_linear(torch.randn(0, 64), w, SMALL).shape == (0, 48)
    with pytest.raises(ValueError):
        L.triton_linear(torch.randn(2, 64), w.to(torch.bfloat16), SMALL)  # dtypes differ
    with pytest.raises(ValueError):
        L.triton_linear(torch.randn(2, 48), w.t(), SMALL)  # w not contiguous
    with pytest.raises(ValueError):
        LinearTiling(block_k=64, k_chunk=96)


# --- the GPU ---

def _lite_weights(n: int, k: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    return (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("nk", LITE, ids=[f"n{n}-k{k}" for n, k in LITE])
def test_gpu_rows_are_the_same_alone_and_in_any_crowd(triton_gpu, dtype, nk):
    n, k = nk
    t = KernelConfig().linear
    g = torch.Generator(device="cuda").manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    w = _lite_weights(n, k, dtype, g)
    row = torch.randn(1, k, generator=gen).to(device="cuda", dtype=dtype)
    sizes = GPU_SIZES if dtype == torch.bfloat16 else GPU_SIZES_F32
    assert crowd_mismatches(lambda x: L.triton_linear(x, w, t), row, sizes, gen, "cuda") == []
    x = torch.randn(64, k, device="cuda", generator=g).to(dtype)
    assert_close_to_f_linear(L.triton_linear(x, w, t), x, w)
    whole, split = dataclasses.replace(t, programs=1), dataclasses.replace(t, programs=10**9)
    assert torch.equal(L.triton_linear(x, w, whole), L.triton_linear(x, w, split))  # both walks, two column blocks


@pytest.mark.parametrize("nk", TINY, ids=[f"n{n}-k{k}" for n, k in TINY])
def test_gpu_tiny_shapes_keep_their_bits_across_the_wide_row_blocks(triton_gpu, nk):
    """From wide_rows rows the kernel takes wide_block_m-row blocks (wgmma on Hopper, mma.sync below):
    at the tiny preset's shapes too, a row's bits must not change at that crossing (a prefill graph's
    padded bucket of 256 tokens against the same 221 tokens eagerly failed bitwise on an H100,
    tests/engine/test_gpu_prefill.py, 2026-12-05; this test separates the linear from the rest)."""
    n, k = nk
    t = KernelConfig().linear
    g = torch.Generator(device="cuda").manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    w = _lite_weights(n, k, torch.bfloat16, g)
    row = torch.randn(1, k, generator=gen).to(device="cuda", dtype=torch.bfloat16)
    sizes = (1, 16, 221, t.wide_rows - 1, t.wide_rows, t.wide_rows + 1, 1024)
    assert crowd_mismatches(lambda x: L.triton_linear(x, w, t), row, sizes, gen, "cuda") == []


def test_gpu_linear_dispatches_to_the_kernel(triton_gpu):
    g = torch.Generator(device="cuda").manual_seed(0)
    w = _lite_weights(2048, 2048, torch.bfloat16, g)
    x = torch.randn(3, 5, 2048, device="cuda", generator=g).to(torch.bfloat16)
    k = KernelConfig()
    assert torch.equal(L.linear(x, w, k), L.triton_linear(x.view(15, 2048), w, k.linear).view(3, 5, 2048))
    torch_form = L.blocked(x.view(15, 2048), w).view(3, 5, 2048)
    assert torch.equal(L.linear(x, w, dataclasses.replace(k, triton=False)), torch_form)
    assert torch.equal(L.linear(x, w, dataclasses.replace(k, batch_invariant=False)), F.linear(x, w))
    # float32 out: the kernel's total, and cuBLAS's float32 sums where the opt-out runs
    wide = L.linear(x, w, k, torch.float32)
    assert wide.dtype == torch.float32 and torch.equal(wide.to(torch.bfloat16), L.linear(x, w, k))
    ref = F.linear(x.float(), w.float())
    off = L.linear(x, w, dataclasses.replace(k, batch_invariant=False), torch.float32)
    assert off.dtype == torch.float32 and (off - ref).abs().max() <= 1e-4 * ref.abs().max()


@pytest.mark.parametrize("rows", [1, 256])  # o_proj: chunks split over programs at 1 row, one program at 256
def test_gpu_kernel_replays_in_a_cuda_graph(triton_gpu, rows):
    from pegainfer.engine.cuda_graphs import capture
    g = torch.Generator(device="cuda").manual_seed(0)
    w = _lite_weights(2048, 2048, torch.bfloat16, g)
    k = KernelConfig()
    assert L.plan(rows, 2048, 2048, k.linear).split == (rows == 1)
    static = torch.zeros(rows, 2048, device="cuda", dtype=torch.bfloat16)
    graph, out = capture(lambda: L.linear(static, w, k), None)
    for _ in range(3):
        x = torch.randn(rows, 2048, device="cuda", generator=g).to(torch.bfloat16)
        static.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, L.triton_linear(x, w, k.linear))


@pytest.mark.parametrize("nk", LITE, ids=[f"n{n}-k{k}" for n, k in LITE])
def test_gpu_tickets_give_the_second_launchs_bits_every_time(triton_gpu, nk):
    """The last program's sum reads every other program's part: a missing release or a stale L1 line
    would show as a different total in some of many repeats."""
    n, k = nk
    t = KernelConfig().linear
    g = torch.Generator(device="cuda").manual_seed(0)
    w = _lite_weights(n, k, torch.bfloat16, g)
    launches = dataclasses.replace(t, ticket=False)
    for rows in (1, 4):
        x = torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16)
        want = L.triton_linear(x, w, launches)
        outs = [L.triton_linear(x, w, t) for _ in range(50)]
        assert all(torch.equal(o, want) for o in outs), (rows, L.plan(rows, n, k, t))
    assert int(L._tickets.counters[w.device].abs().sum()) == 0
