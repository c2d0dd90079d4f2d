"""Does programmatic dependent launch (PDL, Hopper's griddepcontrol) pay inside our CUDA graphs?
Times chains of small kernels captured in one graph, launched plainly and with PDL, on the GPU:

- `tiny`: an elementwise kernel over [rows, 2048] bf16 (the size of a decode step's norms);
- `gemv`: y = x W^T with W [1024, 2048] bf16, a fresh W per link (4 MB each, so L2 cannot hold the
  chain), the shape of a decode projection at one row;
- `gemv_prefetch`: the same, with each program's first weight tile loaded before it waits for the
  previous kernel (weights never depend on it; only x does).

Prints µs per link for each and whether PDL's outputs equal the plain ones. A chain link depends
on the previous one's output, as a decode step's kernels do.

    python tools/pdl_bench.py [--rows 1,64] [--links 64] [--out pdl.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from engine.cuda_graphs import capture  # noqa: E402


@triton.jit
def _tiny_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if PDL:
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(y_ptr + offs, x * 1.0001 + 0.5, mask=offs < N)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    w0 = tl.zeros([BLOCK_K, BLOCK_N], tl.bfloat16)
    if PREFETCH:  # the first weight tile does not depend on the previous kernel
        w0 = tl.load(w_ptr + n[None, :] * K + ks[:, None])
    if PDL:
        tl.extra.cuda.gdc_wait()
    start = 0
    if PREFETCH:
        x = tl.load(x_ptr + m[:, None] * K + ks[None, :], mask=m[:, None] < M, other=0.0)
        acc = tl.dot(x, w0, acc)
        start = BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        x = tl.load(x_ptr + m[:, None] * K + (k0 + ks)[None, :], mask=m[:, None] < M, other=0.0)
        w = tl.load(w_ptr + n[None, :] * K + (k0 + ks)[:, None])
        acc = tl.dot(x, w, acc)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(y_ptr + m[:, None] * N + n[None, :], acc.to(tl.bfloat16), mask=m[:, None] < M)


def chain_us(launch, links: int, reps: int = 20) -> float:
    g, _ = capture(lambda: [launch(i) for i in range(links)], None)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * links)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,64")
    p.add_argument("--links", type=int, default=64)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    dev = torch.device("cuda")
    h, n_out = 2048, 1024
    rows_out = []
    for rows in [int(r) for r in a.rows.split(",")]:
        bufs = [torch.randn(rows, h, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        ws = [torch.randn(n_out, h, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(a.links)]
        assert rows & (rows - 1) == 0, "rows: powers of two (the GEMV's row block)"
        xs = [torch.randn(rows, h, device=dev, dtype=torch.bfloat16) for _ in range(a.links + 1)]
        row = {"rows": rows, "links": a.links}
        for kind in ("tiny", "gemv", "gemv_prefetch"):
            outs = {}
            for pdl in (False, True):
                def launch(i, pdl=pdl, kind=kind):
                    if kind == "tiny":
                        x, y = bufs[i % 2], bufs[(i + 1) % 2]
                        _tiny_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024, PDL=pdl,
                                                                      launch_pdl=pdl)
                    else:  # x_i [rows, H] -> y [rows, n_out] written into the front of x_{i+1} (the next link reads it)
                        y = xs[i + 1]
                        _gemv_kernel[(n_out // 32,)](xs[i], ws[i], y, rows, n_out, h, BLOCK_M=max(16, rows),
                                                     BLOCK_N=32, BLOCK_K=128, PDL=pdl,
                                                     PREFETCH=kind == "gemv_prefetch", launch_pdl=pdl)
                try:
                    row[f"{kind}_{'pdl' if pdl else 'plain'}_us"] = round(chain_us(launch, a.links), 2)
                    outs[pdl] = (bufs[0].clone() if kind == "tiny" else xs[-1].clone())
                except Exception as err:  # report, do not die: the point is to learn whether it works
                    row[f"{kind}_{'pdl' if pdl else 'plain'}_error"] = f"{type(err).__name__}: {err}"[:300]
            if len(outs) == 2 and kind != "tiny":  # the tiny chain feeds back on itself
                row[f"{kind}_same_output"] = bool(torch.equal(outs[False], outs[True]))
        if "gemv_plain_us" in row:
            row["gemv_floor_us"] = round(n_out * h * 2 / 4.2e12 * 1e6, 2)
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    if a.out:
        a.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                     "triton": triton.__version__, "rows": rows_out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
