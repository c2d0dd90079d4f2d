"""Multi-head latent attention (MLA): queries (optionally through a q LoRA), the compressed latent
plus shared RoPE key written to the cache, and keys/values expanded from the cached latent. Three
forms of one computation: the reference over any rows (`__call__`), packed fresh prompts
(`prefill_packed`) and the absorbed decode over the latent cache (`decode_absorbed`, `decode_norm`);
whether the Triton kernels run inside them, and their launch shapes, come from the KernelConfig the
layer is built with.

Batch invariance (KernelConfig.batch_invariant, issue 26): every projection is
engine/kernels/linear.py `linear`, and the reference and the packed prompts compute one attention,
whose reduction order is fixed by each query's position in its own prompt: the Triton
`prompt_attention` with the Triton kernels, else engine/model/blocked_attention.py. Both read the
keys expanded from the prompt's latent (the pack's own for fresh prompts, the cache's for later
chunks and decode rows), so a token's bits are the same alone, packed, chunked or beside any rows.
Off: the library's SDPA and F.linear, as before."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pegainfer.engine.batch import Batch
from pegainfer.engine.config import ModelConfig
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.kernels.linear import linear
from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.model import blocked_attention
from pegainfer.engine.model.inputs import DecodeInputs
from pegainfer.engine.model.norm import add_norm, torch_rms_norm
from pegainfer.engine.model.rope import Rope


def _rms(x: torch.Tensor, weight: torch.Tensor, kernels: KernelConfig, eps: float = 1e-6) -> torch.Tensor:
    """The q/kv LoRA norms, with the reference's default eps (1e-6), not rms_norm_eps. Batch-invariant:
    each row's sum of squares is a pairwise sum of elementwise adds, in an order fixed by the width (a
    library reduction picks its split by the row count: on CUDA a lone row's 512 values are summed by
    512 threads, a crowd's by 32)."""
    return torch_rms_norm(x, weight, eps, kernels.batch_invariant)


# The Triton decode kernels hold every head of a row in one program: up to 64 heads fit the H200's
# shared memory (Lite has 16); DeepSeek-V2's 128 heads keep the torch absorbed path.
FUSED_MAX_HEADS = 64


class MLAttention:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor], rope: Rope, kernels: KernelConfig):
        a = f"model.layers.{layer}.self_attn"
        self.layer = layer
        self.nh = cfg.num_attention_heads
        self.nope, self.rope_dim, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.rank = cfg.kv_lora_rank
        self.scale = cfg.softmax_scale()
        self.rope = rope
        self.kernels = kernels
        self.fused_decode = kernels.triton and self.nh <= FUSED_MAX_HEADS  # the Triton MLA decode kernels
        self.fused_prefill = kernels.triton  # the Triton packed-prompt attention kernel
        self.invariant = kernels.batch_invariant
        # the output kernel's tickets (engine/kernels/mla_output.py, norm_linear.py), with fused_decode
        self.out_count = None
        if cfg.q_lora_rank is None:
            q_in = w.pop(f"{a}.q_proj.weight")  # [nh*192, H]
            self.q_a_norm = self.q_b = None
        else:
            q_in = w.pop(f"{a}.q_a_proj.weight")  # [q_rank, H]
            self.q_a_norm = w.pop(f"{a}.q_a_layernorm.weight")
            self.q_b = w.pop(f"{a}.q_b_proj.weight")  # [nh*192, q_rank]
        # the two projections of x share one weight, so the fused decode reads x in one GEMV; the
        # other paths use the two views as separate weights
        self.q_kv_a = torch.cat([q_in, w.pop(f"{a}.kv_a_proj_with_mqa.weight")])  # [nq + 576, H]
        q_view, self.kv_a = self.q_kv_a.split([q_in.shape[0], cfg.cache_width])  # [nq, H], [576, H]
        self.q_proj, self.q_a = (q_view, None) if self.q_b is None else (None, q_view)
        self.kv_a_norm = w.pop(f"{a}.kv_a_layernorm.weight")  # [512]
        self.kv_b = w.pop(f"{a}.kv_b_proj.weight")  # [nh*(128+128), 512]
        self.o_proj = w.pop(f"{a}.o_proj.weight")  # [H, nh*128]
        # MLA absorption for decode: W_UK folds into the query, W_UV into the output, so attention
        # runs over the 576-wide cached latent and never expands per-head keys and values.
        kv_b = self.kv_b.view(self.nh, self.nope + self.v_dim, self.rank)  # [nh, 256, 512]
        self.w_uk = kv_b[:, :self.nope].contiguous()  # [nh, 128, 512]
        self.w_uv_t = kv_b[:, self.nope:].transpose(1, 2).contiguous()  # [nh, 512, 128]
        if self.fused_decode:
            from pegainfer.engine.kernels import ticket
            self.out_count = ticket.tickets(max(kernels.mla_output_rows, kernels.norm_linear_rows), self.o_proj.device)

    def _project(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 cache: MLACache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, and the new tokens' latent + roped key written to the cache.
        x: [T, H] -> q_nope [T, nh, 128], q_pe [T, nh, 64] (roped), kv [T, 576]."""
        t, k = x.shape[0], self.kernels
        if self.q_proj is not None:
            q = linear(x, self.q_proj, k)
        else:
            q = linear(_rms(linear(x, self.q_a, k), self.q_a_norm, k), self.q_b, k)
        q_nope, q_pe = q.view(t, self.nh, self.nope + self.rope_dim).split([self.nope, self.rope_dim], dim=-1)
        latent, k_pe = linear(x, self.kv_a, k).split([self.rank, self.rope_dim], dim=-1)  # [T, 512], [T, 64]
        kv = torch.cat([_rms(latent, self.kv_a_norm, k), self.rope.apply(k_pe, positions)], dim=-1)  # [T, 576]
        cache.write(self.layer, slots, positions, kv)
        return q_nope, self.rope.apply(q_pe, positions), kv

    def _out(self, o: torch.Tensor) -> torch.Tensor:
        """o: [T, nh, 128] or [T, nh*128] -> [T, H]."""
        return linear(o.reshape(o.shape[0], self.nh * self.v_dim), self.o_proj, self.kernels)

    def _expand(self, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keys and values from latents: kv [N, 576] -> k_nope [N, nh, 128], k_pe [N, 64], v [N, nh, 128]."""
        latent, k_pe = kv.split([self.rank, self.rope_dim], dim=-1)  # [N, 512], [N, 64]
        kvb = linear(latent, self.kv_b, self.kernels).view(kv.shape[0], self.nh, self.nope + self.v_dim)
        k_nope, v = kvb.split([self.nope, self.v_dim], dim=-1)  # [N, nh, 128] each, views
        return k_nope, k_pe, v

    def _invariant(self, q: torch.Tensor, bank: torch.Tensor, positions: torch.Tensor, bases: torch.Tensor,
                   segments) -> torch.Tensor:
        """The batch-invariant attention: q [T, nh, 192], each query at `positions` [T] of its prompt,
        whose latents start at row `bases` [T] of `bank` [N, 576] -> [T, nh, 128]. segments: the same
        as a list of blocked_attention.Segment, or a callable making it (the torch form reads them on
        the host; the Triton form never calls it)."""
        k_nope, k_pe, v = self._expand(bank)
        if self.fused_prefill:
            from pegainfer.engine.kernels.prefill_attention import prompt_attention
            return prompt_attention(q, k_nope, k_pe, v, positions=positions, bases=bases, scale=self.scale)
        n = bank.shape[0]
        k = torch.cat([k_nope, k_pe[:, None, :].expand(n, self.nh, self.rope_dim)], dim=-1)  # [N, nh, 192]
        return blocked_attention.attention(q, k, v, segments() if callable(segments) else segments, self.scale)

    def __call__(self, x: torch.Tensor, batch: Batch, cache: MLACache) -> torch.Tensor:
        """The reference computation: keys and values expanded from the cached latent, any mix of
        prompt rows and one-token rows."""
        q_nope, q_pe, _ = self._project(x, batch.positions, batch.token_slots, cache)
        q = torch.cat([q_nope, q_pe], dim=-1)  # [T, nh, 192]
        if self.invariant:
            return self._out(self._reference_invariant(q, batch, cache))
        out = torch.empty(x.shape[0], self.nh, self.v_dim, dtype=x.dtype, device=x.device)  # [T, nh, 128]
        if batch.decode_rows:
            self._decode(q, batch, cache, out)
        for r in batch.prefill_rows:
            s, row = batch.starts[r], batch.rows[r]
            n, ctx = len(row.token_ids), batch.context_lens[r]
            out[s:s + n] = self._attend(q[s:s + n].unsqueeze(0), cache.read(self.layer, row.slot, ctx).unsqueeze(0),
                                        mask=_causal_mask(n, ctx, x.device))[0]
        return self._out(out)

    def _reference_invariant(self, q: torch.Tensor, batch: Batch, cache: MLACache) -> torch.Tensor:
        """Every row, prompt chunk or decode token, over its own cached latents: q [T, nh, 192] -> [T, nh, 128]."""
        bank = torch.cat([cache.read(self.layer, r.slot, n) for r, n in zip(batch.rows, batch.context_lens)])  # [N, 576]
        offsets, segments, base = [], [], 0
        for r, start, ctx in zip(batch.rows, batch.starts, batch.context_lens):
            offsets += [base] * len(r.token_ids)
            segments.append(blocked_attention.Segment(start, len(r.token_ids), r.start_pos, base))
            base += ctx
        bases = torch.tensor(offsets, dtype=torch.int64, device=q.device)  # [T]
        return self._invariant(q, bank, batch.positions, bases, segments)

    def prefill_packed(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor | None,
                       cache: MLACache, one_prompt: bool = False,
                       bank: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)) -> torch.Tensor:
        """Fresh prompts packed into one sequence (no earlier cache): keys and values come from the
        new tokens themselves, each token seeing its own prompt causally. one_prompt: the pack holds
        one prompt from index 0, so plain causal attention is exact. Otherwise the Triton kernel
        (fused_prefill) or SDPA with `mask` [1, 1, T, T] (built once per step by the caller).
        Batch-invariant: neither; the attention of the reference path (`_invariant`), the pack its own
        key bank, so a prompt's first chunk here and its later chunks there agree bit for bit.
        x: [T, H]; positions, slots: [T]. bank (batch-invariant only): (bank_index [NB], bases [T]) of
        PrefillInputs: prompts that continue a cached prefix, their keys gathered from the cache after
        this step's latents are written (the same bits as the pack's own for a fresh prompt).
        Graph-safe (no host synchronisation) but for the invariant torch form, which reads the
        prompts' bounds on the host."""
        q_nope, q_pe, kv = self._project(x, positions, slots, cache)
        q = torch.cat([q_nope, q_pe], dim=-1)  # [T, nh, 192]
        bank_index, bases = bank
        if self.invariant and bank_index is not None:  # keys from the cache: [NB, 576]
            keys = cache.data[self.layer].flatten(0, 1).index_select(0, bank_index)
            return self._out(self._invariant(q, keys, positions, bases, lambda: _bank_segments(positions, bases)))
        if self.invariant:  # the pack is its own key bank; the torch form reads the prompts on the host
            bases = torch.arange(x.shape[0], device=x.device) - positions  # [T] each prompt's first token
            return self._out(self._invariant(q, kv, positions, bases, lambda: _packed_segments(positions)))
        if self.fused_prefill and not one_prompt:
            from pegainfer.engine.kernels.prefill_attention import packed_causal_attention
            latent, k_pe = kv.split([self.rank, self.rope_dim], dim=-1)  # [T, 512], [T, 64]
            k_nope, v = linear(latent, self.kv_b, self.kernels).view(x.shape[0], self.nh, self.nope + self.v_dim).split(
                [self.nope, self.v_dim], dim=-1)  # [T, nh, 128] each, views
            return self._out(packed_causal_attention(q, k_nope, k_pe, v, positions, self.scale))
        return self._out(self._attend(q.unsqueeze(0), kv.unsqueeze(0), mask=mask, causal=one_prompt)[0])

    def decode_absorbed(self, x: torch.Tensor | None, inp: DecodeInputs, cache: MLACache,
                        qkv: torch.Tensor | None = None) -> torch.Tensor:
        """One new token per row over the latent cache, with no host synchronisation (graph-safe).
        x: [B, H]; inp: the rows' positions, slots, cached lengths [B] and the static bound `length`.
        Fused (Triton, CUDA): the q/kv_a GEMV, prep, split, merge with W_UV and o_proj launches."""
        if self.fused_decode:
            return linear(self._fused_values(x, inp, cache, qkv), self.o_proj, self.kernels)
        length = inp.length
        q_full = self.absorbed_query(x, inp.positions, inp.slots, cache, qkv)  # [B, nh, 576]
        kv = cache.read_rows(self.layer, inp.slots, length)  # [B, L, 576]
        scores = torch.bmm(q_full, kv.transpose(1, 2)).float() * self.scale  # [B, nh, L]
        valid = torch.arange(length, device=inp.positions.device)[None, :] < inp.ctx_lens[:, None]  # [B, L]
        probs = scores.masked_fill(~valid[:, None, :], float("-inf")).softmax(dim=-1).to(kv.dtype)
        o_lat = torch.bmm(probs, kv[..., :self.rank])  # [B, nh, 512]
        return self._out(torch.bmm(o_lat.transpose(0, 1), self.w_uv_t).transpose(0, 1))  # [B, nh, 128] -> [B, H]

    def decode_norm(self, x: torch.Tensor | None, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                    inp: DecodeInputs, cache: MLACache, qkv: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """decode_absorbed, then its residual add and the post-attention RMSNorm: x [B, H] (normed),
        residual [B, H] -> (norm(residual + attention) * norm_weight, residual + attention). Fused at up
        to KernelConfig.mla_output_rows rows: o_proj, the add and the norm in one launch. Batch-invariant
        with norm_linear_rows: at one row that launch in the invariant linear's order with the
        dot-product norm (engine/kernels/norm_linear.py linear_norm), at more rows the same norm apart.
        qkv: x's q_kv_a projection, already made (norm_proj.py, norm_linear.py; x is then not read)."""
        k = self.kernels
        if self.fused_decode and k.batch_invariant and k.norm_linear_rows:  # engine/kernels/norm_linear.py
            from pegainfer.engine.kernels import norm_linear
            if residual.shape[0] <= k.norm_linear_rows:
                return norm_linear.linear_norm(self._fused_values(x, inp, cache, qkv), self.o_proj, residual,
                                               norm_weight, eps, self.out_count, k.linear, block_n=k.norm_linear_n,
                                               num_warps=k.norm_linear_warps)
            return norm_linear.dot_norm(self.decode_absorbed(x, inp, cache, qkv), residual, norm_weight, eps, k.linear)
        if not (self.fused_decode and residual.shape[0] <= k.mla_output_rows):
            return add_norm(self.decode_absorbed(x, inp, cache, qkv), norm_weight, residual, eps, k.triton, k)
        from pegainfer.engine.kernels import mla_output
        v = self._fused_values(x, inp, cache, qkv)
        return mla_output.proj_norm(v, self.o_proj, residual, norm_weight, eps, self.out_count, k.mla_output)

    def _fused_values(self, x: torch.Tensor | None, inp: DecodeInputs, cache: MLACache,
                      qkv: torch.Tensor | None) -> torch.Tensor:
        """The Triton decode up to the value heads: absorbed query, split, merge with W_UV -> [B, nh*128].
        Batch-invariant (the fixed plan: splits by each row's own length, one merge shape) unless the
        KernelConfig turns it off; then the splits and merge are chosen by the batch and the bound."""
        from pegainfer.engine.kernels.mla_decode import auto_split, merge_form, mla_decode
        q_full = self.absorbed_query(x, inp.positions, inp.slots, cache, qkv)  # [B, nh, 576]
        b, k = q_full.shape[0], self.kernels
        if k.batch_invariant:
            from pegainfer.engine.kernels import mla_fixed
            from pegainfer.engine.kernels.mla_rule import rule_of
            step = inp.memo.get("mla_fixed")  # the step's rule, launch shape and work list: its first layer's
            if step is None:
                rule = rule_of(k)
                step = inp.memo["mla_fixed"] = (rule, mla_fixed.launches_of(k), mla_fixed.split_plan(
                    inp.ctx_lens, inp.length, rule, k.decode_merge_group))
            rule, launches, plan = step
            return mla_fixed.mla_decode_fixed(q_full, cache.data[self.layer], cache.table, inp.slots, inp.ctx_lens,
                                              plan=plan, scale=self.scale, rank=self.rank, rule=rule,
                                              programs=k.split_programs, w_uv_t=self.w_uv_t, launches=launches)
        return mla_decode(q_full, cache.data[self.layer], cache.table, inp.slots, inp.ctx_lens, inp.length,
                          self.scale, self.rank, w_uv_t=self.w_uv_t,
                          split_len=auto_split(b, inp.length, k.split_programs),
                          merge=merge_form(b, k.row_merge_max_batch))

    def absorbed_query(self, x: torch.Tensor | None, positions: torch.Tensor, slots: torch.Tensor,
                       cache: MLACache, qkv: torch.Tensor | None = None) -> torch.Tensor:
        """The new tokens' latent and roped key written to the cache, and the decode query with W_UK
        folded in: x: [B, H] -> [B, nh, 576] (latent part, then the roped q_pe). Graph-safe.
        Fused: one GEMV for q (or the q LoRA input) and kv_a together, then one prep launch."""
        if self.fused_decode:
            from pegainfer.engine.kernels.mla_prep import mla_prep
            width = self.kv_a.shape[0]
            qkv = linear(x, self.q_kv_a, self.kernels) if qkv is None else qkv  # [B, nq + 576]
            q, kv = qkv.split([self.q_kv_a.shape[0] - width, width], dim=-1)  # [B, nq], [B, 576]
            if self.q_b is not None:
                q = linear(_rms(q, self.q_a_norm, self.kernels), self.q_b, self.kernels)  # [B, nh*192]
            return mla_prep(q, kv, self.kv_a_norm, self.w_uk, self.rope.table, positions, slots,
                            cache.data[self.layer], pages=cache.table)
        q_nope, q_pe, _ = self._project(x, positions, slots, cache)
        q_lat = torch.bmm(q_nope.transpose(0, 1), self.w_uk)  # [nh, B, 512]
        return torch.cat([q_lat, q_pe.transpose(0, 1)], dim=-1).transpose(0, 1)  # [B, nh, 576]

    def _decode(self, q: torch.Tensor, batch: Batch, cache: MLACache, out: torch.Tensor) -> None:
        """Every one-token row at once, whatever its position: pad to the longest context, mask the rest."""
        rows = batch.decode_rows
        idx = torch.tensor([batch.starts[r] for r in rows], device=q.device)
        ctx = torch.tensor([batch.context_lens[r] for r in rows], device=q.device)
        longest = max(batch.context_lens[r] for r in rows)
        slots = torch.tensor([batch.rows[r].slot for r in rows], device=q.device)
        kv = cache.read_rows(self.layer, slots, longest)  # [B, L, 576]
        mask = (torch.arange(longest, device=q.device)[None, :] < ctx[:, None])[:, None, None, :]  # [B, 1, 1, L]
        out[idx] = self._attend(q[idx].unsqueeze(1), kv, mask=mask)[:, 0]

    def _attend(self, q: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor | None, causal: bool = False) -> torch.Tensor:
        """q: [B, S, nh, 192]; kv: cached [B, L, 576]; mask: bool, broadcastable to [B, nh, S, L].
        Expands keys and values from the latent (the reference's computation) -> [B, S, nh, 128]."""
        b, length = kv.shape[0], kv.shape[1]
        latent, k_pe = kv.split([self.rank, self.rope_dim], dim=-1)
        kvb = linear(latent, self.kv_b, self.kernels).view(b, length, self.nh, self.nope + self.v_dim)  # [B, L, nh, 256]
        k_nope, v = kvb.split([self.nope, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_pe[:, :, None, :].expand(b, length, self.nh, self.rope_dim)], dim=-1)  # [B, L, nh, 192]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask, is_causal=causal, scale=self.scale)  # [B, nh, S, 128]
        return o.transpose(1, 2)


def _causal_mask(n: int, ctx: int, device: torch.device) -> torch.Tensor:
    """[1, 1, n, ctx] bool: query i (at position ctx - n + i) sees keys at positions <= its own."""
    qpos = torch.arange(ctx - n, ctx, device=device)[:, None]
    return (torch.arange(ctx, device=device)[None, :] <= qpos)[None, None]


def _bank_segments(positions: torch.Tensor, bases: torch.Tensor) -> list[blocked_attention.Segment]:
    """The prompts of a pack whose keys sit in a bank (runs of tokens with one base), on the host."""
    pos, base = positions.tolist(), bases.tolist()
    starts = [i for i in range(len(pos)) if i == 0 or base[i] != base[i - 1]] + [len(pos)]
    return [blocked_attention.Segment(a, b - a, pos[a], base[a]) for a, b in zip(starts, starts[1:])]


def _packed_segments(positions: torch.Tensor) -> list[blocked_attention.Segment]:
    """The prompts of a pack (each from position 0, back to back), read on the host."""
    pos = positions.tolist()
    starts = [i for i, p in enumerate(pos) if p == 0] + [len(pos)]
    return [blocked_attention.Segment(a, b - a, 0, a) for a, b in zip(starts, starts[1:])]
