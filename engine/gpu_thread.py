"""The GPU thread: owns the engine, drains its command inbox, forms each step's batch (new prompts
prefill while every running request decodes, all in one forward), and sends one StepEvents per
step back to the asyncio loop. It blocks when idle and never awaits."""
from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable

import torch

from engine.batch import RowInput
from engine.engine import Engine, RequestError
from engine.messages import (Admit, Cancel, Command, EngineDied, Event, Failed, Finished, InjectFailure,
                             PrefillStarted, Released, Shutdown, Stall, StepEvents, StepRecord, Token)
from engine.sequence import Sequence

IDLE_WAKE_S = 0.5  # an idle thread still refreshes its heartbeat this often


class GpuThread:
    def __init__(self, engine: Engine, emit: Callable[[Event], None], *, max_prefill_tokens: int = 8192):
        self.engine = engine
        self._emit = emit
        self.max_prefill_tokens = max_prefill_tokens
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: dict[str, Sequence] = {}
        self.heartbeat = time.monotonic()
        self.error: str | None = None
        self.steps = 0
        self.decode_batch_max = 0
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
            held = [*self.running.values(), *self.waiting]
            self.running.clear()
            self.waiting.clear()
            self._emit(EngineDied(self.error, [Failed(s.request_id, self.error) for s in held]))

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
        failed, released = [], []
        for cmd in cmds:
            match cmd:
                case Admit():
                    try:
                        self.engine.check_request(cmd.prompt_ids, cmd.max_tokens)
                    except RequestError as e:
                        failed.append(Failed(cmd.request_id, str(e)))
                        continue
                    self.waiting.append(Sequence(cmd.request_id, list(cmd.prompt_ids), cmd.max_tokens, cmd.ignore_eos))
                case Cancel():
                    if self._drop(cmd.request_id):
                        released.append(Released(cmd.request_id))
                case Stall():
                    time.sleep(cmd.seconds)
                case InjectFailure():
                    if self._drop(cmd.request_id):
                        failed.append(Failed(cmd.request_id, cmd.message))
                case Shutdown():
                    released += [Released(s.request_id) for s in [*self.running.values(), *self.waiting]]
                    for s in list(self.running.values()):
                        self._drop(s.request_id)
                    self.waiting.clear()
                    if released:
                        self._emit(StepEvents([], [], [], released, None))
                    return False
        if failed or released:
            self._emit(StepEvents([], [], failed, released, None))
        return True

    def _drop(self, request_id: str) -> bool:
        seq = self.running.pop(request_id, None)
        if seq is not None:
            self.engine.cache.release(seq.slot)
            return True
        for s in self.waiting:
            if s.request_id == request_id:
                self.waiting.remove(s)
                return True
        return False

    def _admit_waiting(self) -> list[str]:
        """FCFS: take waiting prompts while a KV slot is free and the prefill budget allows."""
        budget = self.max_prefill_tokens
        cache = self.engine.cache
        admitted = []
        while self.waiting and cache.free_slots and (len(self.waiting[0].prompt_ids) <= budget
                                                     or budget == self.max_prefill_tokens):
            seq = self.waiting.popleft()
            seq.slot = cache.allocate()
            budget -= len(seq.prompt_ids)
            self.running[seq.request_id] = seq
            admitted.append(seq.request_id)
        return admitted

    def _step(self) -> None:
        admitted = self._admit_waiting()
        if not self.running:
            return
        t0, started_ns = time.perf_counter(), time.time_ns()
        if admitted:
            self._emit(PrefillStarted(admitted, started_ns))
        seqs = list(self.running.values())
        rows = [RowInput(s.slot, s.pending_ids, s.cached) for s in seqs]
        on_gpu = self.engine.spec.device.startswith("cuda")
        if on_gpu:
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
        next_tokens = self.engine.runner.step(rows)
        gpu_s = None
        if on_gpu:
            ev1.record()
            ev1.synchronize()
            gpu_s = ev0.elapsed_time(ev1) / 1e3
        tokens, finished = [], []
        n_decode = sum(1 for r in rows if len(r.token_ids) == 1 and r.start_pos > 0)
        self.decode_batch_max = max(self.decode_batch_max, n_decode)
        for seq, row, tok in zip(seqs, rows, next_tokens):
            seq.cached += len(row.token_ids)
            seq.output_ids.append(tok)
            tokens.append(Token(seq.request_id, tok, first=len(seq.output_ids) == 1))
            reason = seq.finish_reason(self.engine.eos_id)
            if reason is not None:
                finished.append(Finished(seq.request_id, reason))
                self._drop(seq.request_id)
        self.steps += 1
        self._emit(StepEvents(tokens, finished, [], [], self._record(seqs, rows, n_decode, started_ns,
                                                                     time.perf_counter() - t0, gpu_s)))

    def _record(self, seqs, rows, n_decode, started_ns, cpu_s, gpu_s) -> StepRecord:
        c = self.engine.backend.take_counters()
        prefill_tokens = sum(len(r.token_ids) for r in rows if not (len(r.token_ids) == 1 and r.start_pos > 0))
        phase = "decode" if prefill_tokens == 0 else ("prefill" if n_decode == 0 else "mixed")
        return StepRecord(
            step=self.steps, phase=phase, request_ids=[s.request_id for s in seqs], rows=len(rows),
            decode_rows=n_decode, prefill_tokens=prefill_tokens,
            positions_max=max(r.start_pos + len(r.token_ids) - 1 for r in rows), started_ns=started_ns,
            cpu_s=cpu_s, gpu_s=gpu_s,
            routes_per_rank=c.routes_per_rank if c else [], routes_per_expert=c.routes_per_expert if c else [],
            collective_calls=c.collective_calls if c else 0,
            collective_bytes=(c.bytes_sent + c.bytes_received) if c else 0, exchange_s=c.exchange_s if c else 0.0,
            kv_slots_used=self.engine.cache.num_slots - self.engine.cache.free_slots,
        )
