"""The GPU thread: owns the engine, drains its command inbox, forms each step's batch (new prompts
prefill while every running request decodes, all in one forward), and sends one StepEvents per
step back to the asyncio loop. It blocks when idle and never awaits.

A request of n choices is n sequences sharing one prefill: the first sequence prefills, all n draw
their first token from its logits (each with its own seed stream), then the n-1 siblings take a copy
of its KV cache rows and decode on their own slots. The request's Finished event comes once its
last sequence has ended.

Overlapped decode (the daemon's --async-scheduling, on by default; as vLLM's async scheduling and
SGLang's overlap scheduler): while every running sequence decodes greedily and nobody waits for a
free slot, the thread launches step N+1 before it reads step N's tokens. Step N+1's input ids are
step N's tokens, taken on the device; its rows are step N's minus those that reach max_tokens at N. A sequence that ends at N for another reason (EOS,
a stop token, a stop string, a cancel) is learned one step late: its token from N+1 is dropped.
Admission, prefill, forks and sampling steps run one at a time, with nothing in flight, so a freed
KV slot is never handed out while a launched step may still write to it."""
from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable

import torch

from engine.admission import admit
from engine.batch import RowInput
from engine.engine import Engine, RequestError
from engine.contract import (
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
from engine.in_flight import InFlight, plain_decode, seconds, successor
from engine.runner import StepOutput
from engine.sampler import Draw, PromptWant
from engine.sequence import Sequence

IDLE_WAKE_S = 0.2  # an idle thread still checks the expert ranks and refreshes its heartbeat this often


class GpuThread:
    def __init__(self, engine: Engine, emit: Callable[[Event], None], *, max_prefill_tokens: int = 8192,
                 overlap: bool = True):
        self.engine = engine
        self._emit = emit
        self.max_prefill_tokens = max_prefill_tokens
        self.overlap = overlap  # launch decode step N+1 before reading step N's tokens
        self.in_flight: InFlight | None = None
        self.overlapped_steps = 0  # steps launched while the one before was still in flight
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: dict[tuple[str, int], Sequence] = {}  # (request id, choice index) -> sequence
        self.heartbeat = time.monotonic()
        self.error: str | None = None
        self.steps = 0
        self.decode_batch_max = 0
        self.prefill_tokens = 0  # prompt tokens run through the model, all steps together
        # two pairs of CUDA events around the forward, used in turn (two steps may be in flight)
        self._timers: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = None
        self._timer_turn = 0
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
            while self._apply(self._drain(block=not (self.waiting or self.running or self.in_flight))):
                self.heartbeat = time.monotonic()
                self.tick()
        except Exception as e:  # noqa: BLE001 - any error ends the thread; every request hears of it
            self.error = f"{type(e).__name__}: {e}"
            self.in_flight = None
            held = self._held_ids()
            self.running.clear()
            self.waiting.clear()
            self._emit(EngineDied(self.error, [Failed(rid, self.error) for rid in held]))

    def tick(self) -> None:
        """One turn of the loop after the commands: read the step in flight (launching its successor
        first where it may), or run the next step, or nothing when idle."""
        if self.in_flight is not None:
            self._overlapped_step()
        elif self.waiting or self.running:
            self._step()

    def _drain(self, block: bool) -> list[Command]:
        cmds = []
        if block:
            self.engine.backend.check_ranks()  # a lost expert rank fails the engine now, not at the next request
            try:
                cmds.append(self._inbox.get(timeout=IDLE_WAKE_S))
            except queue.Empty:
                return cmds  # _run refreshes the heartbeat
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
                case Admit():  # checked here, once: a bad request fails alone (engine.admission)
                    try:
                        self.waiting.append(admit(cmd, self.engine))
                    except RequestError as e:
                        failed.append(Failed(cmd.request_id, str(e)))
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

    def _take(self, seq: Sequence, tok: int, logprob, top, tokens: list[Token], finished: list[Finished]) -> None:
        """Give a chosen token to its sequence: its Token event, and the request's Finished when that
        ended the request's last sequence."""
        seq.output_ids.append(tok)
        reason = seq.finish_reason(self.engine.eos_id)
        tokens.append(Token(seq.request_id, tok, len(seq.output_ids) == 1, seq.index, logprob, top, reason))
        if reason is not None:
            end = self._end(seq, reason)
            if end is not None:
                finished.append(Finished(seq.request_id, end))

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
        arrival order, so a long prompt is fed in chunks while the others keep decoding. Only the
        step's first prompt is cut (a later chunk runs eagerly and takes the step's other prompts
        with it); one that would not fit whole waits for the next step, with those behind it (FCFS)."""
        budget = self.max_prefill_tokens
        seqs, rows = [], []
        held = False  # a prompt was held back: the later ones wait behind it
        for s in self.running.values():
            if s.cached >= len(s.prompt_ids):  # decoding: its last token (Sequence.next_row, inlined)
                ids = [s.output_ids[-1]]
            elif held or budget <= 0:
                continue  # its next prompt chunk waits for a later step
            elif len(s.prompt_ids) - s.cached > budget and budget < self.max_prefill_tokens:
                held = True  # it would be cut beside other prompts
                continue
            else:
                ids = s.next_row(budget)
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
        if self.overlap and not admitted and plain_decode(seqs, rows):
            self.in_flight = self._launch(seqs, rows, None)
            return
        timer = self._device_timer()
        if timer is not None:
            timer[0].record()
        owners, out = self._choose(seqs, rows)
        if timer is not None:
            timer[1].record()
        gpu_s = seconds(timer)
        # requests whose own values made their share of the step fail (engine.request_guard): they end alone
        failed = {owners[i].request_id: why for i, why in out.failed.items()}
        failed.update({seqs[r].request_id: why for r, why in out.failed_rows.items()})
        # one pass over the rows: the step's shape, and each sequence's cache length
        n_decode = prefill_tokens = positions_max = 0
        for seq, row in zip(seqs, rows):
            n = len(row.token_ids)
            if n == 1 and row.start_pos > 0:
                n_decode += 1
            else:
                prefill_tokens += n
            last = row.start_pos + n - 1
            if last > positions_max:
                positions_max = last
            seq.cached += n
            if seq.forks and not seq.prefilling and seq.request_id not in failed:  # siblings copy the prefill
                self.engine.runner.fork(seq.slot, [f.slot for f in seq.forks], seq.cached)
                for f in seq.forks:
                    f.cached = seq.cached
                    self.running[f.key] = f
                seq.forks = []
        self.decode_batch_max = max(self.decode_batch_max, n_decode)
        tokens, finished = [], []
        dropped = [Failed(rid, f"the engine could not serve this request: {why}") for rid, why in failed.items()
                   if self._drop(rid)]
        for seq, tok, lp, top in zip(owners, out.tokens, out.logprobs, out.top_logprobs):
            if seq.request_id not in failed:
                self._take(seq, tok, lp, top, tokens, finished)
        prompt = [PromptLogprobs(seqs[r].request_id, entries, rows[r].start_pos + (rows[r].start_pos > 0))
                  for r, entries in out.prompt.items() if seqs[r].request_id not in failed]
        self.steps += 1
        record = self._record(seqs, rows, n_decode, prefill_tokens, positions_max, started_ns,
                              time.perf_counter() - t0, gpu_s, len(owners), out.sampled)
        self.prefill_tokens += prefill_tokens
        self._emit(StepEvents(tokens, finished, dropped, [], record, prompt))

    # ---- overlapped decode ----------------------------------------------------------------------
    def _launch(self, seqs: list[Sequence], rows: list[RowInput], feed: list[int] | None) -> InFlight:
        """Start a greedy decode step; feed: as ModelRunner.launch (None: the host knows every id)."""
        t0, started_ns = time.perf_counter(), time.time_ns()
        timer = self._device_timer()
        if timer is not None:
            timer[0].record()
        launched = self.engine.runner.launch(rows, feed)
        counters = self.engine.counters.mark()
        if timer is not None:
            timer[1].record()
        for seq in seqs:
            seq.cached += 1
        return InFlight(launched, seqs, rows, t0, started_ns, timer, feed is not None, counters)

    def _overlapped_step(self) -> None:
        """Launch the successor of the step in flight where nothing else needs the thread first, then
        read the step in flight and hand out its tokens."""
        prev = self.in_flight
        nxt = None
        cache = self.engine.cache
        if self.overlap and not (self.waiting and cache.free_slots > len(self.waiting[0].forks)):
            seqs, rows, feed = successor(prev, self.running)
            if seqs:
                nxt = self._launch(seqs, rows, feed)
                self.overlapped_steps += 1
        self.in_flight = nxt
        self._finish(prev)

    def _finish(self, f: InFlight) -> None:
        """Read a launched step's tokens; sequences that ended while it ran drop theirs."""
        out = self.engine.runner.collect(f.launched)
        tokens, finished, live = [], [], []
        positions_max = 0
        for seq, row, tok in zip(f.seqs, f.rows, out):
            if row.start_pos > positions_max:
                positions_max = row.start_pos
            if self.running.get(seq.key) is not seq:
                continue  # it ended (or was cancelled) while this step was in flight
            live.append(seq)
            self._take(seq, tok, None, (), tokens, finished)
        n = len(f.rows)
        self.decode_batch_max = max(self.decode_batch_max, n)
        self.steps += 1
        # the record names the requests the step served; rows counts the dropped ones too
        record = self._record(live, f.rows, n, 0, positions_max, f.started_ns, time.perf_counter() - f.t0,
                              seconds(f.timer), len(live), False, f.overlapped, f.counters(), n - len(live))
        self._emit(StepEvents(tokens, finished, [], [], record, []))

    def _device_timer(self) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        """A pair of CUDA events around the forward; two pairs made once and used in turn (each new
        event costs host time per step). None off the GPU."""
        if self._timers is None:
            if not self.engine.spec.device.startswith("cuda"):
                return None
            self._timers = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                            for _ in range(2)]
        self._timer_turn ^= 1
        return self._timers[self._timer_turn]

    def _choose(self, seqs: list[Sequence], rows: list[RowInput]) -> tuple[list[Sequence], StepOutput]:
        """Run the step and choose a token per sequence; a fresh prompt also chooses for its waiting
        siblings, from its own row. Returns the sequences in the order of the output's tokens."""
        owners, row_of = [], []
        one_per_row = True  # every row chooses exactly its own sequence's token (the usual decode step)
        for r, (seq, row) in enumerate(zip(seqs, rows)):
            if row.start_pos + len(row.token_ids) < len(seq.prompt_ids):
                one_per_row = False
                continue  # a prompt chunk before the last: no token yet
            owners.append(seq)
            row_of.append(r)
            if seq.forks and row.start_pos < len(seq.prompt_ids):  # the siblings draw from this row too
                one_per_row = False
                owners += seq.forks
                row_of += [r] * len(seq.forks)
        if all(s.plain for s in seqs):  # siblings share their parent's spec: the argmax fast path
            greedy = self.engine.runner.step(rows)
            n = len(owners)
            tokens = greedy if one_per_row else [greedy[r] for r in row_of]
            return owners, StepOutput(tokens, [None] * n, [()] * n, {}, sampled=False)
        draws = [Draw(r, s.sampling, s.seed, s.index, len(s.output_ids), s.prompt_ids, s.output_ids, s.params)
                 for s, r in zip(owners, row_of)]
        prompt_rows = {}  # each prompt chunk of an echo request: the log-probs of the tokens it predicts
        for r, (s, row) in enumerate(zip(seqs, rows)):
            start = row.start_pos
            if s.sampling.prompt_logprobs is not None and start < len(s.prompt_ids):
                targets = s.prompt_ids[start + 1:start + len(row.token_ids) + 1]
                prompt_rows[r] = PromptWant(s.sampling.prompt_logprobs, targets, start == 0)
        return owners, self.engine.runner.run(rows, draws, prompt_rows)

    def _record(self, seqs, rows, n_decode, prefill_tokens, positions_max, started_ns, cpu_s, gpu_s, draws,
                sampled, overlapped=False, counters=None, dropped=0) -> StepRecord:
        c = counters if counters is not None else self.engine.counters.take()
        phase = "decode" if prefill_tokens == 0 else ("prefill" if n_decode == 0 else "mixed")
        return StepRecord(
            step=self.steps, phase=phase, request_ids=list(dict.fromkeys([s.request_id for s in seqs])),
            rows=len(rows), decode_rows=n_decode, prefill_tokens=prefill_tokens, positions_max=positions_max,
            started_ns=started_ns,
            cpu_s=cpu_s, gpu_s=gpu_s,
            routes_per_rank=c.routes_per_rank if c else [], routes_per_expert=c.routes_per_expert if c else [],
            collective_calls=c.collective_calls if c else 0,
            collective_bytes=(c.bytes_sent + c.bytes_received) if c else 0, exchange_s=c.exchange_s if c else 0.0,
            kv_slots_used=self.engine.cache.num_slots - self.engine.cache.free_slots, draws=draws, sampled=sampled,
            overlapped=overlapped, dropped_rows=dropped,
        )
