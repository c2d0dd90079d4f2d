"""The one kernel configuration: every launch choice of the forward passes that is a measured value
(the row counts up to which a one-launch kernel runs, the tilings, the split attention's program
target, the expert kernels' tilings by route count, the capture stream's priority) and the switch
for the Triton kernels, in one frozen object. Built at start-up (engine/engine.py: EngineSpec.kernels,
resolved against the device by `on_device`) or from a bench tool's flags (tools/benchkit/knobs.py,
with dataclasses.replace), then passed down to the model, the attention, the MoE layer, the expert
kernels and the graphs. Nothing changes it at run time; the kernel modules read no tunable of their
own. The defaults are the values measured on the H200 (docs/perf-notes.md rows cited below), but for
LinearTiling's, not yet measured.

Torch- and Triton-free, so a CPU-only install (and ep/) can import it."""
from __future__ import annotations

import dataclasses
import functools


@dataclasses.dataclass(frozen=True, slots=True)
class Tiling:
    """Launch shape of the expert GEMM kernels (engine/kernels/moe_experts.py); block_k fixes the K
    order of every dot product. tools/dev kernel_bench --sweep times candidates."""
    block_m: int = 32  # rows of one expert per block
    block_k: int = 128
    up_n: int = 64
    down_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


@dataclasses.dataclass(frozen=True, slots=True)
class HeadTiling:
    """The LM head + argmax launch (engine/kernels/head_argmax.py). The H200 (row 44; timelines at one
    row, lite): 64 rows x 256 columns with 8 warps 105.6-106.1 µs a step; 32 x 256 with 4 warps 106.5,
    16 x 512 133.8, 128 x 128 117.3, 128 x 64 117.8; cuBLAS's GEMV and the argmax kernel 104.8-105.4
    + 3.5-3.6."""
    block_n: int = 64  # vocabulary rows per program: 1,600 programs at lite's 102,400
    block_k: int = 256
    num_warps: int = 8
    num_stages: int = 3


@dataclasses.dataclass(frozen=True, slots=True)
class RowTiling:
    """A one-row projection kernel's launch (norm_proj, mla_output): output rows per program, the K
    block (K or more: the whole row in one tile) and the warps per program."""
    block_j: int
    block_k: int
    num_warps: int = 4


@dataclasses.dataclass(frozen=True, slots=True)
class LinearTiling:
    """The batch-invariant linear's Triton launch (engine/kernels/linear.py). What fixes an output
    element's order of sums, the same at every row count: rows in blocks of block_m through tl.dot
    (16: mma.sync tiles; a block of 64 would let Triton pick wgmma), K walked in order in block_k
    steps, summed in float32 per k_chunk (a multiple of block_k) and the chunks' sums added in
    order. What is chosen per call from the shape and changes no bits: the column block, a power of
    two from block_n_max down to block_n_min, and whether the chunks run in one program each (float32
    parts added by a second launch) or one program walks them all; the choice aims at `programs`
    programs (~2 per SM of an H200), so a one-row call still reads its weight from every SM.

    From wide_rows rows on, the rows go in blocks of wide_block_m (with wide_num_warps): on the H200
    blocks of 16, 32, 64 and 128 rows gave every lite shape bitwise the same outputs at 1, 256 and
    8,192 rows (tools/dev/linear_blockm.py, 2026-12-04), and 64-row blocks took 0.45-0.5x the time of
    16-row ones at 8,192 rows (o_proj 189 against 388 µs; cuBLAS 110).

    ticket: the split's parts summed by the last program of each tile to finish (a ticket per
    program from one atomic counter; the same additions in the same order) rather than by a second
    launch: a launch fewer per split call, which one-row decode steps make several times a layer.

    The other defaults are not tuned (tools/dev/linear_bench.py --sweep times candidates)."""
    block_m: int = 16
    wide_rows: int = 256
    wide_block_m: int = 64
    wide_num_warps: int = 8
    block_k: int = 64
    k_chunk: int = 256
    block_n_min: int = 32
    block_n_max: int = 128
    programs: int = 264
    num_warps: int = 4
    num_stages: int = 3
    ticket: bool = True

    def __post_init__(self) -> None:
        if self.k_chunk % self.block_k or self.block_n_max < self.block_n_min:
            raise ValueError(f"LinearTiling: k_chunk must be a multiple of block_k, block_n_max >= block_n_min: {self}")


@dataclasses.dataclass(frozen=True, slots=True)
class SampleTiling:
    """The device sampler's launches (engine/kernels/sample.py, sample_split.py). chunks: programs per
    draw row (0: one program walks the whole row, the kernel before the split); with chunks > 0 a row's
    vocabulary is cut into block_v tiles, ceil(tiles / chunks) per program, in eight launches (the
    tiles' max, their pivot counts, each row's plan, a recount, the plan again, the gather, a
    rejection round and the row's pick, the rows left to one program), every per-row sum and pick
    combined tile by tile in tile order: the same bits at every batch size, and the one-program
    kernel's tokens and log-probs. The count depends on the vocabulary and this field, never on the
    batch. pivots: the split's count thresholds (the one-program kernel's: one_pivots); cap: the
    candidates a row sorts at most. The split is the default (64: lite's 50 tiles of 2,048, one
    program each): at batch 1 on an H100 (2026-12-05, bench_direct, one warm machine) it sampled
    top-p and top-k + penalties at +1.4 % over greedy against +13.3 % with one program per row (0,
    `--sample-chunks 0`, the A/B side; tools/dev/sample_bench.py, tools/dev/h200_sample_split.sh,
    docs/perf-notes.md row 47)."""
    chunks: int = 64
    block_v: int = 2048
    pivots: int = 8
    one_pivots: int = 4
    cap: int = 512
    num_warps: int = 8

    def __post_init__(self) -> None:
        if self.chunks < 0 or self.block_v & (self.block_v - 1) or self.cap & (self.cap - 1) or self.pivots < 2:
            raise ValueError(f"SampleTiling: chunks >= 0, block_v and cap powers of two, pivots >= 2: {self}")


@functools.cache
def _one_token(tiling: Tiling, stages: int, up_n: int) -> Tiling:
    """tiling with `stages` pipeline stages and `up_n` gate-up columns per program, made once per
    triple (tiling_for runs at every MoE call)."""
    return dataclasses.replace(tiling, num_stages=stages, up_n=up_n)


@dataclasses.dataclass(frozen=True, slots=True)
class ExpertTilings:
    """The routed experts' kernel shapes, chosen by the step's total routes, which every EP rank
    shares, so a route's bits never depend on how the step was split between ranks.

    Measured on the H200 (kernel_bench --sweep grid|small): 16-row blocks are 3-6 % faster while
    experts hold a few rows each (46.9 / 163 / 275 µs per MoE layer at 1 / 8 / 64 tokens against
    49.8 / 165 / 285 with 32-row blocks) and ~70 % slower at 256 tokens, where 32-row blocks are
    within 3 % of the best of 24. One token's routes: four pipeline stages (row 38: batch-1 graph
    2,011 µs against 2,026/2,040 with three, 2,054 with five) and 32-column gate-up blocks (row 41:
    2,010 µs against 2,026 with 64)."""
    tiling: Tiling = Tiling()
    few_rows: Tiling = Tiling(block_m=16)
    few_rows_max_routes: int = 512  # 8 routes per expert on average
    one_token_max_routes: int = 8
    one_token_stages: int = 4
    one_token_up_n: int = 32
    # Above this many routes on one rank (prompt chunks, not decode steps) each program would loop
    # over many row blocks re-reading its weights; ExpertShard hands such calls to grouped GEMMs.
    max_routes: int = 2048
    # Prompt-sized steps (above many_rows_min_routes routes; 0: never): wide tiles, where the
    # tensor cores rather than the loads bound the time. Batch-invariant mode runs every step's
    # experts here (no grouped GEMMs), and with the 32-row tiling a 4,620-token prompt spent 172 of
    # its 232 ms (one H100, eager, gpu_probe --prefill-profile) in the two expert kernels, about
    # 70 TFLOP/s. block_k stays 128, the K order of every tiling; 64-row blocks let Triton pick
    # Hopper's wgmma, whose bits the GPU test pins against the 16- and 32-row blocks' mma.sync.
    many_rows: Tiling = Tiling(block_m=128, up_n=64, down_n=128, num_warps=8, num_stages=3)
    many_rows_min_routes: int = 2048

    def tiling_for(self, total_routes: int) -> Tiling:
        if total_routes <= self.one_token_max_routes:
            return _one_token(self.few_rows, self.one_token_stages, self.one_token_up_n)
        if total_routes <= self.few_rows_max_routes:
            return self.few_rows
        if self.many_rows_min_routes and total_routes > self.many_rows_min_routes:
            return self.many_rows
        return self.tiling


@dataclasses.dataclass(frozen=True, slots=True)
class KernelConfig:
    # The Triton kernels: the decode step's, the packed prompt attention and the routed experts'
    # fused MLP. They run where the device allows (CUDA, bfloat16, Triton importable): on_device
    # clears this flag elsewhere, so a config the model holds says what runs.
    triton: bool = True
    # Batch invariance (issue 26): every reduction on the served path sums in an order that does
    # not depend on the step's rows (how many, which requests, how prompts were packed or chunked),
    # so a request's output is the same alone or in any crowd. The default; off (the serve and
    # generate flag --no-batch-invariant, bench tools' A/B) lets the library and the one-row kernels
    # choose by row count.
    batch_invariant: bool = True
    # The stream priority a graph is captured at (lower is higher; the shared experts' side stream
    # has 0): the router and routed experts are scheduled ahead of the shared experts beside them
    # (row 22: batch-1 graph 2,282 -> 2,224 µs).
    capture_priority: int = -1
    # The LM head's logits in float32: its float32 sums kept, not rounded to bfloat16 first (SGLang's
    # --enable-fp32-lm-head reads the same way). Rounded, logits of 10-20 are 0.06-0.125 apart, so two
    # candidates closer than that tie and the first index wins: on the trained default model, greedy
    # picks against HF float32 teacher-forced over 64 x 64 tokens on CPU: 99.19 % (HF bf16), ours
    # 99.10 % rounded, 99.44 % kept (issue 30). The sampler and the log-probs read float32 anyway.
    float32_logits: bool = True
    argmax_rows: int = 1024  # up to this many rows the greedy choice is one launch (argmax.py); 0: torch
    head_argmax_rows: int = 1  # rows of the LM head + argmax launch (0: F.linear, then the argmax)
    head: HeadTiling = HeadTiling()
    norm_proj_rows: int = 1  # rows whose input norm runs inside the q/kv_a launch (0: apart)
    # Batch-invariant mode only (opt-in until an A/B on the GPU): rows whose input norm runs inside
    # the q/kv_a launch, and whose o_proj, residual add and post-attention norm run in one launch,
    # both in the invariant linear's order (engine/kernels/norm_linear.py; 0: apart, 1: one row);
    # when on, those two norms of every decode layer take their sum of squares as a dot product at
    # any row count, so a lone row and a crowd's rows get the same bits. norm_linear_n columns a program.
    norm_linear_rows: int = 0
    norm_linear_n: int = 16
    norm_linear_warps: int = 4
    embed_in_norm: bool = True  # that launch reads layer 0's row from the embedding table itself
    # 228 programs for lite's 3,648 rows; the whole row in one tile, loaded before the norm (row 36:
    # 8.3 -> 7.0 µs a layer at K = 2048)
    norm_proj: RowTiling = RowTiling(block_j=16, block_k=2048)
    router_one_launch: bool = True  # up to 16 tokens the router's logits and selection in one launch
    mla_output_rows: int = 1  # rows of the o_proj + add + norm launch (row 24: 4 rows lost to cuBLAS)
    mla_output: RowTiling = RowTiling(block_j=8, block_k=512)  # row 36: 16 columns 6.5 µs a layer, 8: 5.8
    split_programs: int = 264  # programs the split MLA attention aims at: ~2 per SM on an H200
    # merge of the split attention: a program per (row, head) up to this many rows, else 16-row
    # blocks with tl.dot (kernel_bench --mla, lite, length 256: row/block 6.8/27.7 µs at batch 1,
    # 32.0/25.2 at 64, 108.5/50.1 at 256)
    row_merge_max_batch: int = 32
    # The batch-invariant split attention (batch_invariant; engine/kernels/mla_rule.py own_split): a
    # row's splits follow its own length only: decode_split_len keys each, grown by that much for a
    # row longer than decode_split_len x decode_max_splits (so no such row has more than
    # decode_max_splits), until a split reaches decode_long_split keys; a longer row keeps splits of
    # that length and gets more of them, up to decode_most_splits, past which they grow again. 8
    # splits up to 2,048 keys keep the float32 partials (32 KB a split) small against the keys read;
    # from 2,048 keys on, 256-key splits (a partial is 11 % of its keys' bytes) let a long row at
    # batch 1 read its context from up to 64 SMs (16k tokens: 64 splits; before, 8 splits of 2,048).
    # decode_long_split 0: at most decode_max_splits splits at every length (the rule before issue
    # 28's split-KV). The split kernel's keys a step (a divisor of decode_split_len and the 64-token
    # page: it fixes the order of a split's sums), warps and pipeline stages (no bits change;
    # engine/kernels/mla_fixed.Launches): 64-key splits of 64-key steps, 4 warps, 2 stages, chosen by
    # tools/dev/mla_tune.py on an H100 (2026-12-06, docs/benchmarks/2026-12-06b-device.md): 15.8 /
    # 23.6 / 48.0 / 64.6 µs a layer at batch 1 and 1k / 4k / 16k / 32k keys, 162 at 64 x 4k, 182 at
    # 256 x 1k, against 20.2 / 32.4 / 57.4 / 80.5 / 182.5 / 206.1 with 32-key splits and steps, 8
    # warps, 3 stages
    decode_split_len: int = 64
    decode_max_splits: int = 8
    decode_long_split: int = 256
    decode_most_splits: int = 64
    decode_block_n: int = 64
    decode_split_warps: int = 4
    decode_split_stages: int = 2
    # the merge asks for this many splits' partials (1 or 2) before adding them, in the same order
    # (the same bits): mla_tune on an H100, same call, 2 against 1 (64-key splits and steps, 4 warps,
    # 3 stages): 48.9 / 67.9 µs a layer at 16k / 32k keys against 51.3 / 70.4, within 0.6 µs elsewhere
    decode_merge_unroll: int = 2
    # > 0: a first merge level over groups of this many splits of each row with more than
    # decode_max_splits splits (engine/kernels/mla_group.py; other bits for those rows, still batch
    # invariant; 0: one level). Opt-in until measured end to end: mla_tune's bwg on an H100 (every
    # row grouped, 3 split stages) gave 38.2 µs a layer at 16k keys and batch 1 against 48.0 for the
    # default shape one-level, and +4.7 µs at 1k (its launches, paid wherever the graph's length
    # bound allows a long row: the engine's decode graphs are bounded by max_len)
    decode_merge_group: int = 0
    experts: ExpertTilings = ExpertTilings()
    # A dense SwiGLU MLP (shared experts, dense layer) at up to dense_rows rows: gate, up and
    # SiLU * up in one launch (row 32: -45 µs a step at one row, +80 µs at eight); 4 stages (row 38)
    dense_rows: int = 1
    dense: Tiling = Tiling(block_m=16, up_n=32, num_stages=4)
    # The batch-invariant linear's Triton kernel (engine/kernels/linear.py), on CUDA when batch_invariant
    linear: LinearTiling = LinearTiling()
    # The device sampler (issue 33): one program per row (chunks 0) or each row split over chunks programs
    sample: SampleTiling = SampleTiling()

    def __post_init__(self) -> None:
        nl, nw = self.norm_linear_n, self.norm_linear_warps
        if self.norm_linear_rows not in (0, 1) or nl < 16 or nl & (nl - 1) or nw < 1 or nw & (nw - 1):
            raise ValueError(f"KernelConfig: norm_linear_rows 0 or 1 ({self.norm_linear_rows}), norm_linear_n a power "
                             f"of two from 16 ({nl}), norm_linear_warps a power of two ({nw})")
        b = self.decode_block_n
        if (b < 16 or b & (b - 1) or 64 % b or self.decode_split_len % b or self.decode_merge_group < 0
                or self.decode_merge_unroll not in (1, 2)):
            raise ValueError(f"KernelConfig: decode_block_n ({b}) a power of two from 16 that divides the 64-token "
                             f"page and decode_split_len ({self.decode_split_len}); decode_merge_group >= 0; "
                             f"decode_merge_unroll 1 or 2")

    def on_device(self, cuda: bool, bf16: bool, triton_imports: bool) -> KernelConfig:
        """This configuration as it runs on the device: `triton` cleared where the Triton kernels
        cannot run and, where batch_invariant, the one-row kernels off (norm_proj_rows,
        mla_output_rows, dense_rows and head_argmax_rows 0; norm_linear_rows keeps the first two's
        place with the multi-row path's order, engine/kernels/norm_linear.py). Each of those sums a row's products in
        another order than the multi-row ops do (norm_proj and mla_output: whole-row tiles of their
        own; dense_swiglu: the expert kernel's blocks; head_argmax: float32 sums over BLOCK_K
        steps), so a request's row alone in a step would get other bits than the same row in a
        crowd. At 0 every row count takes the same ops (the batch-invariant linear,
        engine/kernels/linear.py), one reduction order for every row. The router's one launch
        (router_one_launch) and the greedy argmax (argmax_rows) stay: they give the same bits at
        every row count (engine/kernels/moe_route.py, argmax.py)."""
        triton = self.triton and cuda and bf16 and triton_imports
        if not self.batch_invariant:
            return dataclasses.replace(self, triton=triton)
        return dataclasses.replace(self, triton=triton, norm_proj_rows=0, mla_output_rows=0, dense_rows=0,
                                   head_argmax_rows=0)
