"""Where the serving daemon's host time goes: the real daemon (uvicorn, uvloop, the asyncio loop,
the GPU thread, telemetry) runs in this process on the embedded tiny model (or --model), a lean
client process (tools/benchkit/sse_load.py) streams greedy short requests at each concurrency, and
the daemon's two hot threads are read by their own CPU clocks:

- loop thread: CPU µs per streamed token (everything the asyncio side does: HTTP, state machines,
  detokenisation, SSE, request spans, metrics), and how busy it was;
- GPU thread: per engine step, wall and CPU time outside the model forward (the runner's run, launch
  and collect calls): batch forming, token bookkeeping, events, step records. On CUDA the forward includes the
  device wait, so "outside" is the serial host cost that stretches every step.

    python tools/dev/bench_host_path.py [--concurrency 64,256] [--num-requests N] [--max-tokens 64]
        [--prompt-words 64] [--device cpu|cuda] [--model DIR | --random-preset lite] [--trace-file PATH]
        [--torch-threads N] [--profile loop|gpu] [--out FILE.json]

With --fake-step-ms the steps run on tools/benchkit/fake_device.py, which also reports how busy that
"device" was between its first and last step (issue 29's device-busy share), and its idle time by
the kind of step that ended it: an overlapped successor, a decode step launched on its own, or a
step with prompt rows.

On a CPU the forward of the tiny model stands in for the device time; only the host-side numbers
carry over to a GPU host, and they scale with its single-thread speed. --profile prints the top
functions (cProfile, which slows the profiled thread: take the per-token numbers from a run
without it)."""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.benchkit import hardware  # noqa: E402
from tools.benchkit.fake_device import FakeDevice  # noqa: E402
from tools.benchkit.workload import parse_levels  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="64,256", help="comma-separated levels (default 64,256)")
    p.add_argument("--num-requests", type=int, help="requests per level (default 4 N)")
    p.add_argument("--repeats", type=int, default=3, help="runs per level; the numbers printed are their medians")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-words", type=int, default=64)
    p.add_argument("--warmup", type=int, default=64, help="requests sent before measuring (at concurrency 16)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", help="checkpoint folder (default: the embedded tiny model)")
    p.add_argument("--random-preset", help="serve random weights of a preset instead (tiny|lite)")
    p.add_argument("--max-active", type=int, help="KV slots (default: the largest level)")
    p.add_argument("--trace-file", help="JSONL trace file, as production runs write one (default: a temp file; "
                   "'none' for no trace file)")
    p.add_argument("--step-trace-every", type=int, default=1)
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (CPU forward)")
    p.add_argument("--switch-interval", type=float,
                   help="the daemon's GIL switch interval in seconds (daemon.runtime.GIL_SWITCH_INTERVAL_S; "
                        "Python's default is 0.005): how long a thread that wants the GIL waits before the holder "
                        "is asked to let go")
    p.add_argument("--fake-step-ms", type=float,
                   help="replace the model forward by a sleep of this long (the GIL released, as in a device "
                        "wait) and a made-up token per row: the host path at a GPU's step rate")
    p.add_argument("--no-async-scheduling", action="store_true",
                   help="serve with --no-async-scheduling (read each decode step before launching the next)")
    p.add_argument("--async-admission", action="store_true", help="serve with --async-admission")
    p.add_argument("--profile", choices=("loop", "gpu"), help="cProfile one thread over the measured levels")
    p.add_argument("--profile-top", type=int, default=30)
    p.add_argument("--profile-clock", choices=("cpu", "wall"), default="cpu",
                   help="cpu: the thread's own CPU time (waits for the GIL or a core are not charged)")
    p.add_argument("--out", type=Path, help="write the numbers as JSON here too")
    a = p.parse_args(argv)
    a.levels = parse_levels(a.concurrency)
    return a


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def thread_cpu(ident: int) -> float:
    """CPU seconds a thread of this process has used (Linux: its pthread CPU clock)."""
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def thread_sys(native_id: int) -> float:
    """Kernel-mode CPU seconds of a thread (Linux /proc, clock-tick resolution): socket writes and
    wake-ups show up here, not in a Python profile."""
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[12]) / os.sysconf("SC_CLK_TCK")  # stime, field 15 of stat


class StepProbe:
    """Wraps the GPU thread's tick and the runner's forward calls (on their instances only) to sum
    wall and thread-CPU time of every step and of the forward inside it (an overlapped step's launch
    and its read-back both count as forward)."""

    def __init__(self, gpu, runner, profiler: cProfile.Profile | None = None):
        self.steps = self.rows = self.tokens = 0
        self.step_wall = self.step_cpu = self.fwd_wall = self.fwd_cpu = 0.0
        self.profiler = profiler
        tick, fwd_run, launch, collect = gpu.tick, runner.run, runner.launch, runner.collect

        def timed_tick() -> None:
            if self.profiler is not None:
                self.profiler.enable()
            w, c = time.perf_counter(), time.thread_time()
            tick()
            self.step_wall += time.perf_counter() - w
            self.step_cpu += time.thread_time() - c
            self.steps += 1
            if self.profiler is not None:
                self.profiler.disable()

        def forward(fn, plan, *args, count_rows: bool = True, count_tokens: bool = True):
            w, c = time.perf_counter(), time.thread_time()
            out = fn(plan, *args)
            self.fwd_wall += time.perf_counter() - w
            self.fwd_cpu += time.thread_time() - c
            if count_rows:
                self.rows += len(plan.rows)
            if count_tokens:
                self.tokens += len(out.tokens)
            return out

        gpu.tick = timed_tick
        runner.run = lambda plan, *args: forward(fwd_run, plan, *args)
        runner.launch = lambda plan, *args: forward(launch, plan, *args, count_tokens=False)
        runner.collect = lambda launched: forward(lambda _, x: collect(x), None, launched, count_rows=False)

    @staticmethod
    def fake_forward(runner, step_s: float) -> FakeDevice:
        """The runner's greedy steps run on a FakeDevice: step_s of queued "device" time per step and a
        made-up token per row. Only plain greedy requests (the argmax fast path) are served this way."""
        device = FakeDevice(step_s)
        device.install(runner)
        return device

    def snapshot(self) -> dict:
        return {k: getattr(self, k) for k in ("steps", "rows", "tokens", "step_wall", "step_cpu", "fwd_wall",
                                              "fwd_cpu")}


class GcProbe:
    """Time spent in the cyclic garbage collector, by generation and by the thread that ran it (a
    collection holds the GIL, so it stalls every other thread too)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.count: dict[str, int] = {}
        self._t0: dict[int, float] = {}
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._t0[me] = time.perf_counter()
        elif me in self._t0:
            key = f"{threading.current_thread().name}/gen{info['generation']}"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - self._t0.pop(me)
            self.count[key] = self.count.get(key, 0) + 1

    def snapshot(self) -> dict:
        return {"gc_s": dict(self.seconds), "gc_n": dict(self.count)}


class Bench:
    def __init__(self, a: argparse.Namespace, rt, loop: asyncio.AbstractEventLoop, port: int):
        self.a, self.rt, self.loop, self.port = a, rt, loop, port
        self.results: list[dict] = []
        self.error: BaseException | None = None
        timer = time.thread_time if a.profile_clock == "cpu" else time.perf_counter
        self.loop_profiler = cProfile.Profile(timer) if a.profile == "loop" else None
        self.gpu_profiler = cProfile.Profile(timer) if a.profile == "gpu" else None
        self.probe: StepProbe | None = None
        self.fake: FakeDevice | None = None
        self.gc = GcProbe()

    def run(self) -> None:
        try:
            self._wait_ready()
            rt = self.rt
            if self.a.fake_step_ms is not None:
                self.fake = StepProbe.fake_forward(rt.engine.runner, self.a.fake_step_ms / 1e3)
            self.probe = StepProbe(rt.gpu, rt.engine.runner)
            self._client(16, self.a.warmup, first_index=1_000_000)
            for n in self.a.levels:
                runs = [self._level(n) for _ in range(self.a.repeats)]
                self.results.append({**median(runs), "runs": runs})
        except BaseException as e:  # noqa: BLE001 - reported by main() once the server is down
            self.error = e
        finally:
            self.loop.call_soon_threadsafe(self.rt.begin_drain)

    def _wait_ready(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.rt.phase.value == "dead":
                raise RuntimeError(f"the daemon failed to start: {self.rt.load_error}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError("the daemon was not ready in time")

    def _client(self, concurrency: int, requests: int, first_index: int = 0) -> dict:
        if requests < 1:
            return {}
        cmd = [sys.executable, str(ROOT / "tools" / "benchkit" / "sse_load.py"), "--port", str(self.port),
               "--model", self.rt.model_name, "--concurrency", str(concurrency), "--num-requests", str(requests),
               "--max-tokens", str(self.a.max_tokens), "--prompt-words", str(self.a.prompt_words),
               "--first-index", str(first_index)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    def _clocks(self) -> dict:
        main, gpu = threading.main_thread(), self.rt.gpu._thread
        return {"loop_cpu": thread_cpu(main.ident), "loop_sys": thread_sys(main.native_id),
                "gpu_cpu": thread_cpu(gpu.ident), "gpu_sys": thread_sys(gpu.native_id),
                "process_cpu": time.process_time(), "wall": time.perf_counter(), **self.probe.snapshot(),
                **(self.fake.snapshot() if self.fake is not None else {}), **self.gc.snapshot()}

    def _level(self, n: int) -> dict:
        requests = self.a.num_requests or 4 * n
        self._profiling(True)
        before = self._clocks()
        client = self._client(n, requests)
        after = self._clocks()
        self._profiling(False)
        d = {k: after[k] - before[k] for k in before if not k.startswith("gc_")}
        gc_ms = {k: 1e3 * (v - before["gc_s"].get(k, 0.0)) for k, v in after["gc_s"].items()}
        gc_n = {k: v - before["gc_n"].get(k, 0) for k, v in after["gc_n"].items()}
        tokens = client["completion_tokens"]
        steps = max(d["steps"], 1)
        outside_wall, outside_cpu = d["step_wall"] - d["fwd_wall"], d["step_cpu"] - d["fwd_cpu"]
        other_cpu = d["process_cpu"] - d["loop_cpu"] - d["gpu_cpu"]
        return {
            "concurrency": n, "requests": client["requests"], "failed": client["failed"], "tokens": tokens,
            "content_chunks": client["content_chunks"], "wall_s": d["wall"], "tok_per_s": tokens / d["wall"],
            "loop": {"cpu_us_per_token": 1e6 * d["loop_cpu"] / max(tokens, 1),
                     "sys_us_per_token": 1e6 * d["loop_sys"] / max(tokens, 1),
                     "cpu_us_per_chunk": 1e6 * d["loop_cpu"] / max(client["content_chunks"], 1),
                     "busy": d["loop_cpu"] / d["wall"]},
            "gpu": {
                "steps": d["steps"], "rows_per_step": d["rows"] / steps, "tokens": d["tokens"],
                "step_wall_ms": 1e3 * d["step_wall"] / steps, "forward_wall_ms": 1e3 * d["fwd_wall"] / steps,
                "outside_forward_wall_ms": 1e3 * outside_wall / steps,
                "outside_forward_cpu_ms": 1e3 * outside_cpu / steps,
                "outside_forward_cpu_us_per_row": 1e6 * outside_cpu / max(d["rows"], 1),
                "between_steps_cpu_ms": 1e3 * (d["gpu_cpu"] - d["step_cpu"]) / steps,
                "sys_ms": 1e3 * d["gpu_sys"] / steps,
                "busy": d["step_wall"] / d["wall"],
            },
            **({"fake_device": {"busy": d["device_busy_s"] / max(d["device_busy_s"] + d["device_idle_s"], 1e-9),
                                "idle_ms_per_step": 1e3 * d["device_idle_s"] / max(d["device_launches"], 1),
                                "launches_found_it_idle": d["device_waited"] / max(d["device_launches"], 1),
                                "by_kind": {k: {"launches": d[f"device_launches_{k}"],
                                                "idle_ms": 1e3 * d[f"device_idle_s_{k}"]}
                                            for k in ("successor", "decode", "prompt")}}}
               if "device_busy_s" in d else {}),
            "other_threads_cpu_us_per_token": 1e6 * other_cpu / max(tokens, 1),
            "gc": {"ms_per_s": sum(gc_ms.values()) / d["wall"], "us_per_token": 1e3 * sum(gc_ms.values()) / max(tokens, 1),
                   "by_thread_and_generation_ms": {k: v for k, v in sorted(gc_ms.items()) if gc_n.get(k)},
                   "collections": {k: v for k, v in sorted(gc_n.items()) if v}},
        }

    def _profiling(self, on: bool) -> None:
        if self.loop_profiler is not None:
            done = threading.Event()

            def flip() -> None:
                (self.loop_profiler.enable if on else self.loop_profiler.disable)()
                done.set()

            self.loop.call_soon_threadsafe(flip)
            done.wait(10)
        if self.gpu_profiler is not None:
            self.probe.profiler = self.gpu_profiler if on else None


def median(runs: list[dict]) -> dict:
    """Field by field median of runs with the same shape (nested dicts of numbers)."""
    out = {}
    for k in dict.fromkeys(k for r in runs for k in r):
        if any(isinstance(r.get(k), dict) for r in runs):
            out[k] = median([r.get(k, {}) for r in runs])
        else:
            out[k] = statistics.median(r.get(k, 0) for r in runs)
    return out


def profile_text(profiler: cProfile.Profile, top: int) -> str:
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def report_lines(r: dict) -> list[str]:
    g = r["gpu"]
    spread = [run["loop"]["cpu_us_per_token"] for run in r.get("runs", [r])]
    return [
        f"concurrency {r['concurrency']:.0f}: median of {len(spread)} runs of {r['requests']:.0f} requests "
        f"({r['failed']:.0f} failed), {r['tokens']:.0f} tokens in {r['wall_s']:.2f} s = {r['tok_per_s']:.0f} tok/s "
        f"streamed, {r['content_chunks']:.0f} content chunks",
        f"  loop thread : {r['loop']['cpu_us_per_token']:.1f} µs CPU per streamed token (runs "
        f"{min(spread):.1f}-{max(spread):.1f}), of which "
        f"{r['loop']['sys_us_per_token']:.1f} in the kernel; {r['loop']['cpu_us_per_chunk']:.1f} µs per SSE chunk; "
        f"busy {100 * r['loop']['busy']:.0f}% of wall",
        f"  GPU thread  : {g['steps']:.0f} steps, {g['rows_per_step']:.1f} rows/step; per step {g['step_wall_ms']:.2f} ms "
        f"wall, forward {g['forward_wall_ms']:.2f} ms, outside the forward {g['outside_forward_wall_ms']:.3f} ms wall / "
        f"{g['outside_forward_cpu_ms']:.3f} ms CPU ({g['outside_forward_cpu_us_per_row']:.1f} µs CPU per row); "
        f"between steps {g['between_steps_cpu_ms']:.3f} ms CPU; in steps {100 * g['busy']:.0f}% of wall",
        *([f"  fake device : busy {100 * r['fake_device']['busy']:.1f}% between its first and last step; idle "
           f"{r['fake_device']['idle_ms_per_step']:.3f} ms per step; {100 * r['fake_device']['launches_found_it_idle']:.0f}% "
           "of launches found it idle; by the step after the idle time: " + ", ".join(
               f"{k} {v['launches']:.0f} launches, {v['idle_ms']:.0f} ms idle"
               for k, v in r["fake_device"]["by_kind"].items())] if "fake_device" in r else []),
        f"  other threads (span export, torch workers, ...): {r['other_threads_cpu_us_per_token']:.1f} µs CPU per "
        "token",
        f"  garbage collector: {r['gc']['us_per_token']:.1f} µs per token ({r['gc']['ms_per_s']:.1f} ms per second), "
        + ", ".join(f"{k} {v:.0f} ms" for k, v in r["gc"]["by_thread_and_generation_ms"].items()),
    ]


async def _serve(a: argparse.Namespace, port: int) -> Bench:
    import torch

    from pegainfer.daemon.runtime import Runtime
    from pegainfer.daemon.serve import serve_runtime
    from pegainfer.daemon.settings import resolve
    from pegainfer.daemon.telemetry_setup import telemetry_for

    torch.set_num_threads(a.torch_threads)
    if a.switch_interval is not None:
        from pegainfer.daemon import runtime
        runtime.GIL_SWITCH_INTERVAL_S = a.switch_interval
    trace_file = a.trace_file
    if trace_file is None:
        trace_file = os.path.join(tempfile.mkdtemp(prefix="pegainfer-host-path-"), "trace.jsonl")
    flags = argparse.Namespace(
        model=a.model, random_preset=a.random_preset, device=a.device, port=port, log_level="warning",
        max_active=a.max_active or max(a.levels), max_pending=max(max(a.levels), 64),
        trace_file=None if trace_file == "none" else trace_file, step_trace_every=a.step_trace_every,
        async_scheduling=False if a.no_async_scheduling else None, async_admission=a.async_admission or None)
    settings = resolve(flags, environ={})
    rt = Runtime(settings, telemetry_for(settings))
    bench = Bench(a, rt, asyncio.get_running_loop(), port)
    driver = threading.Thread(target=bench.run, name="bench-driver", daemon=True)
    driver.start()
    code = await serve_runtime(rt)
    driver.join(30)
    if code and bench.error is None:
        bench.error = RuntimeError(f"the daemon exited with {code}")
    return bench


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse_args(argv)
    import uvloop
    bench = uvloop.run(_serve(a, free_port()))
    if bench.error is not None:
        print(f"bench_host_path: error: {type(bench.error).__name__}: {bench.error}", file=sys.stderr)
        return 1
    for r in bench.results:
        print("\n".join(report_lines(r)))
    for name, prof in (("loop", bench.loop_profiler), ("gpu", bench.gpu_profiler)):
        if prof is not None:
            print(f"\n---- cProfile of the {name} thread over the measured levels (tottime) ----")
            print(profile_text(prof, a.profile_top))
    if a.out:
        a.out.write_text(json.dumps({
            "tool": "tools/dev/bench_host_path.py",
            "command": hardware.command_line("tools/dev/bench_host_path.py", argv),
            "date": hardware.now_utc(), "git": hardware.git(), "host": hardware.host(), "levels": bench.results,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
