"""The MoE layer of the decode step on the GPU, two ways, at the lite preset's shapes: the torch
path (gate, route plan, grouped GEMMs, combine) against the fused Triton path (router kernel,
expert kernels, combine in the next norm). Prints, per batch size, the device time of one layer's
MoE captured in a CUDA graph (so launch overhead on the host is excluded, as in the decode step),
the bytes that layer must read and the bandwidth that implies, and how far the two paths' outputs
are apart. With --sweep it also times the expert kernels under several tilings.

    python tools/dev/kernel_bench.py [--batches 1,8,64,256] [--sweep] [--profile] [--out report.json]
    python tools/dev/kernel_bench.py --mla [--batches 1,8,64,256] [--mla-length 256 --mla-ctx 150]
        [--mla-fixed-split 32 8 256 64]
    python tools/dev/kernel_bench.py --norm-proj
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from pegainfer.engine.config import ModelConfig  # noqa: E402
from pegainfer.engine.cuda_graphs import capture  # noqa: E402
from pegainfer.engine.kernels import mla_output, moe_experts  # noqa: E402
from pegainfer.engine.kernels.config import KernelConfig, RowTiling  # noqa: E402
from pegainfer.engine.kernels.mla_decode import auto_split  # noqa: E402
from pegainfer.engine.kernels.moe_route import fused_route  # noqa: E402
from pegainfer.engine.kernels.rmsnorm import moe_rmsnorm, rmsnorm  # noqa: E402
from pegainfer.engine.presets import PRESETS  # noqa: E402
from pegainfer.ep.experts import ExpertShard  # noqa: E402
from pegainfer.ep.plan import RoutePlan  # noqa: E402
from pegainfer.engine.model.router import route  # noqa: E402


DEFAULT = KernelConfig()


def graph_time_us(fn, inner: int = 20, reps: int = 10) -> float:
    """Device time of fn, µs per call: fn captured `inner` times into one CUDA graph, replayed
    `reps` times. The repetition inside the graph matters on a slow host: one replay per call would
    time the host's launch, not the kernels."""
    g, _ = capture(lambda: [fn() for _ in range(inner)], None)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * inner)


def rotating_time_us(fn, copies: list) -> float:
    """graph_time_us of fn(w), each of the graph's calls taking the next of `copies` (one weight copy
    per call, as the step's layers each read their own: the reads come from HBM, not L2)."""
    turn = itertools.cycle(copies)
    return graph_time_us(lambda: fn(next(turn)))


def kernel_table(fn, reps: int = 10) -> str:
    """Per-kernel device time of eager calls (the profiler's view; host time is not counted)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=16, max_name_column_width=50)


def mla_rows(batches: list[int], length: int = 256, ctx: int = 150, fixed_split: tuple[int, ...] | None = None
             ) -> list[dict]:
    """MLA decode attention of one layer at lite's shapes (16 heads, latent 512 + 64, value 128):
    the split kernel and each merge kernel with W_UV applied, and the batch-invariant plan (split and
    fixed merge, engine/kernels/mla_fixed.py; fixed_split: its (decode_split_len, decode_max_splits,
    decode_long_split, decode_most_splits), default the KernelConfig's, with its work list), µs
    per layer; at a few rows also the output kernel against the separate kernels it replaces
    (output_rows)."""
    from pegainfer.engine.kernels.mla_decode import mla_decode
    dev, dt = torch.device("cuda"), torch.bfloat16
    h, rank, rope, v = 16, 512, 64, 128
    w_uv_t = torch.randn(h, rank, v, device=dev, dtype=dt) * 0.05
    out = []
    for b in batches:
        cache = paged_cache(b + 1, length, rank + rope, dev, dt)  # (pages, table): each row's pages scattered
        q = torch.randn(b, h, rank + rope, device=dev, dtype=dt) * 0.1
        slots = torch.arange(b, device=dev)
        lens = torch.full((b,), ctx, device=dev)
        row = {"mla_batch": b, "length": length, "ctx": ctx}
        split_len = auto_split(b, length, DEFAULT.split_programs)
        ref = mla_decode(q, *cache, slots, lens, length, 0.1, rank, split_len=split_len, w_uv_t=w_uv_t, merge="row").float()
        for merge in ("row", "block"):
            row[f"{merge}_us"] = round(graph_time_us(
                lambda: mla_decode(q, *cache, slots, lens, length, 0.1, rank, split_len=split_len, w_uv_t=w_uv_t, merge=merge)), 1)
            got = mla_decode(q, *cache, slots, lens, length, 0.1, rank, split_len=split_len, w_uv_t=w_uv_t, merge=merge).float()
            row[f"{merge}_max_abs_diff"] = float((got - ref).abs().max())
        row["split_only_us"] = round(graph_time_us(
            lambda: mla_decode(q, *cache, slots, lens, length, 0.1, rank, split_len=split_len, merge="row")), 1)
        # the batch-invariant plan (KernelConfig.batch_invariant): splits by each row's length, one merge
        from pegainfer.engine.kernels.mla_fixed import launches_of, mla_decode_fixed, split_plan
        from pegainfer.engine.kernels.mla_rule import SplitRule, rule_of
        rule = SplitRule(*fixed_split) if fixed_split else rule_of(DEFAULT)
        row["fixed_split"] = list(rule)

        def fixed():  # the step's work list (once a step) and one layer's launches
            launches = launches_of(DEFAULT)
            step = split_plan(lens, length, rule, DEFAULT.decode_merge_group)
            return mla_decode_fixed(q, *cache, slots, lens, plan=step, scale=0.1, rank=rank, rule=rule,
                                    programs=DEFAULT.split_programs, w_uv_t=w_uv_t, launches=launches)
        row["fixed_us"] = round(graph_time_us(fixed), 1)
        got = fixed().float()
        row["fixed_max_abs_diff"] = float((got - ref).abs().max())
        if b <= 4:
            row |= output_rows(q, cache, slots, lens, length, w_uv_t)
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def paged_cache(rows: int, length: int, width: int, dev, dt) -> tuple[torch.Tensor, torch.Tensor]:
    """A paged latent cache as the engine holds it (engine/kv_cache.py): random pages [rows * length / P
    + 1, P, width] and a page table [rows, length / P] naming them in a random order."""
    from pegainfer.engine.kv_cache import PAGE_SIZE
    per = -(-length // PAGE_SIZE)
    pages = torch.randn(rows * per + 1, PAGE_SIZE, width, device=dev, dtype=dt)
    return pages, torch.randperm(rows * per, device=dev).view(rows, per).to(torch.int32)


def output_rows(q, cache, slots, lens, length: int, w_uv_t) -> dict:
    """The end of the layer at a few rows: the merge kernel with W_UV, then cuBLAS's o_proj and the
    norm kernel ("apart") against the output kernel (o_proj, add and norm in one launch) under a
    few tilings (block j, block k, warps), µs including the split and merge launches. Each o_proj
    read comes from HBM: one weight copy per call of the 20 in a graph, as in the step."""
    import torch.nn.functional as F
    from pegainfer.engine.kernels.mla_decode import mla_decode
    from pegainfer.engine.kernels.rmsnorm import rmsnorm
    b, hid, rank = q.shape[0], 2048, w_uv_t.shape[1]
    split_len = auto_split(b, length, DEFAULT.split_programs)
    dev, dt = q.device, q.dtype
    w_o = [torch.randn(hid, hid, device=dev, dtype=dt) * 0.02 for _ in range(20)]
    res = torch.randn(b, hid, device=dev, dtype=dt)
    norm_w = torch.ones(hid, device=dev, dtype=dt)
    count = torch.zeros(b, dtype=torch.int32, device=dev)

    def apart(w):
        o = mla_decode(q, *cache, slots, lens, length, 0.1, rank, split_len=split_len, w_uv_t=w_uv_t, merge="row")
        return rmsnorm(F.linear(o, w), norm_w, 1e-6, residual=res)

    def fused(w, tiling: tuple):
        o = mla_decode(q, *cache, slots, lens, length, 0.1, rank, split_len=split_len, w_uv_t=w_uv_t, merge="row")
        return mla_output.proj_norm(o, w, res, norm_w, 1e-6, count, RowTiling(*tiling))

    return tiling_rows(apart, fused, w_o, ((16, 512, 4), (8, 1024, 4), (32, 256, 4), (16, 512, 8), (4, 2048, 4)),
                       "apart", "fused")


def norm_proj_rows() -> dict:
    """The start of a MoE-fed layer at one row: the combine folded into the norm kernel, then
    cuBLAS's q/kv_a GEMV ("apart"), against engine/kernels/norm_proj.py under a few tilings (block j,
    block k, warps), µs. One weight copy per call of the 20 in a graph, as in the step."""
    import torch.nn.functional as F
    from pegainfer.engine.kernels.norm_proj import norm_proj
    dev, dt, hid, n = torch.device("cuda"), torch.bfloat16, 2048, 3072 + 576
    ws = [torch.randn(n, hid, device=dev, dtype=dt) * 0.02 for _ in range(20)]
    routed, shared = torch.randn(1, 6, hid, device=dev), torch.randn(1, hid, device=dev, dtype=dt)
    res = torch.randn(1, hid, device=dev, dtype=dt)
    nw = torch.ones(hid, device=dev, dtype=dt)

    def apart(w):
        h, x = moe_rmsnorm(routed, shared, nw, 1e-6, residual=res)
        return F.linear(h, w), x

    return tiling_rows(apart, lambda w, t: norm_proj((routed, shared), res, nw, 1e-6, w, RowTiling(*t)), ws,
                       ((16, 512, 4), (32, 256, 4), (32, 512, 8), (8, 1024, 4), (16, 256, 4), (64, 256, 8)),
                       "norm_proj_apart", "norm_proj")


def tiling_rows(apart, fused, copies: list, tilings, apart_name: str, fused_name: str) -> dict:
    """µs of apart(w) and of fused(w, (block j, block k, warps)) under each tiling, one weight copy
    per call (rotating_time_us), and each fused output's relative distance from apart's (first
    output of each)."""
    row = {f"{apart_name}_us": round(rotating_time_us(apart, copies), 1)}
    ref = apart(copies[0])[0].float()
    for tiling in tilings:
        name = "{}_j{}_k{}_w{}".format(fused_name, *tiling)
        row[f"{name}_us"] = round(rotating_time_us(lambda w: fused(w, tiling), copies), 1)
        row[f"{name}_rel"] = round(float((fused(copies[0], tiling)[0].float() - ref).norm() / ref.norm()), 5)
    return row


def sweep_tilings(kind: str) -> list:
    T = moe_experts.Tiling
    if kind == "many":  # prompt-sized steps (ExpertTilings.many_rows): block_k 128 only (the K order)
        # (128 gate-up columns at 64 or 128 rows need more shared memory than sm_90 has: not listed)
        return [T(bm, 128, 64, dn, w, st) for bm in (64, 128) for dn in (64, 128) for w in (4, 8) for st in (2, 3)] + [
            T(32, 128, 64, 64, 4, 3), T(32, 128, 128, 128, 8, 3)]
    if kind == "grid":
        return [T(bm, bk, n, n, 4, st) for bm in (16, 32, 64) for bk in (64, 128) for n in (32, 64) for st in (3, 4)]
    return [T(16, bk, un, dn, w, st) for bk in (128, 256) for un, dn in ((64, 64), (64, 32), (32, 32), (128, 64))
            for w in (2, 4) for st in (3, 4)]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="1,8,64,256")
    p.add_argument("--sweep", nargs="?", const="grid", choices=["grid", "small", "many"],
                   help="time the expert kernels under several tilings: grid (block m, k, n, stages) or small "
                        "(the few-rows-per-expert shapes: n per kernel, warps, k up to 256) or many (prompt-sized "
                        "steps, block_k 128)")
    p.add_argument("--profile", action="store_true", help="per-kernel device times of both paths")
    p.add_argument("--mla", action="store_true", help="only MLA decode attention: split and the merge kernels")
    p.add_argument("--mla-length", type=int, default=256, help="--mla: the static bound (a graph bucket)")
    p.add_argument("--mla-ctx", type=int, default=150, help="--mla: every row's context")
    p.add_argument("--mla-fixed-split", type=int, nargs=4, metavar=("SPLIT_LEN", "MAX_SPLITS", "LONG", "MOST"),
                   help="--mla: the batch-invariant plan's split rule (default: KernelConfig's)")
    p.add_argument("--norm-proj", action="store_true", help="only the layer's input: combine, norm and q/kv_a")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if a.norm_proj:
        row = norm_proj_rows()
        print(json.dumps(row), flush=True)
        if a.out:
            a.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": [row]}))
        return 0
    if a.mla:
        rows = mla_rows([int(x) for x in a.batches.split(",")], a.mla_length, a.mla_ctx,
                        tuple(a.mla_fixed_split) if a.mla_fixed_split else None)
        if a.out:
            a.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "mla": rows}))
        return 0
    cfg = ModelConfig.from_dict(PRESETS["lite"])
    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    e, h, i, k = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    w13 = {0: torch.randn(e, 2 * i, h, device=dev, dtype=dt, generator=g) * 0.02}
    w2 = {0: torch.randn(e, h, i, device=dev, dtype=dt, generator=g) * 0.02}
    gate = torch.randn(e, h, device=dev, generator=g) * 0.02
    shard = ExpertShard(range(e), w13, w2)
    norm_w = torch.ones(h, device=dev, dtype=dt)
    totals = torch.zeros(e, dtype=torch.int64, device=dev)
    expert_bytes = 3 * i * h * 2
    rows = []
    for b in [int(x) for x in a.batches.split(",")]:
        x = torch.randn(b, h, device=dev, dtype=dt, generator=g)
        resid = torch.randn(b, h, device=dev, dtype=dt, generator=g)
        shared = torch.zeros(b, h, device=dev, dtype=dt)

        def torch_path():
            wts, ids = route(x, gate, top_k=k)
            plan = RoutePlan.build(wts, ids, e)
            y = shard._run_grouped(0, x, plan.token_index, plan.weight, plan.expert_counts)
            return rmsnorm(plan.combine(y).to(dt) + shared, norm_w, 1e-6, residual=resid)[0]

        def fused_path(tiling=None):  # as the decode step runs it: the router puts the routes in expert order
            al = moe_experts.Alignment.empty(b, k, totals)
            wts, _ = fused_route(x, gate, top_k=k, aligned=al)
            slots = moe_experts.fused_experts_token_major(x, w13[0], w2[0], wts, al,
                                                          tiling or DEFAULT.experts.tiling_for(b * k))
            return moe_rmsnorm(slots, shared, norm_w, 1e-6, residual=resid)[0]

        ref, got = torch_path().float(), fused_path().float()
        wts, ids = fused_route(x, gate, top_k=k)
        active = len(set(ids.flatten().tolist()))
        w_ref, e_ref = route(x, gate, top_k=k)
        same_routes = bool(torch.equal(e_ref.sort(-1).values, ids.long()))
        row = {"batch": b, "active_experts": active, "same_routes": same_routes,
               "rel_diff": round(float((got - ref).norm() / ref.norm()), 5),
               "torch_us": round(graph_time_us(torch_path), 1), "fused_us": round(graph_time_us(fused_path), 1),
               "route_us": round(graph_time_us(
                   lambda: fused_route(x, gate, top_k=k, aligned=moe_experts.Alignment.empty(b, k, totals))), 1)}
        floor_us = active * expert_bytes / 4.2e12 * 1e6
        row["weight_floor_us"] = round(floor_us, 1)
        if a.sweep:
            sweep = {}
            for t in sweep_tilings(a.sweep):
                name = f"m{t.block_m}/k{t.block_k}/n{t.up_n}-{t.down_n}/w{t.num_warps}/s{t.num_stages}"
                try:
                    sweep[name] = round(graph_time_us(lambda: fused_path(t)), 1)
                except Exception as err:  # a tiling that does not compile is reported, not fatal
                    sweep[name] = type(err).__name__
            row["sweep_us"] = sweep
            row["best"] = min(((v, kk) for kk, v in sweep.items() if isinstance(v, float)), default=None)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.profile:
            print(f"batch {b}: torch path\n" + kernel_table(torch_path) + f"\nbatch {b}: fused path\n"
                  + kernel_table(fused_path), flush=True)
    if a.out:
        a.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
