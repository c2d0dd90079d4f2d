"""engine/model/blocked_attention.py: causal attention per prompt segment, within rounding of SDPA, and
bitwise the same for a query whatever else the call holds: its prompt's other queries or not, cut
into any segments, beside other prompts' queries and keys at any offsets, in groups of any size
(float32 and bfloat16, on the CPU's BLAS)."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from pegainfer.engine.model import blocked_attention as ba
from pegainfer.engine.model.blocked_attention import Segment

NH, D, V = 3, 24, 16


def _prompt(g: torch.Generator, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [n, NH, D], k [n, NH, D], v [n, NH, V]."""
    return tuple(torch.randn(n, NH, w, generator=g).to(dtype) for w in (D, D, V))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_it_is_causal_attention_per_prompt(dtype):
    g = torch.Generator().manual_seed(0)
    lens = [1, 70, 5, 200]
    prompts = [_prompt(g, n, dtype) for n in lens]
    q = torch.cat([p[0] for p in prompts])
    k = torch.cat([p[1] for p in prompts[::-1]])  # the bank in another order than the queries
    v = torch.cat([p[2] for p in prompts[::-1]])
    qs, ks = [0], [0]
    for n in lens:
        qs.append(qs[-1] + n)
    for n in lens[::-1]:
        ks.append(ks[-1] + n)
    kbase = {n: b for n, b in zip(lens[::-1], ks)}
    got = ba.attention(q, k, v, [Segment(s, n, 0, kbase[n]) for s, n in zip(qs, lens)], 0.3)
    assert got.dtype == dtype
    for (pq, pk, pv), s, n in zip(prompts, qs, lens):
        want = F.scaled_dot_product_attention(*(t.float().transpose(0, 1) for t in (pq, pk, pv)), is_causal=True,
                                              scale=0.3).transpose(0, 1)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got[s:s + n].float(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_query_is_the_same_in_any_call(dtype, monkeypatch):
    g = torch.Generator().manual_seed(1)
    rnd = random.Random(1)
    n = 300
    pq, pk, pv = _prompt(g, n, dtype)
    alone = ba.attention(pq, pk, pv, [Segment(0, n, 0, 0)], 0.3)
    for trial in range(12):
        if trial % 3 == 2:  # small groups: the same blocks in other batched GEMMs
            monkeypatch.setattr(ba, "BUDGET", rnd.choice([1, 5000, 40000]))
        else:
            monkeypatch.setattr(ba, "BUDGET", 1 << 24)
        # the prompt's queries in runs (chunks, single rows), some left out, beside other prompts
        cuts = sorted(rnd.sample(range(1, n), rnd.randint(0, 12)))
        runs = [(a, b) for a, b in zip([0, *cuts], [*cuts, n]) if rnd.random() < 0.8]
        others = [_prompt(g, rnd.randint(1, 150), dtype) for _ in range(rnd.randint(0, 5))]
        pieces = [("p", a, b) for a, b in runs] + [("o", i, None) for i in range(len(others))]
        rnd.shuffle(pieces)
        bank_parts, base = [], 0
        bank_order = [("p", None)] + [("o", i) for i in range(len(others))]
        rnd.shuffle(bank_order)
        bases = {}
        for kind, i in bank_order:
            kk, vv = (pk, pv) if kind == "p" else others[i][1:]
            bases[(kind, i)] = base
            bank_parts.append((kk, vv))
            base += kk.shape[0]
        k = torch.cat([b[0] for b in bank_parts])
        v = torch.cat([b[1] for b in bank_parts])
        qs, segs, where = [], [], []
        t = 0
        for kind, a, b in pieces:
            if kind == "p":
                qs.append(pq[a:b])
                segs.append(Segment(t, b - a, a, bases[("p", None)]))
                where.append((t, a, b))
            else:
                oq = others[a][0]
                qs.append(oq)
                segs.append(Segment(t, oq.shape[0], 0, bases[("o", a)]))
            t += qs[-1].shape[0]
        got = ba.attention(torch.cat(qs), k, v, segs, 0.3)
        for t0, a, b in where:
            assert torch.equal(got[t0:t0 + b - a], alone[a:b]), (trial, a, b)
