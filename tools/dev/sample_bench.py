"""The token choice of a decode step on the GPU at lite's vocabulary (102,400): the Triton sampler
(engine/kernels/sample.py) with one program per row (--chunks 0) and with each row split over a
fixed number of programs (--chunks 64: sample_split.py), against engine.sampler.sample (batched
torch: penalties, softmax, sort, scan, draw), for batches of 1, 64 and 256 draws and a few request
mixes; for the greedy mix also the one-launch argmax (engine/kernels/argmax.py). The variants after
the first must give its tokens and log-probs bit for bit (bits_equal_c<N>).
Each timing is the device time of one call captured in a CUDA graph (tools/dev/kernel_bench.py
graph_time_us; the torch path is timed eagerly with CUDA events where it does not capture). Also
reports how often the kernel read each row (its sweeps) and whether both chose the same tokens.
Prints one JSON line per (mix, logits, batch) and writes them all with --out.

    python tools/dev/sample_bench.py --device cuda [--rows 1,64,256] [--mixes all] [--logits peaked,flat]
        [--chunks 0,64] [--block-v 2048] [--pivots 4] [--split-pivots 8] [--cap 512] [--warps 8] [--out report.json]
    python tools/dev/sample_bench.py --device cuda --sweep   # the kernel's knobs at each batch
    python tools/dev/sample_bench.py --device cpu --vocab 3000 --rows 2   # a smoke run (Triton's interpreter)
    python tools/dev/sample_bench.py --device cuda --launches --rows 256 --mixes top_p,mix --chunks 64
        # each launch's device time (torch.profiler), where a batch's sampler time goes
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cpu"]:  # before any kernel is defined
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from pegainfer.engine.contract import SamplingParams  # noqa: E402
from pegainfer.engine.kernels.sample import sample  # noqa: E402
from pegainfer.engine.kernels.sample_rows import HISTORY_SEEN, SampleRows  # noqa: E402
from pegainfer.engine.sampler import Draw, SamplingBatch, sample as torch_sample  # noqa: E402

GREEDY = SamplingParams()
TOP_P = SamplingParams(temperature=0.7, top_p=0.9)
PENALTIES = SamplingParams(temperature=0.7, top_k=50, presence_penalty=0.5, frequency_penalty=0.3,
                           repetition_penalty=1.1)
# (share, spec) of each mix: the profiles, and its 50/30/20 mix with log-probs on the third
MIXES = {
    "greedy": [(1.0, GREEDY)],
    "temperature": [(1.0, SamplingParams(temperature=0.8))],
    "top_p": [(1.0, TOP_P)],
    "top_k_penalties": [(1.0, PENALTIES)],
    "min_p": [(1.0, SamplingParams(temperature=1.0, min_p=0.05))],
    "greedy_logprobs5": [(1.0, SamplingParams(logprobs=5))],
    "mix": [(0.5, GREEDY), (0.3, TOP_P), (0.2, SamplingParams(temperature=0.7, top_k=50, presence_penalty=0.5,
                                                               logprobs=5))],
}


def logits_of(kind: str, rows: int, vocab: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """[rows, vocab] float32. peaked: a language model's shape (a bulk around 0, a few dozen
    tokens 6-14 above it, so top-p 0.9 keeps tens of tokens); flat: N(0, 9) logits (top-p 0.9 keeps
    thousands: the kernel's slow path)."""
    x = torch.randn(rows, vocab, generator=gen) * (3.0 if kind == "flat" else 2.0)
    if kind == "peaked":
        for r in range(rows):
            head = torch.randperm(vocab, generator=gen)[:40]
            x[r, head] += torch.linspace(14.0, 6.0, 40)
    return x.to(device)


def draws_of(mix: str, rows: int, vocab: int, rng: random.Random) -> list[Draw]:
    specs = [spec for share, spec in MIXES[mix] for _ in range(round(share * rows))]
    specs = (specs + [MIXES[mix][0][1]] * rows)[:rows]
    rng.shuffle(specs)
    return [Draw(r, spec, rng.randrange(-2**63, 2**63), 0, rng.randrange(200),
                 [rng.randrange(vocab) for _ in range(64)], [rng.randrange(vocab) for _ in range(100)])
            for r, spec in enumerate(specs)]


def kernel_inputs(draws: list[Draw], vocab: int, device: str) -> tuple[SampleRows, torch.Tensor | None, int | None]:
    """The kernel's rows and history slots for the draws (one slot per penalised draw)."""
    ps = [d.checked(vocab) for d in draws]
    pen = [s for s, p in enumerate(ps) if p.penalised]
    history = torch.zeros(max(len(pen), 1), vocab, dtype=torch.int32)
    for slot, s in enumerate(pen):
        history[slot, draws[s].prompt_ids] = HISTORY_SEEN
        history[slot].index_put_((torch.tensor(draws[s].output_ids),), torch.ones(len(draws[s].output_ids),
                                 dtype=torch.int32), accumulate=True)
    rows = SampleRows.build([p.temperature for p in ps], top_p=[p.top_p for p in ps], top_k=[p.top_k for p in ps],
                            min_p=[p.min_p for p in ps], presence=[p.presence for p in ps],
                            frequency=[p.frequency for p in ps], repetition=[p.repetition for p in ps],
                            seed=[p.seed for p in ps], step=[d.step for d in draws],
                            history_slot=[pen.index(s) if s in pen else -1 for s in range(len(ps))], device=device)
    wanted = [p.logprobs for p in ps if p.logprobs is not None]
    return rows, history.to(device) if pen else None, max(wanted) if wanted else None


def device_us(fn, reps: int = 20) -> tuple[float, str]:
    """µs per call of fn: in a CUDA graph where it captures, else eagerly between CUDA events; on the
    CPU (a smoke run) wall time."""
    if not torch.cuda.is_available():
        start = time.perf_counter()
        fn()
        return round((time.perf_counter() - start) * 1e6, 1), "cpu"
    from tools.dev.kernel_bench import graph_time_us
    try:
        return round(graph_time_us(fn, inner=10, reps=reps), 2), "graph"
    except Exception:  # noqa: BLE001 - a path that does not capture is timed eagerly
        torch.cuda.synchronize()
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) * 1e3 / reps, 2), "eager"


def row(mix: str, kind: str, rows: int, vocab: int, device: str, knobs: dict, chunks: list[int], seed: int = 0
        ) -> dict:
    """One (mix, logits, batch): the kernel at each `chunks` (0: one program per row; else the split
    launches), its tokens against torch's and, bit for bit, against the first variant's (tokens, log-probs,
    top-N); the sweeps of the first variant; torch's time; for the greedy mix the one-launch argmax's."""
    gen, rng = torch.Generator().manual_seed(seed), random.Random(seed)
    logits = logits_of(kind, rows, vocab, gen, device)
    draws = draws_of(mix, rows, vocab, rng)
    inputs, history, logprobs = kernel_inputs(draws, vocab, device)
    batch = SamplingBatch.build(draws, vocab, device)
    want = torch_sample(logits, batch)
    out = {"mix": mix, "logits": kind, "rows": rows, "vocab": vocab, **knobs}
    first = None
    tickets = torch.zeros(rows, dtype=torch.int32, device=device)  # the split's, left at zero (as DeviceSampler's)
    for c in chunks:
        sweeps = torch.zeros(rows, dtype=torch.int32, device=device)
        got = sample(logits, inputs, history=history, logprobs=logprobs, sweeps=sweeps, chunks=c, tickets=tickets,
                     **knobs)
        out[f"same_tokens_c{c}"] = int((got.tokens == want.tokens).sum())
        out[f"sweeps_mean_c{c}"] = round(float(sweeps.float().mean()), 2)
        if first is None:
            first = got
        else:
            out[f"bits_equal_c{c}"] = all(a is None and b is None or torch.equal(a, b) for a, b in zip(got, first))
        out[f"kernel_us_c{c}"], _ = device_us(lambda: sample(logits, inputs, history=history, logprobs=logprobs,
                                                             chunks=c, tickets=tickets, **knobs))
    out["torch_us"], out["torch_timing"] = device_us(lambda: torch_sample(logits, batch))
    if mix == "greedy" and device == "cuda":
        from pegainfer.engine.kernels.argmax import argmax
        from pegainfer.engine.kernels.ticket import tickets
        ticket = tickets(rows, device)
        out["argmax_us"], _ = device_us(lambda: argmax(logits, ticket))
    return out


def launches(mix: str, kind: str, rows: int, vocab: int, knobs: dict, chunks: int, reps: int = 10) -> dict:
    """Each kernel's device time in one call of the sampler (mean over `reps` eager calls, from
    torch.profiler's CUDA activity), and how many rows each sweep count had."""
    from torch.profiler import ProfilerActivity, profile
    gen, rng = torch.Generator().manual_seed(0), random.Random(0)
    logits = logits_of(kind, rows, vocab, gen, "cuda")
    inputs, history, logprobs = kernel_inputs(draws_of(mix, rows, vocab, rng), vocab, "cuda")
    tickets = torch.zeros(rows, dtype=torch.int32, device="cuda")
    sweeps = torch.zeros(rows, dtype=torch.int32, device="cuda")
    call = lambda sw=None: sample(logits, inputs, history=history, logprobs=logprobs, chunks=chunks,  # noqa: E731
                                  tickets=tickets, sweeps=sw, **knobs)
    call(sweeps)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    by: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0):
            by[e.key[:50]] = by.get(e.key[:50], 0.0) + getattr(e, "self_device_time_total", 0) / reps
    counts = torch.bincount(sweeps.cpu()).tolist()
    return {"mix": mix, "logits": kind, "rows": rows, "chunks": chunks, "sweeps_rows": counts,
            "launch_us": {k: round(v, 1) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v > 0}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--vocab", type=int, default=102_400)
    p.add_argument("--rows", default="1,64,256")
    p.add_argument("--mixes", default="all")
    p.add_argument("--logits", default="peaked,flat")
    p.add_argument("--block-v", type=int, default=2048)
    p.add_argument("--pivots", type=int, default=4)
    p.add_argument("--cap", type=int, default=512)
    p.add_argument("--warps", type=int, default=8)
    p.add_argument("--chunks", default="0,64", help="programs per row to time, comma-separated (0: one per row, "
                   "the kernel before the split; KernelConfig.sample.chunks)")
    p.add_argument("--split-pivots", type=int, default=8, help="the split launches' count thresholds")
    p.add_argument("--sweep", action="store_true", help="time the kernel's knobs (mix 'mix', peaked logits)")
    p.add_argument("--launches", action="store_true", help="each launch's device time (torch.profiler), at the "
                   "first of --chunks")
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "needs a CUDA GPU"}))
        return 1
    rows = [int(r) for r in a.rows.split(",")]
    chunks = [int(c) for c in a.chunks.split(",")]
    mixes = list(MIXES) if a.mixes == "all" else a.mixes.split(",")
    report = []
    if a.launches:
        knobs = {"block_v": a.block_v, "pivots": a.pivots, "cap": a.cap, "num_warps": a.warps,
                 "split_pivots": a.split_pivots}
        for mix, kind, n in itertools.product(mixes, a.logits.split(","), rows):
            report.append(launches(mix, kind, n, a.vocab, knobs, chunks[0]))
            print(json.dumps(report[-1]), flush=True)
    elif a.sweep:
        for n, block_v, pivots, cap, warps in itertools.product(rows, (1024, 2048, 4096), (4, 8), (256, 512, 1024),
                                                                (4, 8, 16)):
            knobs = {"block_v": block_v, "pivots": pivots, "cap": cap, "num_warps": warps,
                     "split_pivots": a.split_pivots}
            report.append(row("mix", "peaked", n, a.vocab, a.device, knobs, chunks))
            print(json.dumps(report[-1]), flush=True)
    else:
        knobs = {"block_v": a.block_v, "pivots": a.pivots, "cap": a.cap, "num_warps": a.warps,
                 "split_pivots": a.split_pivots}
        for mix, kind, n in itertools.product(mixes, a.logits.split(","), rows):
            report.append(row(mix, kind, n, a.vocab, a.device, knobs, chunks))
            print(json.dumps(report[-1]), flush=True)
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
