"""The Triton decode and packed-prefill attention kernels compute the reference function (run by Triton's CPU interpreter here;
the same code runs compiled on the GPU)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import torch
import torch.nn.functional as F
from engine.kernels.mla_decode import mla_decode
from engine.kernels.rmsnorm import rmsnorm
from engine.model import rms_norm
g = torch.Generator().manual_seed(0)

# rmsnorm, with and without the fused residual add
x = torch.randn(5, 96, generator=g)
r = torch.randn(5, 96, generator=g)
w = 1 + 0.1 * torch.randn(96, generator=g)
out, res = rmsnorm(x, w, 1e-6, residual=r)
assert torch.allclose(res, x + r, atol=1e-6)
assert torch.allclose(out, rms_norm(x + r, w, 1e-6), atol=1e-5), (out - rms_norm(x + r, w, 1e-6)).abs().max()
out, same = rmsnorm(x, w, 1e-6)
assert same is x or torch.equal(same, x)
assert torch.allclose(out, rms_norm(x, w, 1e-6), atol=1e-5)

# split-K partial sums (tools/gemv_bench.py's kernel): their sum in order is the product
from engine.kernels import gemv
xs = torch.randn(3, 300, generator=g)
wo = torch.randn(96, 300, generator=g)
for tiling in (gemv.Tiling(16, 128, 2), gemv.Tiling(32, 64, 4)):  # 4 splits of 75 padded to 128: one runs empty
    parts = gemv.splitk_parts(xs, wo, tiling)
    assert parts.shape == (tiling.split, 3, 96) and torch.allclose(parts.sum(0), xs @ wo.T, atol=1e-4)
try:
    gemv.splitk_parts(torch.randn(5, 300), wo)
    raise AssertionError("5 rows accepted")
except ValueError:
    pass

# MLA decode against a direct softmax over each row's own length
B, H, RANK, ROPE, SLOTS, N = 3, 16, 64, 16, 4, 80
cache = torch.randn(SLOTS, N, RANK + ROPE, generator=g)
q = torch.randn(B, H, RANK + ROPE, generator=g)
slots = torch.tensor([2, 0, 3])
lens = torch.tensor([1, 37, 80])
got = mla_decode(q, cache, slots, lens, length=80, scale=0.3, rank=RANK, split_len=32)
for b in range(B):
    kv = cache[slots[b], : lens[b]]
    p = ((q[b] @ kv.T) * 0.3).softmax(-1)
    want = p @ kv[:, :RANK]
    assert torch.allclose(got[b], want, atol=1e-4), (b, (got[b] - want).abs().max())

# both merge kernels, with W_UV applied, against the direct product
V = 24
w_uv = torch.randn(H, RANK, V, generator=g)
o_lat = mla_decode(q, cache, slots, lens, length=80, scale=0.3, rank=RANK, split_len=32)  # [B, H, RANK]
want = torch.einsum("bhr,hrv->bhv", o_lat, w_uv).reshape(B, H * V)
for merge in ("row", "block"):
    got = mla_decode(q, cache, slots, lens, length=80, scale=0.3, rank=RANK, split_len=32, w_uv_t=w_uv, merge=merge)
    assert torch.allclose(got, want, atol=1e-4), (merge, (got - want).abs().max())

# packed prefill attention: prompts of 1, 70 and 5 tokens back to back, then 3 padding tokens (each
# a prompt of its own at position 0), against SDPA per prompt; the 70-token prompt crosses key blocks
import torch.nn.functional as F
from engine.kernels.prefill_attention import packed_causal_attention
lens, pads = [1, 70, 5], 3
T, NH, NOPE, ROPE, V = sum(lens) + pads, 3, 16, 8, 12
q = torch.randn(T, NH, NOPE + ROPE, generator=g)
kvb = torch.randn(T, NH, NOPE + V, generator=g)  # the expanded [k_nope | v] of each head, as kv_b makes it
k_nope, v = kvb.split([NOPE, V], dim=-1)
kv = torch.randn(T, 20 + ROPE, generator=g)  # latent (20) then the roped key
k_pe = kv[:, 20:]
positions = torch.cat([torch.arange(n) for n in lens] + [torch.zeros(pads, dtype=torch.int64)])
got = packed_causal_attention(q, k_nope, k_pe, v, positions, 0.25)
start = 0
for n in lens + [1] * pads:
    sl = slice(start, start + n)
    k = torch.cat([k_nope[sl], k_pe[sl, None, :].expand(n, NH, ROPE)], dim=-1)
    want = F.scaled_dot_product_attention(q[sl].transpose(0, 1), k.transpose(0, 1), v[sl].transpose(0, 1),
                                          is_causal=True, scale=0.25).transpose(0, 1)
    assert torch.allclose(got[sl], want, atol=1e-5), (n, (got[sl] - want).abs().max())
    start += n

# the packed prefill step of the tiny model with that kernel equals the dense-mask path
from engine.engine import EngineSpec, build_engine
from engine.prefill import PrefillInputs, prefill_logits
engine = build_engine(EngineSpec(random_preset="tiny", num_slots=4))
model, cache = engine.model, engine.cache
ids = torch.randint(0, 1000, (T,), generator=g)
rows = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)] + [torch.arange(10, 10 + pads)])
slots = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)] + [torch.full((pads,), cache.scratch_slot)])
last = torch.tensor([0, 70, 75])
inp = PrefillInputs(ids, positions, slots, rows, last)
masked = prefill_logits(model, inp, cache)
for layer in model.layers:
    layer.attn.fused_prefill = True
fused = prefill_logits(model, inp, cache)
assert torch.allclose(fused, masked, rtol=1e-5, atol=1e-5), (fused - masked).abs().max()
# the layer's input in one launch (norm_proj): the residual add (none, a delta, or a MoE layer's
# routes in order plus its shared experts), the norm, and the q/kv_a projection, against the norm
# kernels and F.linear; a width that is not a multiple of the block
from engine.kernels.norm_proj import norm_proj
from engine.kernels.rmsnorm import moe_rmsnorm
for dt in (torch.float32, torch.bfloat16):
    hid, n = 200, 37
    w = (torch.randn(n, hid, generator=g) / 8).to(dt)
    nw = (1 + 0.1 * torch.randn(hid, generator=g)).to(dt)
    res = torch.randn(1, hid, generator=g).to(dt)
    dense = torch.randn(1, hid, generator=g).to(dt)
    moe = (torch.randn(1, 3, hid, generator=g), torch.randn(1, hid, generator=g).to(dt))
    for delta in (None, dense, moe):
        if delta is None:
            h_ref, x_ref = rmsnorm(res, nw, 1e-6)
        elif isinstance(delta, tuple):
            h_ref, x_ref = moe_rmsnorm(*delta, nw, 1e-6, residual=res)
        else:
            h_ref, x_ref = rmsnorm(delta, nw, 1e-6, residual=res)
        for block_k in (64, 256):  # K in chunks; the whole row in one tile (loaded before the norm)
            got, x_got = norm_proj(delta, res, nw, 1e-6, w, block_j=16, block_k=block_k)
            want = F.linear(h_ref.float(), w.float())
            assert torch.equal(x_got, x_ref), (dt, type(delta))
            tol = 1e-5 if dt == torch.float32 else 2e-2
            assert got.shape == (1, n) and got.dtype == dt and torch.allclose(got.float(), want, rtol=tol, atol=tol), (
                dt, type(delta), block_k, (got.float() - want).abs().max())
    # the first layer's form: the row read from the embedding table by the token id, the same bits as
    # F.embedding then the launch; a delta beside a token is refused
    table = torch.randn(50, hid, generator=g).to(dt)  # [V, K]
    tok = torch.tensor([41])
    for block_k in (64, 256):
        got, x_got = norm_proj(None, table, nw, 1e-6, w, block_j=16, block_k=block_k, token=tok)
        want, x_want = norm_proj(None, F.embedding(tok, table), nw, 1e-6, w, block_j=16, block_k=block_k)
        assert torch.equal(x_got, x_want) and torch.equal(got, want) and torch.equal(x_got[0], table[41]), (dt, block_k)
    try:
        norm_proj(dense, table, nw, 1e-6, w, token=tok)
        raise AssertionError("a delta beside a token was accepted")
    except ValueError as err:
        assert "embedding row" in str(err)

# the one-launch greedy choice: torch.argmax, ties (the first of equal maxima, across and inside
# chunks), -inf rows, NaN (the first NaN wins, as in torch), strided rows; the tickets back at zero
from engine.kernels.argmax import MAX_ROWS, argmax
from engine.kernels.ticket import tickets
ticket = tickets(MAX_ROWS, "cpu")
x = torch.randn(6, 1000, generator=g)
x[1, 10] = x[1, 990] = x[1].max() + 1  # equal maxima in different chunks
x[2, 500] = x[2, 501] = x[2].max() + 1  # in one chunk
x[3] = float("-inf")
x[4, 700] = float("nan"); x[4, 900] = float("nan"); x[4, 5] = float("inf")
wide = torch.randn(3, 1100, generator=g)[:, :1000]  # strided rows
for logits in (x, x.to(torch.bfloat16), wide, x[:1]):
    assert torch.equal(argmax(logits, ticket), torch.argmax(logits, dim=-1)), logits.shape
    assert not ticket.any()
out = torch.full((6,), -1, dtype=torch.int64)
assert argmax(x, ticket, out=out) is out and torch.equal(out, torch.argmax(x, dim=-1))

# the LM head and the choice in one launch: torch.argmax(F.linear(h, w)) with the logits rounded to
# the model dtype; a tie across blocks (the first wins), a NaN logit (the first NaN wins), a vocabulary
# that is no whole number of blocks, the ticket back at zero; one row only
from engine.kernels import head_argmax as ha
hw = torch.randn(1000, 64, generator=g)
hh = torch.randn(1, 64, generator=g)
for tiling in (ha.Tiling(32, 256), ha.Tiling(16, 32), ha.Tiling(64, 16)):
    assert ha.fits(hw, tiling)
    for dt in (torch.float32, torch.bfloat16):
        want = torch.argmax(F.linear(hh.to(dt), hw.to(dt)), dim=-1)
        assert torch.equal(ha.head_argmax(hh.to(dt), hw.to(dt), ticket, tiling=tiling), want), (tiling, dt)
        assert not ticket.any()
tied = hw.clone(); tied[900] = tied[37] = hh[0] * 3  # equal rows: equal logits in blocks 1 and 28
assert ha.head_argmax(hh, tied, ticket).item() == 37 == torch.argmax(F.linear(hh, tied)).item()
nan_w = hw.clone(); nan_w[600, 3] = float("nan"); nan_w[800, 0] = float("nan")
assert ha.head_argmax(hh, nan_w, ticket).item() == 600 == torch.argmax(F.linear(hh, nan_w)).item()
assert not ticket.any()
try:
    ha.head_argmax(torch.randn(2, 64), hw, ticket)
    raise AssertionError("two rows accepted")
except ValueError as err:
    assert "one row" in str(err)
assert not ha.fits(torch.randn(64, 1000)[:, :48].contiguous(), ha.Tiling(32, 32)) and not ha.fits(hw.T)
print("ok")
"""


def test_kernels_match_reference_in_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
