"""Batch-invariant causal attention in torch (any device; the CPU's serving path): every query's
output depends only on its own row, its prompt's keys up to its position and that position, never
on the other queries of the call, how its prompt was chunked or packed, or how many keys the others
see (issue 26). The Triton form for CUDA is engine/kernels/prefill_attention.py (`prompt_attention`).

How the reduction order is pinned:
- queries sit in blocks of QB rows aligned to their prompt's positions (a query at position p is row
  p % QB of block p // QB; the rest of a block is zero rows), keys in blocks of KB aligned to the
  prompt's start (key position c is column c % KB of block c // KB);
- every score is one element of an identical [QB, D] x [D, KB] problem and every value sum one
  element of an identical [QB, KB] x [KB, V + 1] problem, all run as one batched GEMM per key
  block, so the BLAS meets the same shapes whatever the call holds (the same trick as
  engine/kernels/linear.py `blocked`); the extra value column of ones gives the denominator's block
  sum inside the same GEMM;
- key blocks are folded in order 0, 1, 2, ... with an online softmax in float32: a block beyond a
  query's own position is fully masked, so its running max stays, its rescale factor is exp(0) = 1
  and it adds exact zeros -- a query's bits do not depend on how many blocks its neighbours need.

Inputs are float32 or bfloat16 (widened exactly to float32); the output is rounded once to q's
dtype, as the reference's attention rounds its output."""
from __future__ import annotations

import bisect
import dataclasses

import torch

QB = 16  # query rows per block
KB = 64  # keys per block
BUDGET = 1 << 24  # float32 elements of one key block's gathered operands across a group of query blocks


@dataclasses.dataclass(frozen=True, slots=True)
class Segment:
    """Queries q[q_start : q_start + length] of one prompt at positions pos0, pos0 + 1, ...; they see
    the key bank's rows kbase .. kbase + position (the prompt's keys from its position 0)."""
    q_start: int
    length: int
    pos0: int
    kbase: int


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: list[Segment],
              scale: float) -> torch.Tensor:
    """q: [T, nh, D]; k: [N, nh, D] and v: [N, nh, V], the key bank; segments cover q's rows.
    Returns [T, nh, V] in q's dtype (rows no segment covers are zeros)."""
    t, nh, d = q.shape
    n, vd = k.shape[0], v.shape[-1]
    dev = q.device
    qidx, qpos, kbase, nblocks = _blocks(segments, t)  # [NB, QB], [NB, QB], [NB], [NB]
    order = torch.argsort(nblocks, descending=True, stable=True)  # the blocks needing key block j: a prefix
    qidx, qpos, kbase, nblocks = qidx[order], qpos[order], kbase[order], nblocks[order]
    qf = torch.cat([q.float(), q.new_zeros(1, nh, d, dtype=torch.float32)])  # [T + 1, nh, D]: row T pads blocks
    kf = k.float()  # [N, nh, D]
    vf = torch.cat([v.float(), v.new_ones(n, nh, 1, dtype=torch.float32)], dim=-1)  # [N, nh, V + 1]
    out = torch.zeros(t + 1, nh, vd, dtype=q.dtype, device=dev)
    group = max(1, BUDGET // (nh * KB * (d + vd + 1)))  # query blocks per group
    counts = nblocks.tolist()
    for g0 in range(0, len(counts), group):
        g1 = min(g0 + group, len(counts))
        o = _group(qf, kf, vf, qidx[g0:g1].to(dev), qpos[g0:g1].to(dev), kbase[g0:g1].to(dev), counts[g0:g1], scale)
        out[qidx[g0:g1].to(dev).view(-1)] = o.to(q.dtype).reshape(-1, nh, vd)
    return out[:t]


def _group(qf: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor, qidx: torch.Tensor, qpos: torch.Tensor,
           kbase: torch.Tensor, counts: list[int], scale: float) -> torch.Tensor:
    """One group of query blocks (sorted by key blocks needed, most first) -> [G, QB, nh, V] float32."""
    g = qidx.shape[0]
    n, nh, d = kf.shape
    vd1 = vf.shape[-1]
    dev = qf.device
    qb = qf[qidx.view(-1)].view(g, QB, nh, d).transpose(1, 2).contiguous()  # [G, nh, QB, D]
    m = torch.full((g, nh, QB), float("-inf"), device=dev)  # running max
    acc = torch.zeros(g, nh, QB, vd1, device=dev)  # [.., :V] the weighted values, [.., V] the denominator
    cols = torch.arange(KB, device=dev)
    for j in range(counts[0]):
        c = bisect.bisect_left(counts, -j, key=lambda x: -x)  # the blocks that see key block j (a prefix)
        kidx = (kbase[:c, None] + j * KB + cols).clamp_(max=n - 1).view(-1)  # [c * KB]
        kj = kf[kidx].view(c, KB, nh, d).permute(0, 2, 3, 1).reshape(c * nh, d, KB)  # [c * nh, D, KB]
        s = torch.bmm(qb[:c].view(c * nh, QB, d), kj).view(c, nh, QB, KB) * scale
        seen = (j * KB + cols)[None, None, :] <= qpos[:c, :, None]  # [c, QB, KB]
        s = s.masked_fill(~seen[:, None], float("-inf"))
        m_new = torch.maximum(m[:c], s.amax(dim=-1))  # [c, nh, QB]; key 0 is in block 0, so finite
        alpha = torch.exp(m[:c] - m_new)  # 0 at the first block, exactly 1 where a block is all masked
        p = torch.exp(s - m_new[..., None])  # masked keys: exactly 0
        vj = vf[kidx].view(c, KB, nh, vd1).transpose(1, 2).reshape(c * nh, KB, vd1)  # [c * nh, KB, V + 1]
        pv = torch.bmm(p.view(c * nh, QB, KB), vj).view(c, nh, QB, vd1)
        acc[:c] = acc[:c] * alpha[..., None] + pv
        m[:c] = m_new
    o = acc[..., :-1] / acc[..., -1:]  # [G, nh, QB, V]
    return o.transpose(1, 2)  # [G, QB, nh, V]


def _blocks(segments: list[Segment], t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The query blocks of every segment (on the host): the query row of each block slot (t: a zero
    row), each slot's position, the block's key bank base and how many key blocks it reads."""
    q_start, length, pos0, kbase = torch.tensor([[s.q_start, s.length, s.pos0, s.kbase] for s in segments]).T
    first, end = pos0 // QB, pos0 + length  # [S]: each segment's first block, its position bound
    nb = (end - 1) // QB - first + 1  # [S] blocks per segment
    seg = torch.repeat_interleave(torch.arange(len(segments)), nb)  # [NB] each block's segment
    block = first[seg] + torch.arange(seg.shape[0]) - (torch.cumsum(nb, 0) - nb)[seg]  # [NB] block number
    pos = block[:, None] * QB + torch.arange(QB)  # [NB, QB]
    real = (pos >= pos0[seg, None]) & (pos < end[seg, None])
    qidx = torch.where(real, q_start[seg, None] + pos - pos0[seg, None], t)
    top = torch.minimum(pos[:, -1], end[seg] - 1)  # the block's last real position
    return qidx, pos, kbase[seg], top // KB + 1
