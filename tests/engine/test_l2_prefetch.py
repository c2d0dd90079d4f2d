"""The L2 prefetch (engine/kernels/l2_prefetch.py) without a GPU: its launch plan covers every line
with at most the programs asked for, each layer names the weights it has in the order asked, and
the kernel compiles for the H200 (sm_90, Triton's own compiler and ptxas) to the L2 prefetch
instruction with or without the evict_last hint."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from engine.kernels import l2_prefetch  # noqa: E402


@pytest.mark.parametrize("nbytes,programs", [(1, 32), (128, 32), (8 * 2**20, 32), (23 * 2**20 + 5, 32), (2**20, 1)])
def test_the_plan_covers_every_line(nbytes, programs):
    lines, grid, per = l2_prefetch.plan(nbytes, programs)
    assert lines * l2_prefetch.LINE >= nbytes > (lines - 1) * l2_prefetch.LINE
    assert 1 <= grid <= programs and per % l2_prefetch.BLOCK == 0
    assert grid * per >= lines and (grid - 1) * per < lines  # no program without a line of its own


def test_layers_name_their_weights_in_order(tiny_model_dir):
    from engine.engine import EngineSpec, build_engine
    e = build_engine(EngineSpec(model_dir=str(tiny_model_dir), device="cpu", dtype="float32"))
    try:
        dense, moe = e.model.layers[0], e.model.layers[-1]
        assert [t.data_ptr() for t in moe.decode_weights(("shared_down", "o_proj", "gate"))] == [
            moe.mlp.shared.down.data_ptr(), moe.attn.o_proj.data_ptr(), moe.mlp.gate_weight.data_ptr()]
        assert [t.data_ptr() for t in dense.decode_weights(l2_prefetch.NAMES)] == [
            dense.attn.q_kv_a.data_ptr(), dense.attn.w_uv_t.data_ptr(), dense.attn.o_proj.data_ptr()]
        assert e.model.prefetch_stream is None  # CPU: nothing to prefetch
    finally:
        e.close()


@pytest.mark.parametrize("evict_last", [True, False])
def test_the_kernel_compiles_to_the_l2_prefetch(evict_last):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig = {"src_ptr": "*u8", "n_lines": "i32", "lines_per_program": "i32", "EVICT_LAST": "constexpr",
           "LINE": "constexpr", "BLOCK": "constexpr"}
    src = ASTSource(fn=l2_prefetch._prefetch_kernel, signature=sig,
                    constexprs={"EVICT_LAST": evict_last, "LINE": l2_prefetch.LINE, "BLOCK": l2_prefetch.BLOCK})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    hint = "prefetch.global.L2::evict_last [" if evict_last else "prefetch.global.L2 ["
    assert ptx.count(hint) == l2_prefetch.BLOCK // 128  # 4 warps: one line per thread per instruction
