"""The LM head with the greedy choice in one launch (engine/kernels/head_argmax.py) on CUDA at lite's
shape ([102,400, 2,048] bf16), skipped without a GPU: the index of torch.argmax(F.linear(h, W)) where
the winner stands clear of rounding, the first of equal maxima, a logit within one bf16 step of
F.linear's max otherwise, the ticket back at zero, the same bits on each of 300 CUDA-graph replays,
and the tiny model's one-row graphed steps choosing what the F.linear + argmax form chooses.
Run on a GPU machine: pytest tests/engine/test_gpu_head_argmax.py"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; on the CPU the kernel runs in "
                                "Triton's interpreter in tests/engine/test_kernels.py")

V, K = 102400, 2048


def test_head_argmax_is_linear_then_argmax_on_the_gpu():
    from engine.cuda_graphs import capture
    from engine.kernels import head_argmax
    from engine.kernels.ticket import tickets
    g = torch.Generator(device="cuda").manual_seed(0)
    ticket = tickets(1, "cuda")
    w = (torch.randn(V, K, device="cuda", generator=g) * K ** -0.5).to(torch.bfloat16)
    for seed, win in enumerate((0, 777, 51200, V - 1)):
        h = torch.randn(1, K, device="cuda", generator=g).to(torch.bfloat16)
        planted = w.clone()
        planted[win] = (h[0].float() * 4 / h.float().norm()).to(torch.bfloat16)  # logit 4|h| ~ 180; the rest ~N(0, 1)
        want = torch.argmax(F.linear(h, planted), dim=-1)
        assert want.item() == win
        assert torch.equal(head_argmax.head_argmax(h, planted, ticket), want), seed
        assert not ticket.any()
    h = torch.randn(1, K, device="cuda", generator=g).to(torch.bfloat16)
    tied = w.clone()
    tied[90000] = tied[12] = (h[0].float() * 4 / h.float().norm()).to(torch.bfloat16)
    assert head_argmax.head_argmax(h, tied, ticket).item() == 12  # the first of equal maxima
    for _ in range(8):  # no planted winner: a logit within one bf16 step of F.linear's max
        h = torch.randn(1, K, device="cuda", generator=g).to(torch.bfloat16)
        logits = F.linear(h, w)[0].float()
        pick = head_argmax.head_argmax(h, w, ticket).item()
        top = logits.max()
        assert top - logits[pick] <= top.abs() * 2 ** -7, (pick, logits[pick].item(), top.item())
    out = torch.empty(1, dtype=torch.int64, device="cuda")
    first = head_argmax.head_argmax(h, w, ticket).clone()
    graph, _ = capture(lambda: head_argmax.head_argmax(h, w, ticket, out=out), None)
    for _ in range(300):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first) and not ticket.any()


def test_one_row_steps_choose_as_the_two_launch_form(monkeypatch, tiny_model_dir):
    """The tiny model on the GPU (bf16, CUDA graphs, Triton kernels), one row at a time: the same
    greedy tokens with the fused head as with F.linear + the argmax kernel."""
    from engine.engine import EngineSpec, build_engine
    from engine.generate import generate
    from engine.kernels import head_argmax
    prompts = [[5, 17, 300, 2], [900, 1, 44], [7] * 20]

    def tokens(rows: int) -> list[list[int]]:
        monkeypatch.setattr(head_argmax, "MAX_ROWS", rows)
        engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), device="cuda", dtype="bfloat16", num_slots=1))
        try:
            assert engine.runner.graphs is not None and engine.model.fused_kernels
            return [generate(engine, [p], 24, ignore_eos=True)[0].token_ids for p in prompts]
        finally:
            engine.close()

    assert tokens(1) == tokens(0)
