"""The GPU thread: owns the engine, drains its command inbox, forms each step's batch (new prompts
prefill while every running request decodes, all in one forward), and sends one StepEvents per
step back to the asyncio loop. It blocks when idle and never awaits.

A request of n choices is n sequences sharing one prefill: the first sequence prefills, all n draw
their first token from its logits (each with its own seed stream), then the n-1 siblings take a copy
of its KV cache rows and decode on their own slots. The request's Finished event comes once its
last sequence has ended."""
from __future__ import annotations

import collections
import queue
import random
import threading
import time
from collections.abc import Callable

import torch

from engine.batch import RowInput
from engine.engine import Engine, RequestError
from engine.messages import (
    Admit,
    Cancel,
    Command,
    EngineDied,
    Event,
    Failed,
    Finished,
    InjectFailure,
    PrefillStarted,
    PromptLogprobs,
    Released,
    Shutdown,
    Stall,
    StepEvents,
    StepRecord,
    StopChoice,
    Token,
)
from engine.runner import StepOutput
from engine.sampler import Draw
from engine.sequence import Group, Sequence

_SEEDS = random.SystemRandom()  # seeds for requests that bring none

IDLE_WAKE_S = 0.5  # an idle thread still refreshes its heartbeat this often


class GpuThread:
    def __init__(self, engine: Engine, emit: Callable[[Event], None], *, max_prefill_tokens: int = 4096):
        self.engine = engine
        self._emit = emit
        self.max_prefill_tokens = max_prefill_tokens
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: dict[tuple[str, int], Sequence] = {}  # (request id, choice index) -> sequence
        self.heartbeat = time.monotonic()
        self.error: str | None = None
        self.steps = 0
        self.decode_batch_max = 0
        self.prefill_tokens = 0  # prompt tokens run through the model, all steps together
        self._thread = threading.Thread(target=self._run, name="pegainfer-gpu", daemon=True)

    # ---- loop side --------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, cmd: Command) -> None:
        self._inbox.put(cmd)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # ---- GPU thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._apply(self._drain(block=not (self.waiting or self.running))):
                self.heartbeat = time.monotonic()
                if self.waiting or self.running:
                    self._step()
        except Exception as e:  # noqa: BLE001 - any error ends the thread; every request hears of it
            self.error = f"{type(e).__name__}: {e}"
            held = self._held_ids()
            self.running.clear()
            self.waiting.clear()
            self._emit(EngineDied(self.error, [Failed(rid, self.error) for rid in held]))

    def _drain(self, block: bool) -> list[Command]:
        cmds = []
        if block:
            try:
                cmds.append(self._inbox.get(timeout=IDLE_WAKE_S))
            except queue.Empty:
                self.heartbeat = time.monotonic()
                return cmds
        while True:
            try:
                cmds.append(self._inbox.get_nowait())
            except queue.Empty:
                return cmds

    def _apply(self, cmds: list[Command]) -> bool:
        """Apply commands in arrival order; False on Shutdown."""
        failed, released, finished = [], [], []
        for cmd in cmds:
            match cmd:
                case Admit():
                    try:
                        self.engine.check_request(cmd.prompt_ids, cmd.max_tokens)
                        if not 1 <= cmd.n <= self.engine.cache.num_slots:
                            raise RequestError(f"{cmd.n} choices need {cmd.n} KV slots; the engine has "
                                               f"{self.engine.cache.num_slots}")
                    except RequestError as e:
                        failed.append(Failed(cmd.request_id, str(e)))
                        continue
                    self.waiting.append(_sequences(cmd))
                case StopChoice():
                    seq = self.running.get((cmd.request_id, cmd.index))
                    if seq is not None:
                        end = self._end(seq, "stop")
                        if end is not None:
                            finished.append(Finished(cmd.request_id, end))
                case Cancel():
                    if self._drop(cmd.request_id):
                        released.append(Released(cmd.request_id))
                case Stall():
                    time.sleep(cmd.seconds)
                case InjectFailure():
                    if self._drop(cmd.request_id):
                        failed.append(Failed(cmd.request_id, cmd.message))
                case Shutdown():
                    released += [Released(rid) for rid in self._held_ids()]
                    for rid in self._held_ids():
                        self._drop(rid)
                    if finished or released:
                        self._emit(StepEvents([], finished, [], released, None))
                    return False
        if failed or released or finished:
            self._emit(StepEvents([], finished, failed, released, None))
        return True

    def _held_ids(self) -> list[str]:
        return list(dict.fromkeys([*(k[0] for k in self.running), *(s.request_id for s in self.waiting)]))

    def _drop(self, request_id: str) -> bool:
        """Forget every sequence of a request and free their KV slots."""
        found = False
        for key in [k for k in self.running if k[0] == request_id]:
            seq = self.running.pop(key)
            for s in (seq, *seq.forks):
                self.engine.cache.release(s.slot)
            found = True
        for s in self.waiting:
            if s.request_id == request_id:
                self.waiting.remove(s)
                return True
        return found

    def _end(self, seq: Sequence, reason: str) -> str | None:
        """One sequence ended: free its slot; the request's reason if it was the last one."""
        del self.running[seq.key]
        self.engine.cache.release(seq.slot)
        return seq.group.end_one(reason)

    def _admit_waiting(self) -> list[str]:
        """FCFS: take waiting requests while KV slots are free for all of their choices. Long prompts
        are not held back here: the step's prefill budget splits them into chunks."""
        cache = self.engine.cache
        admitted = []
        while self.waiting and cache.free_slots > len(self.waiting[0].forks):
            seq = self.waiting.popleft()
            for s in (seq, *seq.forks):
                s.slot = cache.allocate()
            self.running[seq.key] = seq
            admitted.append(seq.request_id)
        return admitted

    def _rows(self) -> tuple[list[Sequence], list[RowInput]]:
        """Every decoding sequence gets its token; prompts share the step's prefill budget in
        arrival order, so a long prompt is fed in chunks while the others keep decoding."""
        budget = self.max_prefill_tokens
        seqs, rows = [], []
        for s in self.running.values():
            if s.prefilling and budget <= 0:
                continue  # its next chunk waits for a later step
            ids = s.next_row(budget)
            if s.prefilling:
                budget -= len(ids)
            seqs.append(s)
            rows.append(RowInput(s.slot, ids, s.cached))
        return seqs, rows

    def _step(self) -> None:
        admitted = self._admit_waiting()
        if not self.running:
            return
        t0, started_ns = time.perf_counter(), time.time_ns()
        if admitted:
            self._emit(PrefillStarted(admitted, started_ns))
        seqs, rows = self._rows()
        on_gpu = self.engine.spec.device.startswith("cuda")
        if on_gpu:
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
        owners, out = self._choose(seqs, rows)
        gpu_s = None
        if on_gpu:
            ev1.record()
            ev1.synchronize()
            gpu_s = ev0.elapsed_time(ev1) / 1e3
        n_decode = sum(1 for r in rows if len(r.token_ids) == 1 and r.start_pos > 0)
        self.decode_batch_max = max(self.decode_batch_max, n_decode)
        for seq, row in zip(seqs, rows):
            seq.cached += len(row.token_ids)
            if seq.forks and not seq.prefilling:  # siblings copy the prefill, before any slot is released
                self.engine.runner.fork(seq.slot, [f.slot for f in seq.forks], seq.cached)
                for f in seq.forks:
                    f.cached = seq.cached
                    self.running[f.key] = f
                seq.forks = []
        tokens, finished = [], []
        for seq, tok, lp, top in zip(owners, out.tokens, out.logprobs, out.top_logprobs):
            seq.output_ids.append(tok)
            reason = seq.finish_reason(self.engine.eos_id)
            tokens.append(Token(seq.request_id, tok, first=len(seq.output_ids) == 1, index=seq.index, logprob=lp,
                                top_logprobs=top, finish_reason=reason))
            if reason is not None:
                end = self._end(seq, reason)
                if end is not None:
                    finished.append(Finished(seq.request_id, end))
        prompt = [PromptLogprobs(seqs[r].request_id, entries) for r, entries in out.prompt.items()]
        self.steps += 1
        record = self._record(seqs, rows, n_decode, started_ns, time.perf_counter() - t0, gpu_s, len(owners),
                              out.sampled)
        self.prefill_tokens += record.prefill_tokens
        self._emit(StepEvents(tokens, finished, [], [], record, prompt))

    def _choose(self, seqs: list[Sequence], rows: list[RowInput]) -> tuple[list[Sequence], StepOutput]:
        """Run the step and choose a token per sequence; a fresh prompt also chooses for its waiting
        siblings, from its own row. Returns the sequences in the order of the output's tokens."""
        owners, row_of = [], []
        for r, (seq, row) in enumerate(zip(seqs, rows)):
            prompt_end = row.start_pos + len(row.token_ids)
            if prompt_end < len(seq.prompt_ids):
                continue  # a prompt chunk before the last: no token yet
            group = (seq, *seq.forks) if row.start_pos < len(seq.prompt_ids) else (seq,)
            owners += group
            row_of += [r] * len(group)
        if all(s.plain for s in seqs):  # siblings share their parent's spec: the argmax fast path
            greedy = self.engine.runner.step(rows)
            n = len(owners)
            return owners, StepOutput([greedy[r] for r in row_of], [None] * n, [()] * n, {}, sampled=False)
        draws = [Draw(r, s.sampling, s.seed, s.index, len(s.output_ids), s.prompt_ids, s.output_ids)
                 for s, r in zip(owners, row_of)]
        prompt_rows = {r: s.sampling.prompt_logprobs for r, s in enumerate(seqs)
                       if rows[r].start_pos == 0 and s.sampling.prompt_logprobs is not None}
        return owners, self.engine.runner.run(rows, draws, prompt_rows)

    def _record(self, seqs, rows, n_decode, started_ns, cpu_s, gpu_s, draws, sampled) -> StepRecord:
        c = self.engine.backend.take_counters()
        prefill_tokens = sum(len(r.token_ids) for r in rows if not (len(r.token_ids) == 1 and r.start_pos > 0))
        phase = "decode" if prefill_tokens == 0 else ("prefill" if n_decode == 0 else "mixed")
        return StepRecord(
            step=self.steps, phase=phase, request_ids=list(dict.fromkeys(s.request_id for s in seqs)), rows=len(rows),
            decode_rows=n_decode, prefill_tokens=prefill_tokens,
            positions_max=max(r.start_pos + len(r.token_ids) - 1 for r in rows), started_ns=started_ns,
            cpu_s=cpu_s, gpu_s=gpu_s,
            routes_per_rank=c.routes_per_rank if c else [], routes_per_expert=c.routes_per_expert if c else [],
            collective_calls=c.collective_calls if c else 0,
            collective_bytes=(c.bytes_sent + c.bytes_received) if c else 0, exchange_s=c.exchange_s if c else 0.0,
            kv_slots_used=self.engine.cache.num_slots - self.engine.cache.free_slots, draws=draws, sampled=sampled,
        )


def _sequences(cmd: Admit) -> Sequence:
    """The request's first sequence, carrying its n-1 siblings until the shared prefill."""
    seed = cmd.sampling.seed if cmd.sampling.seed is not None else _SEEDS.getrandbits(64)
    seed = (seed + 2**63) % 2**64 - 2**63  # any integer -> a signed 64-bit one
    group = Group(cmd.request_id, live=cmd.n)
    prompt = list(cmd.prompt_ids)
    seqs = [Sequence(cmd.request_id, prompt, cmd.max_tokens, cmd.ignore_eos, index=i, sampling=cmd.sampling,
                     seed=seed, stop_token_ids=frozenset(cmd.stop_token_ids), group=group) for i in range(cmd.n)]
    seqs[0].forks = seqs[1:]
    return seqs[0]
