"""The GPU thread: owns the engine, drains its command inbox, and runs one step after another:
the batcher plans it (engine/batcher.py), the runner runs it (engine/runner.py), the batcher turns
its result into events, and one StepEvents per step, with its record (engine/step_record.py), goes
back to the asyncio loop through `emit`. It blocks when idle (checking the expert ranks and
refreshing its heartbeat meanwhile) and never awaits. An exception out of a step (a device or rank
fault: a request's own faults fail that request alone, engine.request_guard) ends the thread with
one EngineDied that fails every request it held.

Overlapped decode: a launchable step is started and left in flight; the next turn launches its
successor (when the batcher gives one) before reading it."""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable

from pegainfer.engine.admission import admit
from pegainfer.engine.batcher import MIXED_STEP_TOKENS, Batcher, StepOutcome
from pegainfer.engine.contract import (
    Admit,
    Cancel,
    Command,
    EngineDied,
    EngineSnapshot,
    Event,
    Failed,
    InjectFailure,
    PrefillStarted,
    Released,
    Shutdown,
    Stall,
    StepEvents,
    StepRecord,
    StopChoice,
)
from pegainfer.engine.engine import Engine, RequestError
from pegainfer.engine.kv_capacity import PagedCapacity
from pegainfer.engine.runner import LaunchedStep
from pegainfer.engine.step_meter import StepMeter
from pegainfer.engine.step_plan import StepPlan, StepResult
from pegainfer.engine.step_record import step_record

IDLE_WAKE_S = 0.2  # an idle thread still checks the expert ranks and refreshes its heartbeat this often


@dataclasses.dataclass(slots=True)
class InFlight:
    """A launched step whose tokens are not read yet."""
    launched: LaunchedStep
    plan: StepPlan
    t0: float  # perf_counter at launch
    started_ns: int


class GpuThread:
    def __init__(self, engine: Engine, emit: Callable[[Event], None], *, max_prefill_tokens: int = 8192,
                 mixed_step_tokens: int = MIXED_STEP_TOKENS, overlap: bool = True, overlap_admission: bool = False,
                 max_step_prompts: int = 0):
        self.engine = engine
        self._send = emit  # every event goes out through _emit, which attaches the snapshot
        self.batcher = Batcher(PagedCapacity(engine.cache), engine.eos_id, max_prefill_tokens=max_prefill_tokens,
                               mixed_step_tokens=mixed_step_tokens, overlap=overlap,
                               sampled_overlap=engine.runner.samples_on_device, overlap_admission=overlap_admission,
                               max_step_prompts=max_step_prompts)
        self.meter = StepMeter(engine.counters, engine.spec.device)
        self.in_flight: InFlight | None = None
        self.overlapped_steps = 0  # steps launched while the one before was still in flight
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.heartbeat = time.monotonic()
        self.error: str | None = None
        self.steps = 0
        self.decode_batch_max = 0
        self.prefill_tokens = 0  # prompt tokens run through the model, all steps together
        self._thread = threading.Thread(target=self._run, name="pegainfer-gpu", daemon=True)

    # ---- what the daemon reads (engine state is the batcher's) -----------------------------------
    @property
    def running(self) -> dict:
        return self.batcher.running

    @property
    def waiting(self):
        return self.batcher.waiting

    @property
    def overlap(self) -> bool:
        return self.batcher.overlap

    @property
    def max_prefill_tokens(self) -> int:
        return self.batcher.max_prefill_tokens

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
            while self._apply(self._drain(block=not (self.batcher.busy or self.in_flight))):
                self.heartbeat = time.monotonic()
                self.tick()
        except Exception as e:  # noqa: BLE001 - any error ends the thread; every request hears of it
            self.error = f"{type(e).__name__}: {e}"
            self.in_flight = None
            held = self.batcher.held_ids()
            self.batcher.clear()
            self._emit(EngineDied(self.error, [Failed(rid, self.error) for rid in held]))

    def tick(self) -> None:
        """One turn of the loop after the commands: read the step in flight (launching its successor
        first where it may), or run the next step, or nothing when idle."""
        if self.in_flight is not None:
            self._overlapped_step()
        elif self.batcher.busy:
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
        b = self.batcher
        failed, released, finished = [], [], []
        for cmd in cmds:
            match cmd:
                case Admit():  # checked here, once: a bad request fails alone (engine.admission)
                    try:
                        b.add(admit(cmd, self.engine))
                    except RequestError as e:
                        failed.append(Failed(cmd.request_id, str(e)))
                case StopChoice():
                    end = b.stop_choice(cmd.request_id, cmd.index)
                    if end is not None:
                        finished.append(end)
                case Cancel():
                    if b.drop(cmd.request_id):
                        released.append(Released(cmd.request_id))
                case Stall():
                    time.sleep(cmd.seconds)
                case InjectFailure():
                    if b.drop(cmd.request_id):
                        failed.append(Failed(cmd.request_id, cmd.message))
                case Shutdown():
                    held = b.held_ids()
                    released += [Released(rid) for rid in held]
                    for rid in held:
                        b.drop(rid)
                    if finished or released:
                        self._emit(StepEvents([], finished, [], released, None))
                    return False
        if failed or released or finished:
            self._emit(StepEvents([], finished, failed, released, None))
        return True

    def _step(self) -> None:
        b = self.batcher
        admitted = b.admit()
        if not b.running:
            return
        t0, started_ns = time.perf_counter(), time.time_ns()
        if admitted:
            self._emit(PrefillStarted(admitted, started_ns, [b.running[rid, 0].cached for rid in admitted]))
        plan = b.plan(launch=not admitted)
        preempted = b.take_preempted()
        if preempted:
            self._emit(StepEvents([], [], [], [], None, preempted=preempted))
        if not plan.rows:
            return  # every sequence that wanted a row was preempted
        if plan.launchable:
            self.in_flight = self._launch(plan)
            return
        result = self.engine.runner.run(plan, self.meter)
        out = b.settle(plan, result)
        self.decode_batch_max = max(self.decode_batch_max, plan.decode_rows)
        record = self._record(plan, result, out, started_ns, t0)
        self.prefill_tokens += plan.prefill_tokens
        self._emit(StepEvents(out.tokens, out.finished, out.failed, [], record, out.prompt_logprobs))

    # ---- overlapped decode ----------------------------------------------------------------------
    def _launch(self, plan: StepPlan) -> InFlight:
        t0, started_ns = time.perf_counter(), time.time_ns()
        return InFlight(self.engine.runner.launch(plan, self.meter), plan, t0, started_ns)

    def _overlapped_step(self) -> None:
        """Launch the successor of the step in flight where nothing else needs the thread first, then
        read the step in flight and hand out its tokens."""
        prev = self.in_flight
        nxt = None
        plan = self.batcher.successor(prev.plan)
        joined = self.batcher.joined
        if joined:  # newcomers joined the launched step (Batcher.overlap_admission)
            self._emit(PrefillStarted([rid for rid, _ in joined], time.time_ns(), [c for _, c in joined]))
        if plan is not None:
            nxt = self._launch(plan)
            self.overlapped_steps += 1
            self.prefill_tokens += plan.prefill_tokens
        self.in_flight = nxt
        result = self.engine.runner.collect(prev.launched)
        out = self.batcher.settle_launched(prev.plan, result)
        self.decode_batch_max = max(self.decode_batch_max, prev.plan.decode_rows)
        # the record names the requests the step served; rows counts the dropped ones too
        record = self._record(prev.plan, result, out, prev.started_ns, prev.t0)
        self._emit(StepEvents(out.tokens, out.finished, out.failed, [], record, []))

    def _record(self, plan: StepPlan, result: StepResult, out: StepOutcome, started_ns: int, t0: float
                ) -> StepRecord:
        self.steps += 1
        return step_record(plan, result, out, step=self.steps, started_ns=started_ns,
                           cpu_s=time.perf_counter() - t0, kv_slots_used=self.batcher.capacity.used)

    # ---- the published snapshot: what /ready and the metrics know of this thread -----------------
    def snapshot(self) -> EngineSnapshot:
        c, cap = self.engine.cache, self.batcher.capacity
        return EngineSnapshot(self.steps, self.decode_batch_max, len(self.running), len(self.waiting),
                              self.overlapped_steps, self.overlap, c.free_slots, c.num_slots,
                              kv_pages_free=c.pool.available, kv_pages_total=c.num_pages, kv_page_size=c.page_size,
                              preemptions=self.batcher.preemptions, prefix_cache_queries=cap.prefix_queries,
                              prefix_cache_hits=cap.prefix_hits)

    def _emit(self, event: Event) -> None:
        """A step's events, and the thread's death, carry the snapshot of the state they leave."""
        if isinstance(event, (StepEvents, EngineDied)):
            event = dataclasses.replace(event, snapshot=self.snapshot())
        self._send(event)
