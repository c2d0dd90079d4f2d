"""Does the batch-invariant linear's row block (LinearTiling.block_m) change a row's bits on this
GPU? Triton runs tl.dot with mma.sync below 64 rows per block and with wgmma (Hopper) from 64, and
only equal bits across block sizes would let large prompt steps take wider row blocks. For the lite
shapes, bf16: the output at block_m 16 against 32, 64 and 128 (bitwise), and the time of one call
at a prompt step's row count against F.linear. CUDA only.

    python tools/dev/linear_blockm.py [--rows 8192] [--out r.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pegainfer.engine.kernels.config import LinearTiling  # noqa: E402
from pegainfer.engine.kernels.linear import triton_linear  # noqa: E402
from tools.dev.linear_bench import SHAPES  # noqa: E402


def time_us(fn, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("linear_blockm: error: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    out = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        row = {"shape": name, "n": n, "k": k}
        for m in (1, 256, a.rows):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = triton_linear(x, w, LinearTiling())
            row[f"equal_m{m}"] = {bm: bool(torch.equal(ref, triton_linear(x, w, dataclasses.replace(
                LinearTiling(), block_m=bm, num_warps=4 if bm < 64 else 8)))) for bm in (32, 64, 128)}
        x = torch.randn(a.rows, k, device="cuda", dtype=torch.bfloat16)
        row["us"] = {"cublas": round(time_us(lambda: F.linear(x, w)), 1)}
        for bm in (16, 32, 64, 128):
            t = dataclasses.replace(LinearTiling(), block_m=bm, num_warps=4 if bm < 64 else 8)
            row["us"][f"block_m {bm}"] = round(time_us(lambda: triton_linear(x, w, t)), 1)
        print(json.dumps(row))
        out.append(row)
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
