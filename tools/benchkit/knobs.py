"""The switches of the decode step's A/Bs (tools/gpu_probe.py): each flag sets one module constant
of the engine before anything is built, so one GPU call can time a change against its absence.

    flag                  constant                                  values
    --capture-priority    engine.cuda_graphs.CAPTURE_PRIORITY        stream priority (0: the side stream's)
    --argmax-launches     engine.kernels.argmax.MAX_ROWS             1: one launch (default); 4: the torch form
    --head-argmax-rows    engine.kernels.head_argmax.MAX_ROWS        1: LM head + argmax in one launch; 0: apart
    --head-n              engine.kernels.head_argmax.TILING          its vocabulary rows per program
    --head-k              engine.kernels.head_argmax.TILING          its K block
    --head-warps          engine.kernels.head_argmax.TILING          its warps per program
    --head-stages         engine.kernels.head_argmax.TILING          its pipeline stages
    --norm-proj-rows      engine.kernels.norm_proj.MAX_ROWS          1: input norm inside q/kv_a at one row; 0: apart
    --norm-proj-k         engine.kernels.norm_proj.BLOCK_K           its K block (K or more: one tile, loaded first)
    --embed-in-norm       engine.kernels.norm_proj.EMBED             1: layer 0's launch reads the embedding; 0: apart
    --norm-proj-j         engine.kernels.norm_proj.BLOCK_J           its projection rows per program
    --norm-proj-warps     engine.kernels.norm_proj.NUM_WARPS         its warps per program
    --router-launches     engine.kernels.moe_route.ONE_LAUNCH        1: logits and selection in one launch; 2: two
    --mla-output-rows     engine.kernels.mla_output.MAX_ROWS         rows of the o_proj + add + norm kernel (0: apart)
    --mla-output-k        engine.kernels.mla_output.BLOCK_K          its K block
    --mla-output-j        engine.kernels.mla_output.BLOCK_J          its output columns per program
    --mla-output-warps    engine.kernels.mla_output.NUM_WARPS        its warps per program
    --expert-up-n         engine.kernels.moe_experts.FEW_ROWS_TILING  gate-up column block up to 512 routes
    --expert-down-n       engine.kernels.moe_experts.FEW_ROWS_TILING  down column block up to 512 routes
    --expert-k            engine.kernels.moe_experts.FEW_ROWS_TILING  K block of both up to 512 routes
    --split-programs      engine.kernels.mla_decode.SPLIT_PROGRAMS   programs the split attention aims at
    --expert-stages       engine.kernels.moe_experts.ONE_TOKEN_STAGES pipeline stages of both at one token's routes
    --one-token-up-n      engine.kernels.moe_experts.ONE_TOKEN_UP_N   gate-up column block at one token's routes
    --expert-warps        engine.kernels.moe_experts.FEW_ROWS_TILING  warps per program of both up to 512 routes
    --dense-stages        engine.kernels.moe_experts.DENSE_TILING    the one-launch SwiGLU's pipeline stages
    --dense-rows          engine.kernels.moe_experts.DENSE_MAX_ROWS  rows of the one-launch SwiGLU (0: cuBLAS)
    --dense-n             engine.kernels.moe_experts.DENSE_TILING    its column block
    --dense-k             engine.kernels.moe_experts.DENSE_TILING    its K block
    --dense-warps         engine.kernels.moe_experts.DENSE_TILING    its warps per program
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib


def _as_is(v: int, default):
    return v


def _tiling(field: str):
    """A Tiling constant with one field set to the flag's value."""
    return lambda v, default: dataclasses.replace(default, **{field: v})


EXPERTS = "engine.kernels.moe_experts"
HEAD = "engine.kernels.head_argmax"
# flag -> (module, constant, the constant's value from the flag's and the constant's default)
KNOBS = {"capture_priority": ("engine.cuda_graphs", "CAPTURE_PRIORITY", _as_is),
         "argmax_launches": ("engine.kernels.argmax", "MAX_ROWS", lambda v, default: 0 if v == 4 else default),
         "head_argmax_rows": (HEAD, "MAX_ROWS", _as_is),
         "head_n": (HEAD, "TILING", _tiling("block_n")),
         "head_k": (HEAD, "TILING", _tiling("block_k")),
         "head_warps": (HEAD, "TILING", _tiling("num_warps")),
         "head_stages": (HEAD, "TILING", _tiling("num_stages")),
         "norm_proj_rows": ("engine.kernels.norm_proj", "MAX_ROWS", _as_is),
         "embed_in_norm": ("engine.kernels.norm_proj", "EMBED", lambda v, default: v == 1),
         "norm_proj_k": ("engine.kernels.norm_proj", "BLOCK_K", _as_is),
         "norm_proj_j": ("engine.kernels.norm_proj", "BLOCK_J", _as_is),
         "norm_proj_warps": ("engine.kernels.norm_proj", "NUM_WARPS", _as_is),
         "router_launches": ("engine.kernels.moe_route", "ONE_LAUNCH", lambda v, default: v == 1),
         "mla_output_rows": ("engine.kernels.mla_output", "MAX_ROWS", _as_is),
         "mla_output_k": ("engine.kernels.mla_output", "BLOCK_K", _as_is),
         "mla_output_j": ("engine.kernels.mla_output", "BLOCK_J", _as_is),
         "mla_output_warps": ("engine.kernels.mla_output", "NUM_WARPS", _as_is),
         "expert_up_n": (EXPERTS, "FEW_ROWS_TILING", _tiling("up_n")),
         "expert_down_n": (EXPERTS, "FEW_ROWS_TILING", _tiling("down_n")),
         "expert_k": (EXPERTS, "FEW_ROWS_TILING", _tiling("block_k")),
         "split_programs": ("engine.kernels.mla_decode", "SPLIT_PROGRAMS", _as_is),
         "expert_stages": (EXPERTS, "ONE_TOKEN_STAGES", _as_is),
         "one_token_up_n": (EXPERTS, "ONE_TOKEN_UP_N", _as_is),
         "expert_warps": (EXPERTS, "FEW_ROWS_TILING", _tiling("num_warps")),
         "dense_stages": (EXPERTS, "DENSE_TILING", _tiling("num_stages")),
         "dense_rows": (EXPERTS, "DENSE_MAX_ROWS", _as_is),
         "dense_n": (EXPERTS, "DENSE_TILING", _tiling("up_n")),
         "dense_k": (EXPERTS, "DENSE_TILING", _tiling("block_k")),
         "dense_warps": (EXPERTS, "DENSE_TILING", _tiling("num_warps"))}
CHOICES = {"argmax_launches": [1, 4], "head_argmax_rows": [0, 1], "norm_proj_rows": [0, 1],
           "router_launches": [1, 2], "embed_in_norm": [0, 1]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    for flag, (module, name, _) in KNOBS.items():
        p.add_argument("--" + flag.replace("_", "-"), type=int, choices=CHOICES.get(flag),
                       help=f"sets {module}.{name} (tools/benchkit/knobs.py)")


def apply(a: argparse.Namespace) -> dict:
    """Sets the constants of the flags given; returns them by name."""
    done = {}
    for flag, (module, name, value) in KNOBS.items():
        if getattr(a, flag) is not None:
            m = importlib.import_module(module)
            setattr(m, name, value(getattr(a, flag), getattr(m, name)))
            done[f"{module}.{name}"] = getattr(m, name)
    return done
