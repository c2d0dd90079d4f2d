"""The daemon's runtime: everything one serving process holds (settings, tokenizer, engine, GPU
thread, scheduler, telemetry), its phase (loading, ready, draining, stopped, dead) as a small state
machine, the start-up sequence, the staged drain and the forced stop, and the exit status.

Exit status: 1 when the engine failed (or never loaded): a supervisor restarts the service. Else
EXIT_UNFINISHED when a request the server had accepted did not finish normally because it stopped
(cancelled when --drain-timeout ran out or on a forced stop, or its response cut off), so that a
supervisor knows work was lost. Else 0: a drain that completed every request."""
from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import logging
import os
import sys
import time
from pathlib import Path

from pegainfer.daemon.bridge import EngineBridge
from pegainfer.daemon.chat_template import ChatTemplate, load_chat_template
from pegainfer.daemon.open_responses import OpenResponses
from pegainfer.daemon.request_end import SERVER_SHUTDOWN
from pegainfer.daemon.request_ids import RequestIds
from pegainfer.daemon.settings import Settings
from pegainfer.daemon.tokenize_pool import TokenizePool
from pegainfer.daemon.unknown_fields import UnknownFields
from pegainfer.engine.engine import Engine, EngineSpec, build_engine, default_model_dir, log_event
from pegainfer.engine.kernels.config import KernelConfig
from pegainfer.engine.loop import GpuThread
from pegainfer.engine.contract import Shutdown
from pegainfer.engine.tokenizer import Tokenizer
from pegainfer.engine.warmup import warm_up
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.telemetry.hub import Telemetry

log = logging.getLogger("pegainfer.daemon")


# The cyclic collector's thresholds while serving (Python's defaults: 700, 10, 10). Streaming makes
# garbage at a high rate, and every full collection walks all the live request and span objects while
# holding the GIL (about 45 ms at 256 streams on the CPU box): collect the young generation a little
# less often and the whole heap ten times less often. tools/dev/bench_host_path.py prints the collector's
# time per token.
GC_THRESHOLDS = (2000, 10, 100)
# How long a thread that wants the GIL waits before the holder is asked to let go (Python's default:
# 5 ms). The GPU thread wants it back the moment the device finishes a step, while the loop thread is
# busy streaming: with the default it waited up to 5 ms per step (tools/dev/bench_host_path.py
# --fake-step-ms 8.3 at 256 streams: steps of 14.6-16.0 ms; with 0.5 ms, 11.0-11.5 ms).
GIL_SWITCH_INTERVAL_S = 0.0005
EXIT_UNFINISHED = 3  # accepted requests did not finish: the shutdown cancelled them or cut them off
# How long a stopping server waits for the responses still open to write their last bytes (the final
# chunk, or the server_shutdown error chunk and [DONE]) before it stops the engine and the listener.
FLUSH_S = 2.0


def tune_for_serving() -> None:
    """The interpreter settings for serving, once the engine is loaded. What exists by then (modules,
    the model's Python objects, the tokenizer) lives as long as the process: it is moved out of the
    cyclic collector's sight, or every full collection would walk all of it while holding the GIL
    that both the loop and the GPU thread need."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    DEAD = "dead"  # the engine failed; the process exits non-zero so a supervisor restarts it


PHASES: dict[Phase, frozenset[Phase]] = {
    Phase.LOADING: frozenset({Phase.READY, Phase.DEAD, Phase.STOPPED}),
    Phase.READY: frozenset({Phase.DRAINING, Phase.DEAD}),
    Phase.DRAINING: frozenset({Phase.STOPPED, Phase.DEAD}),
    Phase.STOPPED: frozenset(),
    Phase.DEAD: frozenset({Phase.STOPPED}),
}


class Runtime:
    def __init__(self, settings: Settings, telemetry: Telemetry, notifier=None):
        self.settings = settings
        self.telemetry = telemetry
        self.notifier = notifier
        self.phase = Phase.LOADING
        self.model_dir = settings.model or (None if settings.random_preset else str(default_model_dir()))
        self.model_name = settings.served_model_name or (
            Path(self.model_dir).name if self.model_dir else f"random-{settings.random_preset}")
        telemetry.set_model_name(self.model_name)  # the model_name label of every metric series
        self.tokenizer: Tokenizer | None = None
        self.tokenize = TokenizePool(settings.tokenizer_workers)
        self.chat_template = ChatTemplate(None, {}, "", "the model is not loaded yet")  # the checkpoint's, once loaded
        self.request_ids = RequestIds()  # the ids of the requests being served
        self.unknown_fields = UnknownFields()  # request fields seen and ignored (each logged once)
        self.engine: Engine | None = None
        self.gpu: GpuThread | None = None
        self.bridge: EngineBridge | None = None
        self.scheduler: Scheduler | None = None
        self.exit_code = 0
        self.load_error: str | None = None
        self.startup: dict | None = None  # how long start-up took, by part (/ready, the startup_time log line)
        self.started = time.monotonic()
        self.started_wall = time.time()
        self._drain_task: asyncio.Task | None = None
        self._forced = asyncio.Event()  # a second SIGTERM/SIGINT: stop waiting for requests to finish
        self.open_responses = OpenResponses()
        self.unfinished = 0  # accepted requests the shutdown cancelled
        self.on_exit = None  # set by the server: on_exit(force) once the process should stop

    def move(self, new: Phase) -> None:
        if new not in PHASES[self.phase]:
            raise RuntimeError(f"illegal daemon phase {self.phase.name} -> {new.name}")
        self.phase = new

    # ---- start-up ---------------------------------------------------------------------------------
    def spec(self) -> EngineSpec:
        s = self.settings
        return EngineSpec(model_dir=self.model_dir, random_preset=s.random_preset, device=s.device, dtype=s.dtype,
                          backend=s.backend, ep_size=s.ep_size, max_model_len=s.max_model_len,
                          num_slots=s.max_active, kv_cache_tokens=s.kv_cache_tokens,
                          prefix_caching=s.prefix_caching, rank_timeout_s=s.rank_timeout,
                          rank_join_timeout_s=s.rank_join_timeout, ep_master_addr=s.ep_master_addr,
                          ep_master_port=s.ep_master_port if s.ep_master_addr else None,
                          ep_chunk_bytes=s.ep_chunk_bytes, max_prefill_tokens=s.max_prefill_tokens,
                          kernels=KernelConfig(batch_invariant=s.batch_invariant))

    def _build(self) -> tuple[Engine, Tokenizer, ChatTemplate]:
        """Runs in a worker thread: load weights, start ranks, then compile every kernel and capture
        every graph the server can use (engine.warmup)."""
        if self.settings.debug_load_delay:
            time.sleep(self.settings.debug_load_delay)
        s = self.settings
        t0 = time.monotonic()
        ranks = f", {s.ep_size} ranks" if s.ep_size > 1 else ""
        self._status(f"loading weights: {self.model_name} ({s.backend} backend{ranks}, {s.device})")
        folder = self.model_dir or _preset_tokenizer_dir(self.settings.random_preset)
        tok = Tokenizer(folder)
        log_event("prompt_length_bound", chars_per_token=tok.bound.chars_per_token, basis=tok.bound.reason)
        template = load_chat_template(folder)
        log_event("chat_template", available=template.template is not None, source=template.source,
                  problem=template.problem)
        with self.notifier.load_progress(s.ep_size) if self.notifier else contextlib.nullcontext():
            engine = build_engine(self.spec())
        t1 = time.monotonic()
        self._status("warming up: compiling kernels and capturing graphs")
        report = warm_up(engine, max_prefill_tokens=s.max_prefill_tokens, mixed_step_tokens=s.mixed_step_tokens)
        self.startup = {"load_s": round(t1 - t0, 3), "capture_s": round(report.capture_s, 3),
                        "warmup_requests_s": round(report.requests_s, 3),
                        "graphs": len(report.decode_keys) + len(report.prefill_keys),
                        "compile_cache_dir": s.compile_cache_dir}
        return engine, tok, template

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        s = self.settings
        try:
            engine, tok, template = await asyncio.to_thread(self._build)
        except Exception as e:  # noqa: BLE001 - a load failure is reported, and the process exits non-zero
            self.load_error = f"{type(e).__name__}: {e}"
            log_event("load_failed", error=self.load_error)
            self._status(f"load failed: {self.load_error}")
            self.exit_code = 1
            self.move(Phase.DEAD)
            self._request_exit()
            return
        self.engine, self.tokenizer, self.chat_template = engine, tok, template
        self.bridge = EngineBridge(loop, self)
        self.gpu = GpuThread(engine, self.bridge.emit, max_prefill_tokens=s.max_prefill_tokens,
                             mixed_step_tokens=s.mixed_step_tokens, overlap=s.async_scheduling,
                             overlap_admission=s.async_admission, max_step_prompts=s.max_step_prompts)
        self.scheduler = Scheduler(self.bridge, max_active=engine.cache.num_slots, max_pending=s.max_pending,
                                   observer=self.telemetry)
        self.bridge.connect(self.gpu, self.scheduler)
        tune_for_serving()
        self.gpu.start()
        self.telemetry.set_engine(engine.backend_name, engine.maturity, self.model_name,
                                  batch_invariant=engine.batch_invariant, max_model_len=engine.max_model_len)
        self.scheduler.set_ready(True)
        if self.phase is Phase.LOADING:
            self.move(Phase.READY)
        self.startup["total_s"] = round(time.monotonic() - self.started, 3)  # the runtime's start to ready
        self.startup["process_s"] = process_age_s()  # the process's start (imports included) to ready
        log_event("startup_time", **self.startup)
        log_event("serving", host=s.host, port=s.port, model=self.model_name, backend=engine.backend_name,
                  maturity=engine.maturity, batch_invariant=engine.batch_invariant,
                  max_active=engine.cache.num_slots, max_pending=s.max_pending,
                  max_model_len=engine.max_model_len, async_scheduling=s.async_scheduling,
                  async_admission=s.async_admission, max_step_prompts=s.max_step_prompts)
        self._notify(ready=True)

    # ---- StepObserver (from the bridge) -----------------------------------------------------------
    def on_step(self, record) -> None:
        self.telemetry.on_step(record)

    def on_preempted(self, request_id: str, index: int) -> None:
        self.telemetry.on_preempted(request_id, index)

    def on_engine_died(self, message: str) -> None:
        log_event("engine_died", level="error", error=message)
        self._status(f"engine failed: {message}")
        self.telemetry.on_engine_died(message)
        self.exit_code = 1
        if self.phase in (Phase.READY, Phase.DRAINING):
            self.move(Phase.DEAD)
        # let error chunks reach clients, then exit so a supervisor restarts us
        asyncio.get_running_loop().call_later(0.5, self._request_exit)

    # ---- health -----------------------------------------------------------------------------------
    def healthy(self) -> bool:
        if self.phase is Phase.DEAD:
            return False
        return self.phase is Phase.LOADING or (self.gpu is not None and self.gpu.is_alive())

    def ready(self) -> bool:
        return self.phase is Phase.READY and self.gpu is not None and self.gpu.is_alive()

    def heartbeat_fresh(self, max_age_s: float) -> bool:
        if self.phase is Phase.LOADING:
            return True
        return self.gpu is not None and self.gpu.is_alive() and time.monotonic() - self.gpu.heartbeat < max_age_s

    # ---- shutdown ---------------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """SIGTERM/SIGINT: stop admitting, let work finish up to drain_timeout, cancel the rest."""
        if self._drain_task is not None:
            return
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    def force_stop(self) -> None:
        """A second SIGTERM/SIGINT: stop waiting. Every live request is cancelled with the code
        server_shutdown (a stream gets that error chunk and [DONE], a JSON request a 503), their
        responses get FLUSH_S to go out, then the engine and the server stop."""
        if self._forced.is_set():
            return
        log_event("forced_stop", running=self.scheduler.num_running if self.scheduler else 0,
                  waiting=self.scheduler.num_waiting if self.scheduler else 0)
        self._forced.set()
        self.begin_drain()  # the drain does the rest; already draining, it stops waiting now

    async def _drain(self) -> None:
        log_event("draining", timeout_s=self.settings.drain_timeout)
        self._notify(stopping=True)
        if self.phase is Phase.READY:
            self.move(Phase.DRAINING)
        if self.scheduler is not None:
            self.scheduler.start_drain()
            if not await self._idle_unless_forced(self.settings.drain_timeout):
                why = "forced stop" if self._forced.is_set() else "drain timeout"
                n = self.scheduler.cancel_all(f"server shutting down ({why})", SERVER_SHUTDOWN)
                self.unfinished += n
                log_event("forced_stop_cancelled" if self._forced.is_set() else "drain_timeout", cancelled=n)
        if not await self.open_responses.wait_closed(FLUSH_S):
            log_event("responses_still_open", open=self.open_responses.open, waited_s=FLUSH_S)
        self.exit_code = self.final_exit_code()
        self.close()
        self._request_exit()

    async def _idle_unless_forced(self, timeout: float) -> bool:
        """Wait for the scheduler to go idle, up to `timeout`, or until a forced stop; whether idle."""
        idle = asyncio.ensure_future(self.scheduler.wait_idle(timeout))
        forced = asyncio.ensure_future(self._forced.wait())
        try:
            await asyncio.wait({idle, forced}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()
            if not idle.done():
                idle.cancel()
        return idle.done() and not idle.cancelled() and idle.result()

    def final_exit_code(self) -> int:
        """The process's exit status, as the module docstring says; read once the server stopped too
        (a response uvicorn cancelled, or one still open, was cut off)."""
        if self.exit_code:
            return self.exit_code
        if self.unfinished or self.open_responses.open or self.open_responses.cut:
            return EXIT_UNFINISHED
        return 0

    def close(self) -> None:
        if self.gpu is not None and self.gpu.is_alive():
            self.gpu.submit(Shutdown())
            self.gpu.join(timeout=10)
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if self.phase is not Phase.STOPPED and Phase.STOPPED in PHASES[self.phase]:
            self.move(Phase.STOPPED)
        self.telemetry.shutdown()
        # what tune_for_serving froze goes back to the collector, so that the interpreter's teardown
        # frees it as usual (frozen, Triton's nanobind objects were reported as leaks on stderr at exit)
        gc.unfreeze()
        log_event("stopped", exit_code=self.exit_code)

    def _request_exit(self) -> None:
        if self.on_exit is not None:
            self.on_exit(self._forced.is_set())

    def _status(self, text: str) -> None:
        if self.notifier is not None:
            self.notifier.status(text)

    def _notify(self, ready: bool = False, stopping: bool = False) -> None:
        if self.notifier is None:
            return
        if ready:
            self.notifier.ready()
        if stopping:
            self.notifier.stopping()


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), or None where that cannot be read."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime - ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError):
        return None


def _preset_tokenizer_dir(preset: str) -> str:
    from pegainfer.engine.default_model import ensure_preset_tokenizer
    return str(ensure_preset_tokenizer(preset))
