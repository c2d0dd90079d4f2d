"""The direct (in-process) measurement: one generation over the engine (greedy, or each row with its
sampling profile's parameters: tools/benchkit/sampling.py), the prefill step and every decode step
timed wall-clock, and the summary of several such runs at one batch size. Decode
runs step by step (each step between device synchronizes) or overlapped as the daemon's
--async-scheduling runs it (step N+1 launched before step N's tokens are read, its ids taken on the
device; each step timed from one step's tokens in host memory to the next's). The HF side produces
the same Timing, so both are summarised alike."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import statistics
import time
from collections.abc import Callable

import torch

from pegainfer.engine.batch import RowInput
from pegainfer.engine.draw_params import DrawParams
from pegainfer.engine.engine import Engine
from pegainfer.engine.sampler import Draw
from pegainfer.engine.step_plan import StepPlan
from tools.benchkit.metrics import percentile
from tools.benchkit.sampling import sampling_params


@dataclasses.dataclass(slots=True)
class Timing:
    prefill_s: float  # the step that takes every row's prompt (HF: generate's first forward)
    step_s: list[float]  # one per decode step
    tokens: list[list[int]]  # [B][new_tokens] generated ids


def synchronizer(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        index = torch.device(device).index
        return lambda: torch.cuda.synchronize(index)
    return lambda: None


def prompt_ids(vocab_size: int, special_ids: list[int | None], length: int, seed: int) -> list[int]:
    """`length` ids below every special id (BOS/EOS) and the vocabulary size, from a fixed seed."""
    upper = min([vocab_size, *(i for i in special_ids if i is not None)])
    rng = random.Random(f"pegainfer-bench-direct:{seed}")
    return [rng.randrange(upper) for _ in range(length)]


def batch_prompts(vocab_size: int, special_ids: list[int | None], length: int, seed: int, batch: int,
                  distinct: bool) -> list[list[int]]:
    """One prompt per row: each row its own ids (seed, row) when distinct, so the rows route to
    different experts as real traffic does; otherwise the seed's prompt in every row."""
    if not distinct:
        return [prompt_ids(vocab_size, special_ids, length, seed)] * batch
    return [prompt_ids(vocab_size, special_ids, length, seed if r == 0 else seed * 100003 + r) for r in range(batch)]


class DecodeRun:
    """One generation at one batch size: prefill() once, then decode() for each further token. With a
    sampling profile row r draws with the profile's parameters for index r (its choices as the
    served path makes them: the device sampler inside the decode graph where there is one)."""

    def __init__(self, engine: Engine, prompts: list[list[int]], sync: Callable[[], None], sampling: str = "greedy"):
        self.engine, self.prompts, self.batch, self.sync = engine, prompts, len(prompts), sync
        self.slots: list[int] = []
        self.tokens: list[list[int]] = [[] for _ in prompts]  # each row's output, appended in place
        self.pos = 0
        vocab = engine.cfg.vocab_size
        specs = [sampling_params(sampling, r) for r in range(self.batch)]
        self.specs = None if all(s.plain_greedy for s in specs) else [
            (s, DrawParams.of(s, s.seed or 0, vocab)) for s in specs]

    def draws(self, ahead: int = 0) -> list[Draw] | None:
        """Each row's draw this step (ahead: tokens still in flight before it); None when greedy."""
        if self.specs is None:
            return None
        return [Draw(r, s, p.seed, 0, len(out) + ahead, prompt, out, p)
                for r, ((s, p), prompt, out) in enumerate(zip(self.specs, self.prompts, self.tokens))]

    def __enter__(self) -> DecodeRun:
        self.slots = [self.engine.cache.allocate() for _ in range(self.batch)]
        return self

    def __exit__(self, *exc) -> None:
        for s in self.slots:
            self.engine.cache.release(s)

    def prefill(self) -> float:
        rows = [RowInput(s, p, 0) for s, p in zip(self.slots, self.prompts)]
        self.sync()
        t0 = time.perf_counter()
        first = self.engine.runner.run(StepPlan(rows, draws=self.draws())).tokens  # [B]
        self.sync()
        dt = time.perf_counter() - t0
        for out, t in zip(self.tokens, first):
            out.append(t)
        self.pos = len(self.prompts[0])  # every prompt has the same length
        return dt

    def decode_overlapped(self, steps: int) -> list[float]:
        """`steps` decode steps, each launched before the one before it is read (ModelRunner.launch
        with a feed from that step's tokens); each timed from the previous tokens' arrival."""
        runner = self.engine.runner
        self.sync()
        t = time.perf_counter()
        launched = runner.launch(StepPlan([RowInput(s, [out[-1]], self.pos)
                                           for s, out in zip(self.slots, self.tokens)], draws=self.draws()))
        times = []
        for i in range(steps):
            nxt = None
            if i + 1 < steps:  # the next step's ids are this step's tokens, still on the device
                nxt = runner.launch(StepPlan([RowInput(s, [0], self.pos + 1) for s in self.slots],
                                             draws=self.draws(ahead=1), feed=list(range(self.batch))))
            for out, tok in zip(self.tokens, runner.collect(launched).tokens):
                out.append(tok)
            now = time.perf_counter()
            times.append(now - t)
            t = now
            self.pos += 1
            launched = nxt
        return times

    def decode(self) -> float:
        rows = [RowInput(s, [out[-1]], self.pos) for s, out in zip(self.slots, self.tokens)]
        self.sync()
        t0 = time.perf_counter()
        nxt = self.engine.runner.run(StepPlan(rows, draws=self.draws())).tokens  # [B]
        self.sync()
        dt = time.perf_counter() - t0
        for out, t in zip(self.tokens, nxt):
            out.append(t)
        self.pos += 1
        return dt


def run_ours(engine: Engine, prompts: list[list[int]], new_tokens: int, sync: Callable[[], None],
             overlap: bool = False, sampling: str = "greedy") -> Timing:
    """overlap: launched steps; a sampled run has them only where the decode graph samples on the
    device (ModelRunner.samples_on_device), as the daemon's batcher does."""
    with DecodeRun(engine, prompts, sync, sampling) as run:
        overlap = overlap and (run.specs is None or engine.runner.samples_on_device)
        prefill = run.prefill()
        steps = run.decode_overlapped(new_tokens - 1) if overlap else [run.decode() for _ in range(new_tokens - 1)]
        return Timing(prefill, steps, run.tokens)


def token_hash(tokens: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(tokens, separators=(",", ":")).encode()).hexdigest()


def summarise(runs: list[Timing], batch: int) -> dict:
    """Prefill median/min over the runs; decode TPOT p50/mean/p90 over every decode step of every
    run; decode tok/s = batch / mean TPOT; the token trace hash of the first run."""
    steps = [s for r in runs for s in r.step_s]
    prefill = [r.prefill_s for r in runs]
    tpot_mean = statistics.fmean(steps) if steps else None
    return {
        "batch": batch,
        "iters": len(runs),
        "decode_steps": len(steps),
        "prefill_ms_median": statistics.median(prefill) * 1e3,
        "prefill_ms_min": min(prefill) * 1e3,
        "tpot_ms_p50": statistics.median(steps) * 1e3 if steps else None,
        "tpot_ms_mean": tpot_mean * 1e3 if steps else None,
        "tpot_ms_p90": percentile(steps, 90) * 1e3 if steps else None,
        "decode_tok_s": batch / tpot_mean if tpot_mean else None,
        "token_hash": token_hash(runs[0].tokens),
        "deterministic": all(r.tokens == runs[0].tokens for r in runs),
    }
