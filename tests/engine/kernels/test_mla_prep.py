"""engine/kernels/mla_prep.py: the MLA decode prep in one launch. Directly: the normalised latent and
the roped shared key written to the cache at exactly (slot, position) of each row, and the absorbed
query (q_nope @ W_UK, then the roped q_pe), against the same arithmetic in torch. Through the
attention (MLAttention.absorbed_query, the q/kv_a projection then the prep): the same query and
cache entries as the torch path, nowhere else written, for the tiny preset's heads, the q LoRA path,
non-power-of-two head dims and bfloat16. Triton's CPU interpreter."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is a GPU-side dependency; CI installs it for the interpreter")

from pegainfer.engine.model.norm import rms_norm  # noqa: E402
from tests.engine.kernels.paging import paged, unpaged  # noqa: E402
from tests.engine.kernels import mla_cases  # noqa: E402


def _rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs rotated by the complex table rows: x [B, ..., R], table [B, R/2] complex64."""
    shape = table.shape[:1] + (1,) * (x.dim() - 2) + table.shape[1:]
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous()) * table.view(shape)
    return torch.view_as_real(z).flatten(-2).to(x.dtype)


@pytest.mark.parametrize("nh,nope,rope,rank", [(4, 16, 8, 32), (3, 12, 6, 40)])
def test_prep_writes_the_cache_entries_and_makes_the_absorbed_query(triton_interpreter, gen, nh, nope, rope, rank):
    from pegainfer.engine.kernels.mla_prep import mla_prep
    b, slots_n, max_len = 19, 6, 40  # two row blocks of 16
    q = torch.randn(b, nh * (nope + rope) + 5, generator=gen)[:, :nh * (nope + rope)]  # strided rows
    kv = torch.randn(b, rank + rope, generator=gen)
    kv_norm = 1 + 0.1 * torch.randn(rank, generator=gen)
    w_uk = torch.randn(nh, nope, rank, generator=gen)
    table = torch.polar(torch.ones(max_len, rope // 2), torch.rand(max_len, rope // 2, generator=gen) * 6)  # [L, R/2]
    cells = torch.randperm(slots_n * max_len - 1, generator=gen)[:b] + 1  # distinct (slot, position) cells
    cells[0] = 0  # one row at position 0
    slots, positions = cells // max_len, cells % max_len
    cache = torch.randn(slots_n, max_len, rank + rope, generator=gen)
    before = cache.clone()
    pages, page_table = paged(cache, page=16)  # through a table of scrambled 16-position pages
    got = mla_prep(q, kv, kv_norm, w_uk, table, positions, slots, pages, pages=page_table)
    cache = unpaged(pages, page_table, max_len)
    n = b
    latent = rms_norm(kv[:, :rank], kv_norm, 1e-6)  # [n, rank]
    k_pe = _rope(kv[:, rank:], table[positions])  # [n, rope]
    touched = torch.zeros(cache.shape[:2], dtype=torch.bool)
    touched[slots, positions] = True
    assert torch.equal(cache[~touched], before[~touched])
    torch.testing.assert_close(cache[slots, positions], torch.cat([latent, k_pe], dim=-1), rtol=1e-5, atol=1e-5)
    qh = q.view(n, nh, nope + rope)
    q_lat = torch.einsum("bhn,hnr->bhr", qh[..., :nope], w_uk)  # [n, nh, rank]
    want = torch.cat([q_lat, _rope(qh[..., nope:], table[positions])], dim=-1)
    assert got.shape == (n, nh, rank + rope)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides,dtype,positions,seed", mla_cases.CASES, ids=mla_cases.IDS)
def test_absorbed_query_matches_the_torch_path(triton_interpreter, request, overrides, dtype, positions, seed):
    if dtype == torch.bfloat16:
        request.getfixturevalue("bf16_as_gpu")
    c = mla_cases.case(overrides, dtype, positions, seed)
    inp = c.inp
    q_ref, q_got, c_ref, c_got = c.both(lambda attn, cache: attn.absorbed_query(c.x, inp.positions, inp.slots, cache))
    assert q_got.shape == (c.x.shape[0], c.cfg.num_attention_heads, c.cfg.cache_width) and q_got.dtype == dtype
    mla_cases.same(q_got, q_ref)
    touched = torch.zeros(c.cache.data.shape[:3], dtype=torch.bool)  # [L, pages+1, P]
    p = c.cache.page_size
    touched[mla_cases.LAYER, c.cache.table[inp.slots, inp.positions // p].long(), inp.positions % p] = True
    assert torch.equal(c_got[~touched], c.cache.data[~touched]), "the prep kernel wrote outside (slot, position)"
    assert not torch.equal(c_ref[touched], c.cache.data[touched])
    mla_cases.same(c_got[touched], c_ref[touched])
