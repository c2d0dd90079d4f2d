"""The batch-invariant linear's Triton kernel (engine/kernels/linear.py) against F.linear (cuBLAS) on
the GPU, at the lite preset's projection shapes and several row counts. Each timing is one CUDA
graph of 20 calls that take turns over enough weight copies to overflow the 50 MB L2, so every call
reads its weight from HBM as the decode step's layers do. Prints a table (µs per call, the Triton
kernel's plan, the HBM bandwidth its weight read implies, its largest difference from F.linear
relative to the output's largest value); --sweep also times a few LinearTilings per row (k_chunk
and block_k change the bits a row gets, never whether they depend on the batch); --out writes JSON.

    python tools/dev/linear_bench.py [--rows 1,8,64,256,2048] [--shapes o_proj,lm_head] [--sweep] [--out r.json]
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

from pegainfer.engine.kernels import linear as L  # noqa: E402
from pegainfer.engine.kernels.config import LinearTiling  # noqa: E402
from tools.dev.kernel_bench import rotating_time_us  # noqa: E402

SHAPES = {"o_proj": (2048, 2048), "q_kv_a": (3648, 2048), "shared_gate_up": (2816, 2048),
          "lm_head": (102400, 2048), "shared_down_1": (2048, 1408), "shared_down_2": (2048, 2816),
          "dense_down": (2048, 10944), "dense_gate_up": (21888, 2048)}  # [N, K]
L2_BYTES = 50 * 2**20
SWEEP = [LinearTiling(programs=p) for p in (132, 528)] + [
    LinearTiling(k_chunk=c) for c in (512, 1024)] + [
    LinearTiling(block_k=128), LinearTiling(block_k=128, k_chunk=512), LinearTiling(num_stages=4),
    LinearTiling(num_warps=8), LinearTiling(block_n_min=16), LinearTiling(block_n_max=256)]
# --sweep wide: only what changes no bits (row blocks, warps, stages, column blocks, programs), for
# the many-row calls where issue 26's cost is largest (64-row blocks from 256 rows are the default)
WIDE = [LinearTiling(wide_block_m=128), LinearTiling(wide_block_m=128, wide_num_warps=4),
        LinearTiling(wide_num_warps=4), LinearTiling(num_stages=4), LinearTiling(num_stages=2),
        LinearTiling(block_n_max=256), LinearTiling(block_n_min=64), LinearTiling(block_n_min=64, num_stages=4),
        LinearTiling(wide_rows=64), LinearTiling(wide_rows=64, wide_block_m=128)]


# --sweep one: what changes no bits at one row (programs aimed at, the narrowest column block, so
# that the chunks stay in one program, stages, warps), and larger K chunks (other bits, still
# invariant): where issue 26's batch-1 cost sits (the one-row fused kernels are off when invariant)
ONE = [LinearTiling(programs=p) for p in (132, 528)] + [
    LinearTiling(block_n_min=16, programs=p, num_stages=s) for p in (64, 128) for s in (3, 6)] + [
    LinearTiling(num_stages=s) for s in (2, 4, 6)] + [LinearTiling(num_warps=w) for w in (2, 8)] + [
    LinearTiling(k_chunk=c) for c in (512, 1024)] + [LinearTiling(block_n_min=16, num_stages=4)]


def label(t: LinearTiling) -> str:
    d = LinearTiling()
    changed = [f.name for f in dataclasses.fields(t) if getattr(t, f.name) != getattr(d, f.name)]
    return ",".join(f"{name}={getattr(t, name)}" for name in changed) or "default"


def plan_label(p: L.Plan) -> str:
    return f"n{p.block_n}/{'split' if p.split else 'whole'}x{p.chunks}"


def row(name: str, n: int, k: int, m: int, sweep: list[LinearTiling]) -> dict:
    dev, dt = torch.device("cuda"), torch.bfloat16
    copies = max(2, min(16, -(-2 * L2_BYTES // (n * k * 2))))
    ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device=dev, dtype=dt)
    t = LinearTiling()
    ref = F.linear(x.float(), ws[0].float())
    err = float((L.triton_linear(x, ws[0], t).float() - ref).abs().max() / ref.abs().max())
    out = {"shape": name, "n": n, "k": k, "rows": m, "plan": plan_label(L.plan(m, n, k, t)),
           "cublas_us": round(rotating_time_us(lambda w: F.linear(x, w), ws), 2),
           "triton_us": round(rotating_time_us(lambda w: L.triton_linear(x, w, t), ws), 2), "rel_err": err}
    out["ratio"] = round(out["triton_us"] / out["cublas_us"], 3)
    out["triton_tbps"] = round(n * k * 2 / (out["triton_us"] * 1e-6) / 1e12, 2)
    if sweep:
        out["sweep_us"] = {}
        for s in sweep:
            try:
                us = round(rotating_time_us(lambda w, s=s: L.triton_linear(x, w, s), ws), 2)
            except Exception as e:  # noqa: BLE001 - a tiling that does not compile is reported, not fatal
                us = type(e).__name__
            out["sweep_us"][f"{label(s)} [{plan_label(L.plan(m, n, k, s))}]"] = us
    del ws
    torch.cuda.empty_cache()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,8,64,256,2048")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--sweep", nargs="?", const="bits", choices=["bits", "wide", "one"],
                   help="bits: tilings incl. ones that change a row's bits; wide: only bit-neutral ones; one: "
                        "one-row candidates")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("linear_bench: error: needs a CUDA GPU", file=sys.stderr)
        return 2
    head = (f"{'shape':<15}{'N':>7}{'K':>7}{'M':>6}  {'plan':<16}{'cuBLAS µs':>10}{'Triton µs':>10}{'ratio':>7}"
            f"{'TB/s':>6}{'rel err':>9}")
    print(head, flush=True)
    rows = []
    for name in a.shapes.split(","):
        for m in (int(r) for r in a.rows.split(",")):
            r = row(name, *SHAPES[name], m, {None: [], "bits": SWEEP, "wide": WIDE, "one": ONE}[a.sweep])
            rows.append(r)
            print(f"{r['shape']:<15}{r['n']:>7}{r['k']:>7}{r['rows']:>6}  {r['plan']:<16}{r['cublas_us']:>10.2f}"
                  f"{r['triton_us']:>10.2f}{r['ratio']:>7.2f}{r['triton_tbps']:>6.2f}{r['rel_err']:>9.1e}", flush=True)
            for key, us in r.get("sweep_us", {}).items():
                print(f"    {key:<60}{us:>10}", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                     "default": dataclasses.asdict(LinearTiling()), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
