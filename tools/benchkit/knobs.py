"""The switches of the decode step's A/Bs (tools/dev/gpu_probe.py): each flag sets one field of the
engine's KernelConfig (engine/kernels/config.py), which the tool hands to the engine it builds
(EngineSpec.kernels), so one GPU call can time a change against its absence. Nothing else changes.

    flag                  KernelConfig field           values
    --batch-invariant     batch_invariant              1: every reduction in a fixed order (default); 0: off
    --capture-priority    capture_priority             stream priority (0: the side stream's)
    --argmax-launches     argmax_rows                  1: one launch (default); 4: the torch form (0 rows)
    --head-argmax-rows    head_argmax_rows             1: LM head + argmax in one launch; 0: apart
    --head-n              head.block_n                 its vocabulary rows per program
    --head-k              head.block_k                 its K block
    --head-warps          head.num_warps               its warps per program
    --head-stages         head.num_stages              its pipeline stages
    --norm-proj-rows      norm_proj_rows               1: input norm inside q/kv_a at one row; 0: apart
    --norm-proj-k         norm_proj.block_k            its K block (K or more: one tile, loaded first)
    --embed-in-norm       embed_in_norm                1: layer 0's launch reads the embedding; 0: apart
    --norm-proj-j         norm_proj.block_j            its projection rows per program
    --norm-linear-rows    norm_linear_rows             1: invariant mode's norm + q/kv_a, one launch at one row
    --norm-linear-n       norm_linear_n                its columns per program (no bits change)
    --norm-linear-warps   norm_linear_warps            its warps per program
    --norm-proj-warps     norm_proj.num_warps          its warps per program
    --router-launches     router_one_launch            1: logits and selection in one launch; 2: two
    --mla-output-rows     mla_output_rows              rows of the o_proj + add + norm kernel (0: apart)
    --mla-output-k        mla_output.block_k           its K block
    --mla-output-j        mla_output.block_j           its output columns per program
    --mla-output-warps    mla_output.num_warps         its warps per program
    --expert-up-n         experts.few_rows.up_n        gate-up column block up to 512 routes
    --expert-down-n       experts.few_rows.down_n      down column block up to 512 routes
    --expert-k            experts.few_rows.block_k     K block of both up to 512 routes
    --split-programs      split_programs               programs the split attention aims at
    --decode-long-split   decode_long_split            the invariant split attention's long split (0: 8 splits at most)
    --decode-most-splits  decode_most_splits           its most splits a row
    --decode-split-len    decode_split_len             its keys a split (short rows)
    --decode-block-n      decode_block_n               its split kernel's keys a step
    --decode-split-warps  decode_split_warps           its split kernel's warps
    --decode-split-stages decode_split_stages          its split kernel's pipeline stages
    --decode-merge-group  decode_merge_group           a long row's splits a first merge group takes (0: one level)
    --decode-merge-unroll decode_merge_unroll          splits' partials the merge asks for at once (1 or 2)
    --expert-stages       experts.one_token_stages     pipeline stages of both at one token's routes
    --one-token-up-n      experts.one_token_up_n       gate-up column block at one token's routes
    --expert-warps        experts.few_rows.num_warps   warps per program of both up to 512 routes
    --expert-many-routes  experts.many_rows_min_routes routes above which the wide tiling runs (0: never)
    --expert-many-m       experts.many_rows.block_m    its rows of one expert per block
    --expert-many-n       experts.many_rows.up_n       its gate-up column block
    --expert-many-down-n  experts.many_rows.down_n     its down column block
    --expert-many-warps   experts.many_rows.num_warps  its warps per program
    --expert-many-stages  experts.many_rows.num_stages its pipeline stages
    --dense-stages        dense.num_stages             the one-launch SwiGLU's pipeline stages
    --dense-rows          dense_rows                   rows of the one-launch SwiGLU (0: cuBLAS)
    --dense-n             dense.up_n                   its column block
    --dense-k             dense.block_k                its K block
    --dense-warps         dense.num_warps              its warps per program
    --linear-ticket       linear.ticket                1: the split linear's last program sums (default); 0: a second launch
    --linear-programs     linear.programs              the invariant linear's programs aimed at (no bits change)
    --linear-n-min        linear.block_n_min           its narrowest column block (no bits change)
    --linear-n-max        linear.block_n_max           its widest column block (no bits change)
    --linear-warps        linear.num_warps             its warps per program below wide_rows (no bits change)
    --linear-stages       linear.num_stages            its pipeline stages (no bits change)
    --linear-k-chunk      linear.k_chunk               its K chunk (other bits, still batch invariant)
    --sample-chunks       sample.chunks                the device sampler's programs per row (64, default: the split
                                                       launches, 50 at lite; 0: one program per row)
    --sample-pivots       sample.pivots                the split sampler's count thresholds
"""
from __future__ import annotations

import argparse
import dataclasses

from pegainfer.engine.kernels.config import KernelConfig


def _as_is(v: int, default):
    return v


# flag -> (the KernelConfig field, dotted through nested tilings; its value from the flag's and the
# field's default)
KNOBS = {"batch_invariant": ("batch_invariant", lambda v, default: v == 1),
         "capture_priority": ("capture_priority", _as_is),
         "argmax_launches": ("argmax_rows", lambda v, default: 0 if v == 4 else default),
         "head_argmax_rows": ("head_argmax_rows", _as_is),
         "head_n": ("head.block_n", _as_is),
         "head_k": ("head.block_k", _as_is),
         "head_warps": ("head.num_warps", _as_is),
         "head_stages": ("head.num_stages", _as_is),
         "norm_proj_rows": ("norm_proj_rows", _as_is),
         "embed_in_norm": ("embed_in_norm", lambda v, default: v == 1),
         "norm_proj_k": ("norm_proj.block_k", _as_is),
         "norm_proj_j": ("norm_proj.block_j", _as_is),
         "norm_proj_warps": ("norm_proj.num_warps", _as_is),
         "norm_linear_rows": ("norm_linear_rows", _as_is),
         "norm_linear_n": ("norm_linear_n", _as_is),
         "norm_linear_warps": ("norm_linear_warps", _as_is),
         "router_launches": ("router_one_launch", lambda v, default: v == 1),
         "mla_output_rows": ("mla_output_rows", _as_is),
         "mla_output_k": ("mla_output.block_k", _as_is),
         "mla_output_j": ("mla_output.block_j", _as_is),
         "mla_output_warps": ("mla_output.num_warps", _as_is),
         "expert_up_n": ("experts.few_rows.up_n", _as_is),
         "expert_down_n": ("experts.few_rows.down_n", _as_is),
         "expert_k": ("experts.few_rows.block_k", _as_is),
         "split_programs": ("split_programs", _as_is),
         "decode_long_split": ("decode_long_split", _as_is),
         "decode_most_splits": ("decode_most_splits", _as_is),
         "decode_split_len": ("decode_split_len", _as_is),
         "decode_block_n": ("decode_block_n", _as_is),
         "decode_split_warps": ("decode_split_warps", _as_is),
         "decode_split_stages": ("decode_split_stages", _as_is),
         "decode_merge_group": ("decode_merge_group", _as_is),
         "decode_merge_unroll": ("decode_merge_unroll", _as_is),
         "expert_stages": ("experts.one_token_stages", _as_is),
         "one_token_up_n": ("experts.one_token_up_n", _as_is),
         "expert_warps": ("experts.few_rows.num_warps", _as_is),
         "expert_many_routes": ("experts.many_rows_min_routes", _as_is),
         "expert_many_m": ("experts.many_rows.block_m", _as_is),
         "expert_many_n": ("experts.many_rows.up_n", _as_is),
         "expert_many_down_n": ("experts.many_rows.down_n", _as_is),
         "expert_many_warps": ("experts.many_rows.num_warps", _as_is),
         "expert_many_stages": ("experts.many_rows.num_stages", _as_is),
         "dense_stages": ("dense.num_stages", _as_is),
         "dense_rows": ("dense_rows", _as_is),
         "dense_n": ("dense.up_n", _as_is),
         "dense_k": ("dense.block_k", _as_is),
         "dense_warps": ("dense.num_warps", _as_is),
         "linear_ticket": ("linear.ticket", lambda v, default: v == 1),
         "linear_programs": ("linear.programs", _as_is),
         "linear_n_min": ("linear.block_n_min", _as_is),
         "linear_n_max": ("linear.block_n_max", _as_is),
         "linear_warps": ("linear.num_warps", _as_is),
         "linear_stages": ("linear.num_stages", _as_is),
         "linear_k_chunk": ("linear.k_chunk", _as_is),
         "sample_chunks": ("sample.chunks", _as_is),
         "sample_pivots": ("sample.pivots", _as_is)}
CHOICES = {"batch_invariant": [0, 1], "argmax_launches": [1, 4], "head_argmax_rows": [0, 1], "norm_proj_rows": [0, 1],
           "router_launches": [1, 2], "embed_in_norm": [0, 1], "norm_linear_rows": [0, 1], "linear_ticket": [0, 1],
           "decode_block_n": [16, 32, 64], "decode_merge_unroll": [1, 2]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    for flag, (field, _) in KNOBS.items():
        p.add_argument("--" + flag.replace("_", "-"), type=int, choices=CHOICES.get(flag),
                       help=f"sets KernelConfig.{field} (tools/benchkit/knobs.py)")


def get(config, field: str):
    """The value of a dotted field ("experts.few_rows.up_n") of a config."""
    for name in field.split("."):
        config = getattr(config, name)
    return config


def _replace(config, field: str, value):
    """config with one dotted field set: dataclasses.replace at every level of the path."""
    name, _, rest = field.partition(".")
    return dataclasses.replace(config, **{name: _replace(getattr(config, name), rest, value) if rest else value})


def apply(a: argparse.Namespace, base: KernelConfig = KernelConfig()) -> tuple[KernelConfig, dict]:
    """The KernelConfig of the flags given (the others as in `base`), and the fields they set, by name.
    The top-level fields are set together (KernelConfig checks some against each other)."""
    config, done, top = base, {}, {}
    for flag, (field, value) in KNOBS.items():
        if getattr(a, flag) is not None:
            done[field] = value(getattr(a, flag), get(config, field))
            if "." in field:
                config = _replace(config, field, done[field])
            else:
                top[field] = done[field]
    return dataclasses.replace(config, **top), done
