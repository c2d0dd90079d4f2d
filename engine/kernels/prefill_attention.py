"""Causal attention over fresh prompts packed back to back (the prefill graphs' layout), flash-style:
each program takes a block of query tokens and one head, and walks only the keys its block can see,
from the first token of its earliest prompt to its last query; a key counts for a query when it is
in the same prompt (index >= the query's prompt start, which is index - position) and not after it.
So a step of many short prompts costs the sum of their squared lengths, not the square of the pack
(a dense [T, T] mask through SDPA cost ~4x the rest of the prefill step at 8,192 tokens).

MLA layout: the query is [nope | rope] per head, the key is the head's expanded nope part plus the
token's one roped key shared by all heads, the value is the head's expanded value; scores are the
two dot products summed, in float32, with an online softmax.

Two forms. `packed_causal_attention` (KernelConfig.batch_invariant off) blocks the keys by their
index in the pack, so a token's sums depend on where its prompt starts. `prompt_attention` (the
batch-invariant form, issue 26) takes queries and a separate key bank, each query with its position
and its prompt's first key in the bank: a program's query tile is cut into runs of one prompt, and
each run walks its own prompt's keys in blocks of BLOCK_N from the prompt's position 0, so every
query meets the same key blocks in the same order whatever shares its tile, wherever its prompt
sits, and whether the keys are the pack's own (a fresh prompt) or expanded from the cache (a later
chunk). Blocks past a query's position are fully masked: its running max stays, the rescale is
exp2(0) = 1 and it adds zeros, so how far its neighbours reach does not touch its bits."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 64


@triton.jit
def _packed_kernel(q_ptr, k_ptr, pe_ptr, v_ptr, pos_ptr, out_ptr, T, scale,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_pt, stride_vt, stride_vh, stride_ot, stride_oh,
                   NOPE: tl.constexpr, ROPE: tl.constexpr, V: tl.constexpr,
                   NOPE_P: tl.constexpr, ROPE_P: tl.constexpr, V_P: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # NOPE_P, ROPE_P, V_P: the head dims padded to powers of two (the padding loads zeros)
    pid = tl.program_id(0)
    h = tl.program_id(1)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    r_ok = rows < T
    pos = tl.load(pos_ptr + rows, mask=r_ok, other=0)
    first = tl.where(r_ok, rows - pos, T)  # each query's prompt start
    lo = tl.min(first, axis=0)
    lo = (lo // BLOCK_N) * BLOCK_N
    hi = tl.minimum(pid * BLOCK_M + BLOCK_M, T)
    dn, dr, dv = tl.arange(0, NOPE_P), tl.arange(0, ROPE_P), tl.arange(0, V_P)
    q_row = q_ptr + rows[:, None].to(tl.int64) * stride_qt + h * stride_qh
    q_n = tl.load(q_row + dn[None, :], mask=r_ok[:, None] & (dn[None, :] < NOPE), other=0.0)  # [M, NOPE_P]
    q_p = tl.load(q_row + NOPE + dr[None, :], mask=r_ok[:, None] & (dr[None, :] < ROPE), other=0.0)  # [M, ROPE_P]
    qk_scale = scale * 1.4426950408889634  # softmax in base 2
    m = tl.full([BLOCK_M], -1.0e30, tl.float32)
    lsum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, V_P], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        c_ok = cols < hi
        c64 = cols.to(tl.int64)
        k_n = tl.load(k_ptr + c64[None, :] * stride_kt + h * stride_kh + dn[:, None],
                      mask=c_ok[None, :] & (dn[:, None] < NOPE), other=0.0)  # [NOPE_P, N]
        k_p = tl.load(pe_ptr + c64[None, :] * stride_pt + dr[:, None],
                      mask=c_ok[None, :] & (dr[:, None] < ROPE), other=0.0)  # [ROPE_P, N]
        s = tl.dot(q_n, k_n) + tl.dot(q_p, k_p)  # [M, N] float32
        seen = (cols[None, :] >= first[:, None]) & (cols[None, :] <= rows[:, None])
        s = tl.where(seen, s * qk_scale, -1.0e30)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)  # a row whose keys were all hidden so far: its sums are dropped here
        lsum = lsum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + c64[:, None] * stride_vt + h * stride_vh + dv[None, :],
                    mask=c_ok[:, None] & (dv[None, :] < V), other=0.0)  # [N, V_P]
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out = acc / lsum[:, None]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_ot + h * stride_oh + dv[None, :],
             out.to(out_ptr.dtype.element_ty), mask=r_ok[:, None] & (dv[None, :] < V))


def packed_causal_attention(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor,
                            positions: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [T, nh, nope + rope]; k_nope: [T, nh, nope]; k_pe: [T, rope] (shared by the heads);
    v: [T, nh, v]; positions: [T] int64, each token's index within its own prompt (prompts back to
    back, each from position 0; a padding token at position 0 is a prompt of its own).
    Returns [T, nh, v] in q's dtype. Graph-safe: one launch, no host synchronisation."""
    t, nh, width = q.shape
    nope, rope, vd = k_nope.shape[-1], k_pe.shape[-1], v.shape[-1]
    assert width == nope + rope and q.stride(-1) == k_nope.stride(-1) == k_pe.stride(-1) == v.stride(-1) == 1
    out = torch.empty(t, nh, vd, dtype=q.dtype, device=q.device)
    p2 = triton.next_power_of_2
    _packed_kernel[(triton.cdiv(t, BLOCK_M), nh)](
        q, k_nope, k_pe, v, positions, out, t, scale,
        q.stride(0), q.stride(1), k_nope.stride(0), k_nope.stride(1), k_pe.stride(0), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        NOPE=nope, ROPE=rope, V=vd, NOPE_P=max(p2(nope), 16), ROPE_P=max(p2(rope), 16), V_P=max(p2(vd), 16),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4, num_stages=2)
    return out


@triton.jit
def _prompt_kernel(q_ptr, k_ptr, pe_ptr, v_ptr, pos_ptr, base_ptr, out_ptr, T, scale,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_pt, stride_vt, stride_vh, stride_ot, stride_oh,
                   NOPE: tl.constexpr, ROPE: tl.constexpr, V: tl.constexpr,
                   NOPE_P: tl.constexpr, ROPE_P: tl.constexpr, V_P: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    start = pid * BLOCK_M
    end = tl.minimum(start + BLOCK_M, T)
    rows = start + tl.arange(0, BLOCK_M)
    r_ok = rows < T
    pos = tl.load(pos_ptr + rows, mask=r_ok, other=0)
    base = tl.load(base_ptr + rows, mask=r_ok, other=-1)  # each query's prompt: its first key in the bank
    dn, dr, dv = tl.arange(0, NOPE_P), tl.arange(0, ROPE_P), tl.arange(0, V_P)
    q_row = q_ptr + rows[:, None].to(tl.int64) * stride_qt + h * stride_qh
    q_n = tl.load(q_row + dn[None, :], mask=r_ok[:, None] & (dn[None, :] < NOPE), other=0.0)  # [M, NOPE_P]
    q_p = tl.load(q_row + NOPE + dr[None, :], mask=r_ok[:, None] & (dr[None, :] < ROPE), other=0.0)  # [M, ROPE_P]
    qk_scale = scale * 1.4426950408889634  # softmax in base 2
    out = tl.zeros([BLOCK_M, V_P], tl.float32)
    cur = start
    while cur < end:  # one run of the tile's queries of one prompt at a time
        b = tl.load(base_ptr + cur)
        run_end = tl.min(tl.where(r_ok & (rows > cur) & (base != b), rows, end), axis=0)
        in_run = (rows >= cur) & (rows < run_end)
        hi = tl.max(tl.where(in_run, pos, -1), axis=0) + 1  # the run's keys: prompt positions [0, hi)
        m = tl.full([BLOCK_M], -1.0e30, tl.float32)
        lsum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, V_P], tl.float32)
        for n0 in range(0, hi, BLOCK_N):  # key blocks from the prompt's position 0
            cols = n0 + tl.arange(0, BLOCK_N)  # key positions
            c_ok = cols < hi
            c64 = (b + cols).to(tl.int64)
            k_n = tl.load(k_ptr + c64[None, :] * stride_kt + h * stride_kh + dn[:, None],
                          mask=c_ok[None, :] & (dn[:, None] < NOPE), other=0.0)  # [NOPE_P, N]
            k_p = tl.load(pe_ptr + c64[None, :] * stride_pt + dr[:, None],
                          mask=c_ok[None, :] & (dr[:, None] < ROPE), other=0.0)  # [ROPE_P, N]
            s = tl.dot(q_n, k_n) + tl.dot(q_p, k_p)  # [M, N] float32
            s = tl.where(cols[None, :] <= pos[:, None], s * qk_scale, -1.0e30)
            m_new = tl.maximum(m, tl.max(s, axis=1))  # key 0 is in the first block: finite from there on
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m - m_new)
            lsum = lsum * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + c64[:, None] * stride_vt + h * stride_vh + dv[None, :],
                        mask=c_ok[:, None] & (dv[None, :] < V), other=0.0)  # [N, V_P]
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        out = tl.where(in_run[:, None], acc / lsum[:, None], out)
        cur = run_end
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_ot + h * stride_oh + dv[None, :],
             out.to(out_ptr.dtype.element_ty), mask=r_ok[:, None] & (dv[None, :] < V))


def prompt_attention(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, v: torch.Tensor, *,
                     positions: torch.Tensor, bases: torch.Tensor, scale: float) -> torch.Tensor:
    """The batch-invariant form. q: [T, nh, nope + rope], queries of any prompts, each prompt's
    queries contiguous; k_nope: [N, nh, nope], k_pe: [N, rope] (shared by the heads), v: [N, nh, v],
    the key bank; positions: [T] int64, each query's position in its prompt; bases: [T] int64, the
    bank index of its prompt's position 0 (it sees bank rows bases .. bases + position). A pack of
    fresh prompts is its own bank (bases = index - position). Returns [T, nh, v] in q's dtype.
    Graph-safe: one launch, no host synchronisation."""
    t, nh, width = q.shape
    nope, rope, vd = k_nope.shape[-1], k_pe.shape[-1], v.shape[-1]
    assert width == nope + rope and q.stride(-1) == k_nope.stride(-1) == k_pe.stride(-1) == v.stride(-1) == 1
    out = torch.empty(t, nh, vd, dtype=q.dtype, device=q.device)
    p2 = triton.next_power_of_2
    _prompt_kernel[(triton.cdiv(t, BLOCK_M), nh)](
        q, k_nope, k_pe, v, positions, bases, out, t, scale,
        q.stride(0), q.stride(1), k_nope.stride(0), k_nope.stride(1), k_pe.stride(0), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1),
        NOPE=nope, ROPE=rope, V=vd, NOPE_P=max(p2(nope), 16), ROPE_P=max(p2(rope), 16), V_P=max(p2(vd), 16),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4, num_stages=2)
    return out
