"""Compile the device sampler's Triton kernels for an H200 (sm_90) on a machine without a GPU: the
one-program kernel (engine/kernels/sample.py) and the split launches (engine/kernels/sample_split.py)
at lite's shape, with and without the top-20 log-probs, through Triton's whole pipeline (its
frontend, the GPU IR, LLVM, ptxas). Catches what Triton's CPU interpreter lets pass: a variable whose
type differs between an if's branches, a loop-carried value that changes type, and the like. Prints
one line per kernel and variant with its compile time; exits 1 on the first failure.

    python tools/dev/sample_compile.py [first count plan recount replan gather round whole one]   (default: all)
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from pegainfer.engine.kernels import sample as one_program  # noqa: E402
from pegainfer.engine.kernels import sample_split as split  # noqa: E402
from pegainfer.engine.kernels.config import SampleTiling  # noqa: E402
from pegainfer.engine.kernels.sample_plan import layout  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
POINTERS = {"logits_ptr": "*fp32", "floats_ptr": "*fp32", "ints_ptr": "*i64", "hist_ptr": "*i32",
            "bias_ptr": "*fp32", "pf_ptr": "*fp32", "pi_ptr": "*i32", "scratch_ptr": "*i64", "tok_ptr": "*i64",
            "lp_ptr": "*fp32", "ids_ptr": "*i64", "lps_ptr": "*fp32", "sweeps_ptr": "*i32", "ticket_ptr": "*i32",
            "whole_ptr": "*i32", "rf_ptr": "*fp32", "ri_ptr": "*i32"}


def compile_one(fn, constexprs: dict, num_warps: int) -> float:
    """Seconds to compile fn with these constexprs (the other arguments: POINTERS' types, else i32)."""
    sig = {n: "constexpr" if n in constexprs else POINTERS.get(n, "i32") for n in fn.arg_names}
    start = time.perf_counter()
    triton.compile(ASTSource(fn, sig, constexprs), target=TARGET,
                   options={"num_warps": num_warps, "enable_fp_fusion": False})
    return time.perf_counter() - start


def variants(t: SampleTiling, vocab: int = 102_400):
    """(name, kernel, constexprs) of every launch, for N_TOP 0 and 20."""
    tiles, per, _ = split.programs_per_row(vocab, t.block_v, t.chunks)
    nf, ni = layout(t.pivots)
    shape = {"BLOCK_V": t.block_v, "TILES": tiles, "PER": per, "NF": nf, "NI": ni}
    tp = triton.next_power_of_2(tiles)
    for n_top in (0, 20):
        lp = n_top > 0
        flags = {"N_TOP": n_top, "LOGPROBS": lp, "RECORD": True, "COUNT": False, "CAP": t.cap}
        yield "first", split._first_kernel, {"LOGPROBS": lp, **shape}
        for recount in (False, True):
            yield "recount" if recount else "count", split._count_kernel, {
                "N_TOP": n_top, "LOGPROBS": lp, "RECOUNT": recount, "CAP": t.cap, "TP": tp, "P": t.pivots, **shape}
            yield "replan" if recount else "plan", split._plan_kernel, {
                "N_TOP": n_top, "CAP": t.cap, "TILES": tiles, "TP": tp, "P": t.pivots, "NF": nf, "NI": ni,
                "RECOUNTED": recount}
        yield "gather", split._gather_kernel, {"N_TOP": n_top, "CAP": t.cap, "TP": tp, "P": t.pivots, **shape}
        yield "round", split._round_kernel, {**flags, "TP": tp, "P": t.pivots, **shape}
        yield "whole", split._whole_kernel, {**flags, "NP": triton.next_power_of_2(max(n_top, 1)),
                                             "BLOCK_V": t.block_v, "PIVOTS": t.one_pivots}
        yield "one", one_program._sample_kernel, {**flags, "NP": triton.next_power_of_2(max(n_top, 1)),
                                                  "BLOCK_V": t.block_v, "PIVOTS": t.one_pivots}


def main(argv: list[str]) -> int:
    wanted = set(argv) or {"first", "count", "plan", "recount", "replan", "gather", "round", "whole", "one"}
    tiling = dataclasses.replace(SampleTiling(), chunks=64)  # the split as the A/B runs it (lite: 50 programs)
    for name, fn, consts in variants(tiling):
        if name not in wanted:
            continue
        try:
            seconds = compile_one(fn, consts, tiling.num_warps)
        except Exception as e:  # noqa: BLE001 - the compile error is the report
            print(f"{name} N_TOP={consts.get('N_TOP', '-')}: FAILED: {type(e).__name__}: {str(e)[:2000]}")
            return 1
        print(f"{name} N_TOP={consts.get('N_TOP', '-')}: ok, {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
