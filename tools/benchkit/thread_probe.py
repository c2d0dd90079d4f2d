"""The GPU thread timed as the daemon runs it, without HTTP (`tools/dev/gpu_probe.py --thread`)."""
from __future__ import annotations

import json
import queue
import statistics
import time

import torch

from pegainfer.engine.loop import GpuThread
from pegainfer.engine.contract import Admit, Shutdown, StepEvents


def thread_decode(engine, batches: list[int], prompt_len: int, new_tokens: int, overlap: bool) -> list[dict]:
    """The GPU thread itself (what the daemon runs, without HTTP): b greedy requests admitted at once,
    each token's arrival timed on the consuming side. Per batch: the median per-request TPOT (first
    token to last) and the decode tokens per second over the span from the first request's first
    token to the last token. A first pass captures the graphs; the second is reported."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    gpu = GpuThread(engine, events.put, overlap=overlap)
    gpu.start()
    rows = []
    try:
        for b in batches:
            g = torch.Generator().manual_seed(b)
            prompts = torch.randint(0, engine.cfg.vocab_size - 2, (b, prompt_len), generator=g).tolist()
            for rep in range(2):
                first, last, done = {}, {}, 0
                steps0, overlapped0 = gpu.steps, gpu.overlapped_steps
                for i, p in enumerate(prompts):
                    gpu.submit(Admit(f"b{b}-{rep}-{i}", p, new_tokens, ignore_eos=True))
                while done < b:
                    ev = events.get(timeout=600)
                    now = time.perf_counter()
                    if isinstance(ev, StepEvents):
                        for t in ev.tokens:
                            first.setdefault(t.request_id, now)
                            last[t.request_id] = now
                        done += len(ev.finished)
            tpots = [(last[r] - first[r]) / (new_tokens - 1) * 1e3 for r in first]
            span = max(last.values()) - min(first.values())
            rows.append({"batch": b, "overlap": overlap, "tpot_ms_median": round(statistics.median(tpots), 3),
                         "decode_tok_s": round(b * (new_tokens - 1) / span, 1), "steps": gpu.steps - steps0,
                         "overlapped_steps": gpu.overlapped_steps - overlapped0})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        gpu.submit(Shutdown())
        gpu.join(30)
    return rows
