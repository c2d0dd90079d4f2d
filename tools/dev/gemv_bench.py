"""The decode step's narrow projections at one row, on the GPU: cuBLAS (F.linear) against the split-K
Triton kernel (engine/kernels/gemv.py) under a sweep of tilings, at the lite preset's shapes. Each
timing is one CUDA graph that runs the projection over as many distinct weight copies as the model
has layers, so every call reads its weight from HBM as the decode step does (a repeated call on one
weight would find it in the 50 MB L2). "warm" repeats one weight, for comparison (what an L2
prefetch could give). Prints one JSON line per shape and writes them with --out.

    python tools/dev/gemv_bench.py [--rows 1] [--out report.json]
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
import torch.nn.functional as F  # noqa: E402

from pegainfer.engine.kernels import gemv  # noqa: E402
from tools.dev.kernel_bench import graph_time_us  # noqa: E402

SHAPES = {"q_kv_a": (3072 + 576, 2048), "o_proj": (2048, 2048), "shared_gate_up": (2 * 2816, 2048),
          "shared_down": (2048, 2816)}  # [N, K]
LAYERS = 27
COPY_TBPS = 4.2


def graph_us(calls, reps: int = 10) -> float:
    """µs per call: every call of `calls` captured once into one graph, replayed `reps` times."""
    return round(graph_time_us(lambda: [c() for c in calls], inner=1, reps=reps) / len(calls), 2)


def tilings() -> list[gemv.Tiling]:
    out = []
    for bn in (16, 32, 64):
        for bk in (128, 256, 512):
            for split in (1, 2, 4, 8):
                if bn * bk <= 16384:
                    out.append(gemv.Tiling(bn, bk, split, 4, 3))
    return out


def shape_row(name: str, n: int, k: int, m: int) -> dict:
    dev, dt = torch.device("cuda"), torch.bfloat16
    ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(LAYERS)]
    x = torch.randn(m, k, device=dev, dtype=dt)
    floor = n * k * 2 / (COPY_TBPS * 1e12) * 1e6
    row = {"shape": name, "rows": m, "n": n, "k": k, "floor_us": round(floor, 2),
           "cublas_us": graph_us([lambda w=w: F.linear(x, w) for w in ws]),
           "cublas_warm_us": graph_us([lambda: F.linear(x, ws[0])] * LAYERS)}
    ref = F.linear(x.float(), ws[0].float())
    sweep = {}
    for t in tilings():
        key = f"n{t.block_n}/k{t.block_k}/s{t.split}/w{t.num_warps}"
        try:
            parts = [torch.empty(t.split, m, n, dtype=torch.float32, device=dev) for _ in ws]
            got = gemv.splitk_parts(x, ws[0], t).sum(0)
            err = float((got - ref).abs().max() / ref.abs().max())
            if err > 1e-3:
                sweep[key] = f"wrong ({err:.1e})"
                continue
            sweep[key] = graph_us([lambda w=w, p=p, t=t: gemv.splitk_parts(x, w, t, out=p) for w, p in zip(ws, parts)])
        except Exception as e:  # noqa: BLE001 - a tiling that does not compile is reported, not fatal
            sweep[key] = type(e).__name__
    timed = {k: v for k, v in sweep.items() if isinstance(v, float)}
    best = min(timed, key=timed.get) if timed else None
    row["triton_best"] = [timed[best], best] if best else None
    default = f"n{gemv.TILING.block_n}/k{gemv.TILING.block_k}/s{gemv.TILING.split}/w{gemv.TILING.num_warps}"
    row["triton_default_us"] = sweep.get(default)
    row["sweep_us"] = sweep
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("gemv_bench: error: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for m in (int(r) for r in a.rows.split(",")):
        for name in a.shapes.split(","):
            row = shape_row(name, *SHAPES[name], m)
            print(json.dumps({k: v for k, v in row.items() if k != "sweep_us"}), flush=True)
            rows.append(row)
    if a.out:
        a.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                                    indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
