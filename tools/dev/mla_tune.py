"""The batch-invariant split MLA decode (engine/kernels/mla_fixed.py) at lite's shapes on a GPU, µs a
layer, for a few split rules and launch shapes: each (batch, context) case replayed in a CUDA graph
over COPIES layers' caches in turn (more bytes than the L2 holds, as a decode step's 27 layers), the
work list made once per pass as the step makes it. One line of JSON per case; with --out, all of
them. The variants are the candidates for KernelConfig's decode_* fields and mla_fixed.Launches.

    python tools/dev/mla_tune.py [--cases 1x1024,1x4096,1x16384,1x32768,64x4096,256x1024] [--variants base,s1,...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from pegainfer.engine.kernels.mla_fixed import Launches, launches_of, mla_decode_fixed, split_plan  # noqa: E402
from pegainfer.engine.kernels.mla_rule import SplitRule, rule_of  # noqa: E402
from tools.dev.kernel_bench import graph_time_us, paged_cache  # noqa: E402

K = KernelConfig()
BASE = rule_of(K)
R1 = SplitRule(32, 8, 256, 64)  # round 1's rule (the default before 2026-12-06's tune)
VARIANTS = {  # name: (rule, launches)
    "base": (BASE, launches_of(K)),  # the engine's defaults
    # round 1 (2026-12-06, H100): against R1 with Launches() (32-key steps, 8 warps, 3 stages)
    "r1": (R1, Launches()),
    "old": (SplitRule(32, 8), Launches()),  # at most 8 splits a row: the rule before
    "s1": (R1, Launches(split_stages=1)),
    "s4": (R1, Launches(split_stages=4)),
    "w4": (R1, Launches(split_warps=4)),
    "m1": (R1, Launches(merge_stages=1)),
    "m4": (R1, Launches(merge_stages=4, merge_warps=4)),
    "u2": (R1, Launches(merge_unroll=2)),
    "g8": (R1, Launches()),  # a first merge level of 8 splits (GROUPS; mla_group.py)
    "b64": (SplitRule(64, 8, 256, 64), Launches(block_n=64)),
    "r128": (SplitRule(32, 8, 128, 128), Launches()),
    "r512": (SplitRule(32, 8, 512, 32), Launches()),
    # round 2 (after round 1: b64 best at batch 1, w4 at 64-256 rows); bw2 became the default
    "bw": (SplitRule(64, 8, 256, 64), Launches(block_n=64, split_warps=4)),
    "bwu": (SplitRule(64, 8, 256, 64), Launches(block_n=64, split_warps=4, merge_unroll=2)),
    "bwg": (SplitRule(64, 8, 256, 64), Launches(block_n=64, split_warps=4)),
    "bwm": (SplitRule(64, 8, 256, 128), Launches(block_n=64, split_warps=4)),
    "b128": (SplitRule(128, 8, 256, 64), Launches(block_n=64, split_warps=4)),
    "bw2": (SplitRule(64, 8, 256, 64), Launches(block_n=64, split_warps=4, split_stages=2)),
    # next: the defaults with the per-row first merge level (groups of 8 / 4 of a long row's splits)
    "g8r": (BASE, launches_of(K)),
    "g4r": (BASE, launches_of(K)),
}
# the variants with a first merge level: splits a long row's group takes (KernelConfig.decode_merge_group;
# on 2026-12-06 g8 and bwg grouped every row, before groups were for long rows only)
GROUPS = {"g8": 8, "bwg": 8, "g8r": 8, "g4r": 4}
COPIES = 4  # caches walked in turn: more than the L2 at the long contexts


def case_us(b: int, ctx: int, rule: SplitRule, launches: Launches, group: int, programs: int) -> float:
    dev, dt = torch.device("cuda"), torch.bfloat16
    h, rank, rope, v = 16, 512, 64, 128
    caches = [paged_cache(b, ctx, rank + rope, dev, dt) for _ in range(COPIES)]
    q = torch.randn(b, h, rank + rope, device=dev, dtype=dt) * 0.1
    w_uv = torch.randn(h, rank, v, device=dev, dtype=dt) * 0.05
    slots = torch.arange(b, device=dev)
    lens = torch.full((b,), ctx, device=dev)

    def step():  # one work list, then COPIES layers
        plan = split_plan(lens, ctx, rule, group)
        return [mla_decode_fixed(q, pages, table, slots, lens, plan=plan, scale=0.1, rank=rank, rule=rule,
                                 programs=programs, w_uv_t=w_uv, launches=launches) for pages, table in caches]
    return graph_time_us(step, inner=5, reps=10) / COPIES


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="1x1024,1x4096,1x16384,1x32768,64x4096,256x1024")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--programs", type=int, default=K.split_programs)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    rows = []
    for name in a.variants.split(","):
        rule, launches = VARIANTS[name]
        for c in a.cases.split(","):
            b, ctx = (int(x) for x in c.split("x"))
            try:
                us = round(case_us(b, ctx, rule, launches, GROUPS.get(name, 0), a.programs), 1)
            except Exception as e:  # noqa: BLE001 - a variant that fails is reported, the others still run
                us = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append({"variant": name, "batch": b, "ctx": ctx, "us_per_layer": us})
            print(json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()
    if a.out:
        a.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
