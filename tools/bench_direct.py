"""Direct (in-process, no HTTP) benchmark of the engine: prefill time, steady decode TPOT and
decode tok/s per batch size, optionally beside HF transformers with the same weights
(--compare-hf) and with a per-phase profile of decode steps (--attribution).

    python tools/bench_direct.py (--model DIR | --preset tiny|lite) [--device cuda] [--dtype bfloat16]
        [--backend local] [--ep-size 1] [--batches 1,4,8] [--prompt-len 128] [--new-tokens 64]
        [--warmup 2] [--iters 3] [--compare-hf] [--attribution] [--no-async-scheduling]
        [--sampling greedy,top-p,penalties,logprobs,mix] [--device-sampler auto|off] --out FILE.json

Decode runs as the daemon runs it by default (--async-scheduling: step N+1 launched before step N's
tokens are read); --no-async-scheduling times each step between device synchronizes. --sampling gives
row r a profile's parameters for index r (tools/benchkit/sampling.py; default greedy), each profile
timed at every batch size on the one engine; a sampled run is overlapped only where the decode graph
samples on the device (CUDA), as the daemon runs it.

Writes FILE.json (report_intent "direct_diagnostic") and a markdown summary FILE.md beside it."""
from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from pegainfer.engine.engine import EngineSpec, build_engine  # noqa: E402
from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from pegainfer.engine.presets import PRESETS  # noqa: E402
from pegainfer.ep.preflight import REFUSALS, preflight  # noqa: E402
from tools.benchkit import hardware, hf_side, report  # noqa: E402
from tools.benchkit.attribution import profile_steps  # noqa: E402
from tools.benchkit.direct import DecodeRun, batch_prompts, run_ours, summarise, synchronizer  # noqa: E402
from tools.benchkit.sampling import PROFILES as SAMPLING, describe as describe_sampling  # noqa: E402

ATTRIBUTION_STEPS = 16


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="HF checkpoint folder")
    src.add_argument("--preset", choices=sorted(PRESETS), help="random weights of a preset, made on the device")
    p.add_argument("--seed", type=int, default=0, help="weights seed (presets) and prompt seed")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--backend", default="local")
    p.add_argument("--ep-size", type=int, default=1)
    p.add_argument("--batches", default="1,4,8", help="comma-separated batch sizes (rows decoding together)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per row")
    p.add_argument("--same-prompt", action="store_true",
                   help="the same prompt in every row (rows then route alike; default: a prompt per row)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per row (1 prefill + N-1 decode)")
    p.add_argument("--warmup", type=int, default=2, help="untimed generations per batch size")
    p.add_argument("--iters", type=int, default=3, help="timed generations per batch size")
    p.add_argument("--compare-hf", action="store_true", help="time HF transformers with the same weights too")
    p.add_argument("--attribution", action="store_true", help="profile decode steps per pegainfer:: phase")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                   help="overlapped decode, as the daemon's default (off: each step between synchronizes)")
    p.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=True,
                   help="the daemon's default (off: kernels chosen by row count, the A/B's other side)")
    p.add_argument("--sampling", default="greedy",
                   help=f"comma-separated profiles of the rows' sampling parameters, each timed at every batch "
                        f"size on one engine ({', '.join(SAMPLING)}: tools/benchkit/sampling.py; default greedy)")
    p.add_argument("--device-sampler", choices=["auto", "off"], default="auto",
                   help="sampled rows chosen inside the decode graph (auto, the default) or by engine.sampler on "
                        "the graph's logits (off: the path before issue 33, the A/B's other side)")
    p.add_argument("--sample-chunks", type=int,
                   help="KernelConfig.sample.chunks: the device sampler's programs per row (64, the default: each row "
                        "split over programs; 0: one program per row, the A/B)")
    p.add_argument("--float32-logits", action=argparse.BooleanOptionalAction, default=True,
                   help="KernelConfig.float32_logits: the LM head's float32 sums as the logits (the default; off: "
                        "rounded to the model dtype, the A/B's other side)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.sample_chunks is not None and a.sample_chunks < 0:
        p.error("--sample-chunks must be >= 0")
    try:
        a.batch_sizes = [int(x) for x in a.batches.split(",") if x.strip()]
    except ValueError:
        p.error(f"--batches must be comma-separated integers, got {a.batches!r}")
    if not a.batch_sizes or min(a.batch_sizes) < 1:
        p.error("--batches needs positive sizes")
    a.samplings = [x.strip() for x in a.sampling.split(",") if x.strip()]
    if not a.samplings or any(x not in SAMPLING for x in a.samplings):
        p.error(f"--sampling takes profiles among {', '.join(SAMPLING)}, got {a.sampling!r}")
    if a.compare_hf and a.samplings != ["greedy"]:
        p.error("--compare-hf times HF's greedy generation: use it with --sampling greedy")
    if a.prompt_len < 1 or a.new_tokens < 2 or a.iters < 1 or a.warmup < 0:
        p.error("need --prompt-len >= 1, --new-tokens >= 2 (one decode step at least), --iters >= 1, --warmup >= 0")
    return a


def measure(timed, batch: int, warmup: int, iters: int) -> dict:
    for _ in range(warmup):
        timed(batch)
    return summarise([timed(batch) for _ in range(iters)], batch)


def attribution(engine, prompts: list[list[int]], steps: int, sync, on_gpu: bool) -> dict:
    """Profiled eagerly: a CUDA-graph replay hides the phase marks, so the graphs step aside here
    (the eager step runs the same kernels, plus launch overhead the graph would not have)."""
    graphs, engine.runner.graphs = engine.runner.graphs, None
    try:
        with DecodeRun(engine, prompts, sync) as run:
            run.prefill()
            out = profile_steps(run.decode, steps, on_gpu)
    finally:
        engine.runner.graphs = graphs
    out["mode"] = "eager (CUDA graphs off while profiling)" if graphs is not None else "eager"
    return out


def row_prompts(a: argparse.Namespace, cfg, batch: int) -> list[list[int]]:
    return batch_prompts(cfg.vocab_size, [cfg.bos_token_id, cfg.eos_token_id], a.prompt_len, a.seed, batch,
                         distinct=not a.same_prompt)


def run_engine_side(a: argparse.Namespace, spec: EngineSpec) -> tuple[dict, object, list[dict]]:
    engine = build_engine(spec)
    try:
        cfg = engine.cfg
        sync, on_gpu = synchronizer(a.device), a.device.startswith("cuda")
        rows = []
        for profile, b in [(x, b) for x in a.samplings for b in a.batch_sizes]:
            row = measure(lambda n: run_ours(engine, row_prompts(a, cfg, n), a.new_tokens, sync, a.async_scheduling,
                                             profile), b, a.warmup, a.iters)
            row["sampling"] = profile
            if a.attribution:
                row["attribution"] = attribution(engine, row_prompts(a, cfg, b), min(a.new_tokens - 1, ATTRIBUTION_STEPS),
                                                 sync, on_gpu)
            rows.append(row)
            print(f"{profile} batch {b:>4}: prefill {row['prefill_ms_median']:.2f} ms, TPOT p50 {row['tpot_ms_p50']:.2f} ms, "
                  f"{row['decode_tok_s']:.1f} tok/s", file=sys.stderr)
        info = {"model": a.model or f"random preset {a.preset} (seed {a.seed})", "device": a.device,
                "samples_on_device": engine.runner.samples_on_device, "device_sampler": a.device_sampler,
                "sample_chunks": spec.kernels.sample.chunks,
                "float32_logits": spec.kernels.float32_logits,
                "dtype": str(spec.torch_dtype()).removeprefix("torch."), "backend": engine.backend_name,
                "maturity": engine.maturity, "batch_invariant": engine.batch_invariant, "ep_size": a.ep_size,
                "max_model_len": engine.max_model_len,
                "norm_topk_prob": bool(cfg.norm_topk_prob)}
        return info, cfg, rows
    finally:
        engine.close()


def run_hf_side(a: argparse.Namespace, spec: EngineSpec, cfg, rows: list[dict], norm_topk: bool) -> dict:
    dtype = spec.torch_dtype()
    model, how = hf_side.from_dir(a.model, dtype, a.device) if a.model else \
        hf_side.from_preset(a.preset, a.seed, dtype, a.device)
    sync = synchronizer(a.device)
    with hf_side.routing_patch(model, norm_topk) as patches:
        for row in rows:
            hf = measure(lambda n: hf_side.generate_timed(model, row_prompts(a, cfg, n), a.new_tokens, a.device, sync),
                         row["batch"], a.warmup, a.iters)
            hf["tokens_match"] = hf["token_hash"] == row["token_hash"]
            row["hf"] = hf
            row["hf_over_ours_tpot"] = hf["tpot_ms_p50"] / row["tpot_ms_p50"] if row["tpot_ms_p50"] else None
            print(f"batch {row['batch']:>4}: HF TPOT p50 {hf['tpot_ms_p50']:.2f} ms "
                  f"({row['hf_over_ours_tpot']:.2f}x ours), same tokens: {hf['tokens_match']}", file=sys.stderr)
    return {"how": how, "patches": patches, **hf_side.describe(model)}


def kernel_config(a: argparse.Namespace) -> KernelConfig:
    """The engine's KernelConfig from the flags: batch invariance, float32 logits, the device sampler's
    programs per row."""
    k = KernelConfig(batch_invariant=a.batch_invariant, float32_logits=a.float32_logits)
    if a.sample_chunks is None:
        return k
    return dataclasses.replace(k, sample=dataclasses.replace(k.sample, chunks=a.sample_chunks))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    try:
        preflight(a.backend, a.device, a.ep_size)  # before loading: one line on what to change
    except REFUSALS as e:
        print(f"bench_direct: error: {e}", file=sys.stderr)
        return 2
    spec = EngineSpec(model_dir=a.model, random_preset=a.preset, seed=a.seed, device=a.device, dtype=a.dtype,
                      backend=a.backend, ep_size=a.ep_size, max_model_len=a.prompt_len + a.new_tokens,
                      num_slots=max(a.batch_sizes), kernels=kernel_config(a), device_sampler=a.device_sampler)
    engine_info, cfg, rows = run_engine_side(a, spec)
    samples_on_device = engine_info["samples_on_device"]
    hf_setup = None
    if a.compare_hf:
        gc.collect()
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
        hf_setup = run_hf_side(a, spec, cfg, rows, engine_info["norm_topk_prob"])
    rep = {
        "report_intent": "direct_diagnostic",
        "tool": "tools/bench_direct.py",
        "command": hardware.command_line("tools/bench_direct.py", argv),
        "date": hardware.now_utc(),
        "git": hardware.git(),
        "host": hardware.host(),
        "stack": hardware.torch_stack(a.device),
        "engine": engine_info,
        "backend": engine_info["backend"],
        "maturity": engine_info["maturity"],
        "batch_invariant": engine_info["batch_invariant"],
        "workload": {"prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "warmup": a.warmup, "iters": a.iters,
                     "batches": a.batch_sizes, "prompt_seed": a.seed,
                     "prompts": "the same in every row" if a.same_prompt else "one per row", "greedy": a.samplings == ["greedy"], "sampling": [describe_sampling(x) for x in a.samplings],
                     "samples_on_device": samples_on_device, "ignore_eos": True,
                     "async_scheduling": a.async_scheduling},
        "hf_setup": hf_setup,
        "batches": rows,
    }
    out, md = report.write(rep, a.out, report.direct_markdown(rep))
    print(f"wrote {out} and {md}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
