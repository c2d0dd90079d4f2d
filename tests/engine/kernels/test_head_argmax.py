"""engine/kernels/head_argmax.py: the LM head and the greedy choice in one launch are
torch.argmax(F.linear(h, w)) with the logits rounded to the model dtype (or kept in float32: a tie
in bf16 that float32 breaks): a tie across blocks (the
first wins), a NaN logit (the first NaN wins), a vocabulary that is no whole number of blocks, the
ticket back at zero, one row only (Triton's CPU interpreter). On the GPU at lite's shape ([102,400,
2,048] bf16): the planted winner, the first of equal maxima, a logit within one bf16 step of
F.linear's max otherwise, and the same bits on each of 300 CUDA-graph replays."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.kernels.config import HeadTiling, KernelConfig  # noqa: E402


def test_head_argmax_is_linear_then_argmax(triton_interpreter, gen):
    from pegainfer.engine.kernels import head_argmax as ha
    from pegainfer.engine.kernels.ticket import tickets
    ticket = tickets(1, "cpu")
    hw = torch.randn(1000, 64, generator=gen)
    hh = torch.randn(1, 64, generator=gen)
    for tiling in (HeadTiling(32, 256), HeadTiling(16, 32), HeadTiling(64, 16)):
        assert ha.fits(hw, tiling)
        for dt in (torch.float32, torch.bfloat16):
            want = torch.argmax(F.linear(hh.to(dt), hw.to(dt)), dim=-1)
            assert torch.equal(ha.head_argmax(hh.to(dt), hw.to(dt), ticket, tiling), want), (tiling, dt)
            assert not ticket.any()
    default = KernelConfig().head
    tied = hw.clone()
    tied[900] = tied[37] = hh[0] * 3  # equal rows: equal logits in blocks 1 and 28
    assert ha.head_argmax(hh, tied, ticket, default).item() == 37 == torch.argmax(F.linear(hh, tied)).item()
    nan_w = hw.clone()
    nan_w[600, 3] = float("nan")
    nan_w[800, 0] = float("nan")
    assert ha.head_argmax(hh, nan_w, ticket, default).item() == 600 == torch.argmax(F.linear(hh, nan_w)).item()
    assert not ticket.any()
    # float32 logits (KernelConfig.float32_logits): logits 1 and 1 + 2^-9 (each weight exact in bf16)
    # round to one bf16 value (steps of 2^-7 above 1): rounded, the first index wins the tie; kept, the
    # larger one
    near = torch.zeros(1000, 64)
    near[:, 0] = -1.0
    near[5, 0] = near[700, 0] = 1.0
    near[700, 1] = 2 ** -9
    one = torch.zeros(1, 64)
    one[0, :2] = 1.0
    nb, ob = near.to(torch.bfloat16), one.to(torch.bfloat16)
    assert torch.equal(nb.float(), near)
    assert ha.head_argmax(ob, nb, ticket, default, round_logits=False).item() == 700
    assert ha.head_argmax(ob, nb, ticket, default).item() == 5
    assert not ticket.any()
    with pytest.raises(ValueError, match="one row"):
        ha.head_argmax(torch.randn(2, 64), hw, ticket, default)
    assert not ha.fits(torch.randn(64, 1000)[:, :48].contiguous(), HeadTiling(32, 32)) and not ha.fits(hw.T, default)


V, K = 102400, 2048


def test_gpu_head_argmax_is_linear_then_argmax(triton_gpu):
    from pegainfer.engine.cuda_graphs import capture
    from pegainfer.engine.kernels import head_argmax
    from pegainfer.engine.kernels.ticket import tickets
    tiling = KernelConfig().head
    g = torch.Generator(device="cuda").manual_seed(0)
    ticket = tickets(1, "cuda")
    w = (torch.randn(V, K, device="cuda", generator=g) * K ** -0.5).to(torch.bfloat16)
    for seed, win in enumerate((0, 777, 51200, V - 1)):
        h = torch.randn(1, K, device="cuda", generator=g).to(torch.bfloat16)
        planted = w.clone()
        planted[win] = (h[0].float() * 4 / h.float().norm()).to(torch.bfloat16)  # logit 4|h| ~ 180; the rest ~N(0, 1)
        want = torch.argmax(F.linear(h, planted), dim=-1)
        assert want.item() == win
        assert torch.equal(head_argmax.head_argmax(h, planted, ticket, tiling), want), seed
        assert not ticket.any()
    h = torch.randn(1, K, device="cuda", generator=g).to(torch.bfloat16)
    tied = w.clone()
    tied[90000] = tied[12] = (h[0].float() * 4 / h.float().norm()).to(torch.bfloat16)
    assert head_argmax.head_argmax(h, tied, ticket, tiling).item() == 12  # the first of equal maxima
    for _ in range(8):  # no planted winner: a logit within one bf16 step of F.linear's max
        h = torch.randn(1, K, device="cuda", generator=g).to(torch.bfloat16)
        logits = F.linear(h, w)[0].float()
        pick = head_argmax.head_argmax(h, w, ticket, tiling).item()
        top = logits.max()
        assert top - logits[pick] <= top.abs() * 2 ** -7, (pick, logits[pick].item(), top.item())
    out = torch.empty(1, dtype=torch.int64, device="cuda")
    first = head_argmax.head_argmax(h, w, ticket, tiling).clone()
    graph, _ = capture(lambda: head_argmax.head_argmax(h, w, ticket, tiling, out=out), None)
    for _ in range(300):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first) and not ticket.any()
