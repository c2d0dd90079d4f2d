"""The exchange format: packed rows round-trip byte for byte (the float32 weight is never rounded to
the model dtype), headers round-trip, and chunking covers every row once with bounded collectives."""
from __future__ import annotations

import pytest
import torch

from pegainfer.ep.scratch import Scratch
from pegainfer.ep.wire import (
    CMD_RUN,
    Header,
    chunk_major_order,
    chunk_sizes,
    n_chunks,
    pack_rows,
    row_bytes,
    rows_per_chunk,
    unpack_rows,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_rows_round_trip_bit_for_bit(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(5, 12, generator=g).to(dtype)
    weight = torch.rand(5, generator=g) * 1e-3 + 1.0  # not representable in bfloat16
    scratch = Scratch("cpu").take((9, row_bytes(12, dtype)), torch.uint8)
    packed = pack_rows(scratch, rows, weight)
    got_rows, got_weight = unpack_rows(packed.clone(), 12, dtype)
    assert got_rows.dtype == dtype and torch.equal(got_rows, rows)
    assert got_weight.dtype == torch.float32 and torch.equal(got_weight, weight)


def test_empty_rows_pack_and_unpack() -> None:
    packed = pack_rows(torch.empty(0, row_bytes(8, torch.float32), dtype=torch.uint8), torch.empty(0, 8),
                       torch.empty(0))
    rows, weight = unpack_rows(packed, 8, torch.float32)
    assert rows.shape == (0, 8) and weight.shape == (0,)


def test_header_round_trip() -> None:
    h = Header(CMD_RUN, 7, 3, 5, (0, 4, 1, 9), total_routes=40)
    assert Header.decode(h.encode(4)) == h


def test_chunks_bound_each_collective_and_cover_every_row_once() -> None:
    sizes = [7, 0, 3, 11]
    q = rows_per_chunk(chunk_bytes=100, bytes_per_row=10, n_peers=4)  # 100 B over 4 peers of 10 B rows
    assert q == 2
    chunks = [chunk_sizes(sizes, q, c) for c in range(n_chunks(sizes, q))]
    assert all(sum(cs) * 10 <= 100 for cs in chunks)
    assert [sum(col) for col in zip(*chunks)] == sizes
    order = chunk_major_order(sizes, q)
    assert sorted(order) == list(range(sum(sizes)))
    # chunk 0 holds the first q rows of every peer, peers in rank order
    assert order[:sum(chunks[0])] == [0, 1, 7, 8, 10, 11]


def test_one_chunk_is_the_identity_and_nothing_moves_for_no_rows() -> None:
    assert n_chunks([3, 4], 10) == 1 and chunk_major_order([3, 4], 10) == list(range(7))
    assert n_chunks([0, 0], 10) == 0
    assert rows_per_chunk(1, 1000, 3) == 1  # never zero rows per chunk


def test_scratch_grows_and_is_reused() -> None:
    s = Scratch("cpu")
    a = s.take((10, 4), torch.float32)
    cap = s.capacity
    b = s.take((5, 4), torch.float32)
    assert b.data_ptr() == a.data_ptr() and s.capacity == cap
    s.take((10000,), torch.float32)
    assert s.capacity >= 40000


def test_expert_kernel_follows_the_steps_routes_not_the_calls(monkeypatch) -> None:
    """Above max_routes routes in the whole step the triton kernel hands over to grouped GEMMs (not
    in batch-invariant mode: there every size stays on it), and below it the tiling is the whole
    step's: a rank that holds only a few of those routes must make the same choice as one rank
    holding them all."""
    import pytest
    import torch
    pytest.importorskip("triton")

    from pegainfer.engine.kernels import moe_experts
    from pegainfer.engine.kernels.config import ExpertTilings
    from pegainfer.ep import experts as experts_mod
    from pegainfer.ep.experts import ExpertKernel, ExpertShard
    chosen = []
    monkeypatch.setattr(experts_mod, "grouped_mm_available", lambda device: True)
    monkeypatch.setattr(moe_experts, "fused_experts", lambda *a: chosen.append(("triton", a[-1])))
    monkeypatch.setattr(ExpertShard, "_run_grouped", lambda self, *a: chosen.append(("grouped_mm", None)))
    shard = ExpertShard(range(2), {0: torch.zeros(2, 4, 3)}, {0: torch.zeros(2, 3, 2)})
    hidden, idx, w = torch.zeros(5, 3), torch.arange(5), torch.ones(5)
    tilings = ExpertTilings()
    big = tilings.max_routes + 1
    for invariant in (False, True):
        kernel = ExpertKernel("triton", tilings, batch_invariant=invariant)
        shard.run_routes(0, hidden, idx, w, [2, 3], kernel)  # the step is these 5 routes
        shard.run_routes(0, hidden, idx, w, [2, 3], kernel, total_routes=big)  # 5 of a larger step's
        shard.run_routes(0, hidden, idx, w, [2, 3], kernel, total_routes=tilings.max_routes)
        shard.run_routes(0, hidden, idx, w, [2, 3], kernel, total_routes=600)
        # above max_routes: grouped GEMMs, or in invariant mode the Triton kernels' wide tiling
        # (many_rows, above many_rows_min_routes: the same bits as the others)
        above = ("triton", tilings.tiling_for(big)) if invariant else ("grouped_mm", None)
        assert chosen == [("triton", tilings.tiling_for(5)), above, ("triton", tilings.tiling),
                          ("triton", tilings.tiling)], invariant
        chosen.clear()
    assert tilings.tiling_for(5).num_stages == 4 and tilings.tiling_for(5) != tilings.tiling_for(9)
