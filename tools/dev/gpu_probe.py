"""One GPU call's worth of checks and timings for the fast path (docs/perf-notes.md records each run):
the device's copy and matmul ceilings, grouped-GEMM availability, decode TPOT of the lite preset at
several batch sizes with and without CUDA graphs, and greedy agreement of the graph path with the
eager expand path.

    python tools/dev/gpu_probe.py [--batches 1,8,32] [--prompt-len 86] [--new-tokens 64] [--variants triton,plain]
    python tools/dev/gpu_probe.py --diag tiny,lite
    python tools/dev/gpu_probe.py --thread --batches 1,64,256 --out FILE.json  (the GPU thread, overlap off/on)
    python tools/dev/gpu_probe.py --variants triton --batches 1 --contexts 1024,16384 [--decode-long-split 0]
        (decode TPOT by context length; the knob: the split attention's rule, for an A/B)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from pegainfer.engine.batch import RowInput  # noqa: E402
from pegainfer.engine.engine import EngineSpec, build_engine  # noqa: E402
from pegainfer.engine.kernels.config import KernelConfig  # noqa: E402
from pegainfer.engine.step_plan import StepPlan  # noqa: E402
from tools.benchkit import knobs  # noqa: E402


def _git_sha() -> str:
    import os
    return os.environ.get("PEGAINFER_GIT_SHA", "unknown")


def ceilings() -> dict:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    copy_tbs = 2 * x.numel() * 10 / (time.perf_counter() - t) / 1e12
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    tflops = 2 * 8192 ** 3 * 10 / (time.perf_counter() - t) / 1e12
    del x, y, a
    return {"copy_TBps": round(copy_tbs, 3), "bf16_matmul_TFLOPs": round(tflops, 1)}


def run_batch(engine, batch: int, prompt_len: int, new_tokens: int) -> dict:
    g = torch.Generator().manual_seed(batch)
    # a prompt per row: identical rows would route alike and touch only a batch-1 step's experts
    prompts = torch.randint(0, engine.cfg.vocab_size - 2, (batch, prompt_len), generator=g).tolist()
    # pages for this run's positions only: a whole max_len per row would not fit 1,024 rows
    slots = [engine.cache.allocate(prompt_len + new_tokens) for _ in range(batch)]
    try:
        torch.cuda.synchronize()
        t = time.perf_counter()
        toks = engine.runner.run(StepPlan.greedy([RowInput(s, p, 0) for s, p in zip(slots, prompts)])).tokens
        torch.cuda.synchronize()
        prefill_s = time.perf_counter() - t
        pos, steps, trace = prompt_len, [], [toks]
        for _ in range(new_tokens - 1):
            rows = [RowInput(s, [tk], pos) for s, tk in zip(slots, toks)]
            t = time.perf_counter()
            toks = engine.runner.run(StepPlan.greedy(rows)).tokens  # .tolist() inside synchronises
            steps.append(time.perf_counter() - t)
            trace.append(toks)
            pos += 1
        steady = steps[len(steps) // 4:]
        return {"batch": batch, "prefill_ms": round(prefill_s * 1e3, 2),
                "tpot_p50_ms": round(statistics.median(steady) * 1e3, 3),
                "tpot_mean_ms": round(statistics.mean(steady) * 1e3, 3),
                "decode_tok_s": round(batch / statistics.median(steady), 1),
                "first_step_ms": round(steps[0] * 1e3, 2), "tokens": trace}
    finally:
        for s in slots:
            engine.cache.release(s)


def replay_times(graphs, reps: int = 20) -> dict:
    """Host time to launch the batch-1 decode graph against the device time it runs: when the two
    are close, the step is bound by the host's graph launch, not by the kernels."""
    graph, _ = next(v for k, v in graphs.graphs.items() if k[0] == 1 and not k[2])
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    start.record()
    for _ in range(reps):
        graph.replay()
    host_ms = (time.perf_counter() - t) * 1e3 / reps
    end.record()
    end.synchronize()
    wall_ms = (time.perf_counter() - t) * 1e3 / reps
    gap = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    gap[0].record()
    graph.replay()
    gap[1].record()
    gap[1].synchronize()
    return {"host_launch_ms": round(host_ms, 3), "wall_ms": round(wall_ms, 3),
            "device_ms": round(start.elapsed_time(end) / reps, 3), "single_ms": round(gap[0].elapsed_time(gap[1]), 3)}


def graph_timeline(engine, batch: int, reps: int = 3) -> dict:
    """Kernel-level timeline of the captured decode graph at `batch` rows (CUPTI records each kernel
    of a graph replay): the replay's span, the time some kernel runs (the union of their intervals:
    the shared experts' stream overlaps the main one), the idle remainder between kernels, and the
    kernels by name with their total time and the idle gap before each. Tells launch gaps from slow
    kernels."""
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile
    from pegainfer.engine.cuda_graphs import bucket
    graphs = engine.runner.graphs
    if graphs is None:
        return {"timeline_batch": batch, "skipped": "no CUDA graphs in this variant"}
    b = bucket(batch, graphs.batch_buckets)
    graph, _ = next(v for k, v in graphs.graphs.items() if k[0] == b and k[2] == "tokens")  # (batch, length, kind)
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
            torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    prof.export_chrome_trace(path)
    events = json.loads(Path(path).read_text())["traceEvents"]
    os.unlink(path)
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    # split into replays: a replay starts where the previous kernel ended more than 50 µs earlier
    runs, cur, end = [], [], None
    for k in kernels:
        if end is not None and k["ts"] - end > 50:
            runs.append(cur)
            cur = []
        cur.append(k)
        end = max(end or 0, k["ts"] + k["dur"])
    runs.append(cur)
    run = runs[-1]
    span = max(k["ts"] + k["dur"] for k in run) - run[0]["ts"]
    busy, last = 0.0, run[0]["ts"]
    by_name: dict[str, dict] = {}
    for k in run:
        start, stop = k["ts"], k["ts"] + k["dur"]
        gap = max(0.0, start - last)
        busy += max(0.0, stop - max(start, last))
        last = max(last, stop)
        name = k["name"][:60]
        d = by_name.setdefault(name, {"n": 0, "us": 0.0, "gap_before_us": 0.0})
        d["n"] += 1
        d["us"] += k["dur"]
        d["gap_before_us"] += gap
    top = sorted(by_name.items(), key=lambda kv: -kv[1]["us"])[:24]
    t0 = run[0]["ts"]
    return {"timeline_batch": batch, "replays_seen": len(runs), "kernels": len(run), "span_us": round(span, 1),
            "busy_us": round(busy, 1), "idle_us": round(span - busy, 1),
            "top": [{"name": n, "n": d["n"], "us": round(d["us"], 1), "gap_before_us": round(d["gap_before_us"], 1)}
                    for n, d in top],
            # the replay kernel by kernel: [name, start µs from the first, duration µs, stream]
            "sequence": [[k["name"][:40], round(k["ts"] - t0, 1), round(k["dur"], 1), k.get("args", {}).get("stream")]
                         for k in run]}


def diagnose(preset: str, prompt_len: int, kernels: KernelConfig, profile_batch: int = 1) -> None:
    """First decode step of one row, three ways: expand path (eager), absorbed path (eager call, an
    engine of the same weights without the Triton kernels), captured graph; then a profile of the
    absorbed decode step by kernel."""
    from pegainfer.engine.batch import Batch
    from pegainfer.engine.model.decode import decode_logits
    from pegainfer.engine.model.inputs import DecodeInputs

    def build(k: KernelConfig):
        return build_engine(EngineSpec(random_preset=preset, device="cuda", dtype="bfloat16",
                                       num_slots=max(4, profile_batch), max_model_len=1024, kernels=k))

    engine = build(dataclasses.replace(kernels, triton=False))
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, engine.cfg.vocab_size - 2, (prompt_len,), generator=g).tolist()
    s = engine.cache.allocate()
    tok = engine.runner._eager([RowInput(s, prompt, 0)])[0]
    saved = engine.cache.data.clone()
    row = RowInput(s, [tok], prompt_len)
    ref = engine.model.forward(Batch.build([row], "cuda"), engine.cache).float()
    engine.cache.data.copy_(saved)
    t = lambda x: torch.tensor(x, device="cuda")  # noqa: E731
    inp = DecodeInputs(t([tok]), t([prompt_len]), t([s]), t([prompt_len + 1]), 256)
    absorbed = decode_logits(engine.model, inp, engine.cache).float()
    engine.close()
    del engine
    torch.cuda.empty_cache()
    engine = build(kernels)  # the same weights (the preset's seed)
    s = engine.cache.allocate()
    engine.runner._eager([RowInput(s, prompt, 0)])  # the prompt's cache, as in the first engine
    saved = engine.cache.data.clone()
    fused = decode_logits(engine.model, inp, engine.cache).float()
    engine.cache.data.copy_(saved)
    graph_tok = engine.runner.graphs.run([row])[0]
    rel = float((absorbed - ref).norm() / ref.norm())
    top = ref[0].topk(3)
    print(json.dumps({"diag": preset, "expand_argmax": int(ref.argmax()), "absorbed_argmax": int(absorbed.argmax()),
                      "graph_token": graph_tok, "rel_err": round(rel, 5), "triton_argmax": int(fused.argmax()),
                      "triton_rel_err": round(float((fused - ref).norm() / ref.norm()), 5), "top3": top.values.tolist(),
                      "absorbed_top3": absorbed[0].topk(3).values.tolist()}), flush=True)
    engine.cache.data.copy_(saved)
    print(json.dumps({"diag": preset, "graph_replay": replay_times(engine.runner.graphs)}), flush=True)
    engine.cache.data.copy_(saved)
    from torch.profiler import ProfilerActivity, profile
    if profile_batch > 1:  # the prompt's cache copied to more slots, a different token per row
        more = [engine.cache.allocate() for _ in range(profile_batch - 1)]
        engine.cache.copy_prefix(s, tuple(more), prompt_len)
        toks = torch.randint(0, engine.cfg.vocab_size - 2, (profile_batch,), generator=g).tolist()
        n = profile_batch
        inp = DecodeInputs(t(toks), t([prompt_len] * n), t([s] + more), t([prompt_len + 1] * n), 256)
    for _ in range(3):
        decode_logits(engine.model, inp, engine.cache)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            decode_logits(engine.model, inp, engine.cache)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=60), flush=True)
    del engine
    torch.cuda.empty_cache()


def host_profile(batches: list[int], prompt_len: int, kernels: KernelConfig, steps: int = 30) -> None:
    """Where the host spends a decode step outside the graph: cProfile of runner.run, by own time."""
    import cProfile
    import io
    import pstats
    engine = build_engine(EngineSpec(random_preset="lite", device="cuda", dtype="bfloat16",
                                     num_slots=max(batches), max_model_len=1024, kernels=kernels))
    for b in batches:
        run_batch(engine, b, prompt_len, 4)  # captures the graphs
        slots = [engine.cache.allocate() for _ in range(b)]
        prompts = [RowInput(s, [5 + i] * prompt_len, 0) for i, s in enumerate(slots)]
        toks = engine.runner.run(StepPlan.greedy(prompts)).tokens
        pos = prompt_len
        prof = cProfile.Profile()
        times = []
        for _ in range(steps):
            rows = [RowInput(s, [tk], pos) for s, tk in zip(slots, toks)]
            t = time.perf_counter()
            prof.enable()
            toks = engine.runner.run(StepPlan.greedy(rows)).tokens
            prof.disable()
            times.append(time.perf_counter() - t)
            pos += 1
        for s in slots:
            engine.cache.release(s)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
        print(json.dumps({"host_profile_batch": b, "step_ms_p50": round(statistics.median(times) * 1e3, 3)}))
        print(out.getvalue()[-4000:], flush=True)


def prefill_profile(cases: list[tuple[int, int]], kernels: KernelConfig) -> None:
    """Device time of the packed prefill step (eager, so the profiler sees each kernel) for
    (prompts, tokens per prompt) cases, with the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    from pegainfer.engine.model.inputs import PrefillInputs
    from pegainfer.engine.model.prefill import prefill_step
    longest = max(n for _, n in cases)
    engine = build_engine(EngineSpec(random_preset="lite", device="cuda", dtype="bfloat16",
                                     num_slots=max(r for r, _ in cases), max_model_len=longest + 64, kernels=kernels))
    g = torch.Generator().manual_seed(0)
    for rows, n in cases:
        slots = [engine.cache.allocate() for _ in range(rows)]
        ids = torch.randint(0, engine.cfg.vocab_size - 2, (rows * n,), generator=g)
        t = lambda x: torch.as_tensor(x, device="cuda")  # noqa: E731
        inp = PrefillInputs(t(ids), t(list(range(n)) * rows), t([s for s in slots for _ in range(n)]),
                            t([r for r in range(rows) for _ in range(n)]), t([(r + 1) * n - 1 for r in range(rows)]))
        one = rows == 1  # one prompt runs plain causal attention, as the runner does (no mask)
        prefill_step(engine.model, inp, engine.cache, one)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        prefill_step(engine.model, inp, engine.cache, one)
        end.record()
        end.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            prefill_step(engine.model, inp, engine.cache, one)
            torch.cuda.synchronize()
        # the serving path: the runner's step, a captured graph at the prompt's token bucket
        prompts = ids.view(rows, n).tolist()
        graphed = []
        for _ in range(3):  # the first call captures
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            engine.runner.run(StepPlan.greedy([RowInput(s, p, 0) for s, p in zip(slots, prompts)]))
            graphed.append(round((time.perf_counter() - t0) * 1e3, 2))
        print(json.dumps({"prefill_rows": rows, "tokens_per_row": n, "eager_wall_ms": round(start.elapsed_time(end), 2),
                          "runner_step_ms": graphed}))
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=24, max_name_column_width=70), flush=True)
        for s in slots:
            engine.cache.release(s)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--prompt-len", type=int, default=86)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--contexts", help="comma-separated prompt lengths to time each batch at (instead of --prompt-len)")
    p.add_argument("--variants", default="triton,plain", help="triton, plain (graphs, torch ops), eager")
    p.add_argument("--out", type=Path)
    p.add_argument("--diag", help="preset to diagnose instead of timing (tiny|lite)")
    p.add_argument("--profile-batch", type=int, default=1, help="rows of the profiled decode step (--diag)")
    p.add_argument("--prefill-profile", help="rows x tokens cases of the packed prefill, e.g. 32x86,1x4620")
    p.add_argument("--host-profile", action="store_true", help="cProfile of the host side of decode steps")
    p.add_argument("--timeline", action="store_true", help="kernel timeline of the decode graph at each batch")
    knobs.add_arguments(p)  # the A/B switches (tools/benchkit/knobs.py)
    p.add_argument("--thread", action="store_true",
                   help="decode through the GPU thread (as the daemon), overlapped scheduling on and off")
    a = p.parse_args()
    kernels, _ = knobs.apply(a)
    if a.diag:
        for preset in a.diag.split(","):
            diagnose(preset, a.prompt_len, kernels, a.profile_batch)
        return 0
    if a.prefill_profile:
        prefill_profile([tuple(int(v) for v in c.split("x")) for c in a.prefill_profile.split(",")], kernels)
        return 0
    batches = [int(b) for b in a.batches.split(",")]
    if a.host_profile:
        host_profile(batches, a.prompt_len, kernels)
        return 0
    if a.thread:
        from tools.benchkit.thread_probe import thread_decode
        engine = build_engine(EngineSpec(random_preset="lite", device="cuda", dtype="bfloat16",
                                         num_slots=max(batches), max_model_len=1024, kernels=kernels))
        report = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "git": _git_sha(),
                  "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
                  "thread": [r for overlap in (False, True, False, True)
                             for r in thread_decode(engine, batches, a.prompt_len, a.new_tokens, overlap)]}
        if a.out:
            a.out.write_text(json.dumps(report))
        return 0
    report = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "ceilings": ceilings()}
    print(json.dumps(report), flush=True)
    plain = dataclasses.replace(kernels, triton=False)
    variants = {"triton": dict(cuda_graphs=True, kernels=kernels),
                "plain": dict(cuda_graphs=True, kernels=plain),
                "eager": dict(cuda_graphs=False, kernels=plain)}
    contexts = [int(x) for x in a.contexts.split(",")] if a.contexts else [a.prompt_len]
    max_len = max(1024, max(contexts) + a.new_tokens + 16)  # pages for the longest run's rows
    for name in a.variants.split(","):
        t = time.perf_counter()
        engine = build_engine(EngineSpec(random_preset="lite", device="cuda", dtype="bfloat16",
                                         num_slots=max(batches), max_model_len=max_len,
                                         kv_cache_tokens=max(batches) * max_len, **variants[name]))
        report[f"build_s_{name}"] = round(time.perf_counter() - t, 1)
        rows, timelines = [], []
        for ctx in contexts:
            for b in batches:  # a first pass captures the graphs; the second is the one reported
                run_batch(engine, b, ctx, 4)
            for b in batches:
                rows.append(run_batch(engine, b, ctx, a.new_tokens) | {"prompt_len": ctx})
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "tokens"} | {"variant": name}), flush=True)
                if a.timeline:  # right after its own run: the graphs' input region holds this bucket's last step
                    timelines.append(graph_timeline(engine, b))
                    print(json.dumps(timelines[-1]), flush=True)
        if a.timeline:
            report[f"timeline_{name}"] = timelines
        report[name] = rows
        del engine
        torch.cuda.empty_cache()
    names = a.variants.split(",")
    for other in names[1:]:
        for r0, r1 in zip(report[names[0]], report[other]):
            first = next((i for i, (x, y) in enumerate(zip(r0["tokens"], r1["tokens"])) if x != y), None)
            print(json.dumps({"batch": r0["batch"], "compare": f"{names[0]} vs {other}",
                              "first_differing_step": first}))
    if a.out:
        a.out.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
