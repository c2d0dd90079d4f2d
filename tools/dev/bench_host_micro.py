"""Socket-free, model-free timings of the daemon's two host paths, steadier than
tools/dev/bench_host_path.py on a shared or small machine (no client process, no kernel, no GIL
contention), for comparing two versions of the code:

- loop: N streamed requests go through create_completion and the response's ASGI call with a no-op
  send, fed T synthetic steps through EngineBridge.dispatch (scheduler, token sinks, choices,
  detokeniser, SSE encoding, request and step spans, metrics); prints loop-thread CPU µs per token.
  uvicorn/h11, the socket writes and the GPU thread are not in it.
Both apply the daemon's serving-time collector and GIL settings (daemon.runtime.tune_for_serving)
where the code under test has them.
- gpu: GpuThread.tick over N running sequences with the forward replaced by a made-up token per row
  (tools/benchkit/fake_device.py, zero device time); prints the thread's host µs per step and per row,
  step by step or overlapped (--overlap, the daemon's default --async-scheduling).

    python tools/dev/bench_host_micro.py loop [--streams 64] [--tokens 64] [--rounds 6]
    python tools/dev/bench_host_micro.py gpu [--rows 64] [--steps 200] [--rounds 7] [--overlap]

Both print the median and the minimum over rounds (the first round of `loop` warms up and is dropped)."""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def tune_like_the_daemon() -> None:
    """The daemon's serving-time interpreter settings (collector, GIL switch interval), where this
    version of the daemon has them, so that both paths run as they would in it."""
    from pegainfer.daemon import runtime
    tune = getattr(runtime, "tune_for_serving", None)
    if tune is not None:
        tune()


async def loop_path(streams: int, tokens: int, rounds: int) -> list[float]:
    from starlette.requests import Request as HTTPRequest

    from pegainfer.daemon.bridge import EngineBridge
    from pegainfer.daemon.completions import create_completion
    from pegainfer.daemon.runtime import Runtime
    from pegainfer.daemon.settings import Settings
    from pegainfer.engine.default_model import ensure_default_model
    from pegainfer.engine.contract import Admit, Finished, StepEvents, StepRecord, Token
    from pegainfer.engine.tokenizer import Tokenizer
    from pegainfer.lifecycle.scheduler import Scheduler
    from pegainfer.telemetry.hub import Telemetry
    from tools.benchkit.workload import PROFILES, make_prompts

    admitted: list[str] = []
    gpu = types.SimpleNamespace(submit=lambda cmd: admitted.append(cmd.request_id) if isinstance(cmd, Admit) else None,
                                snapshot=lambda: None)
    tel = Telemetry()
    # the version under test's own Runtime (whatever per-process parts its handlers read), with the
    # engine replaced by the few attributes the request path reads
    rt = Runtime(Settings(), tel)
    rt.tokenizer, rt.model_name = Tokenizer(ensure_default_model()), "m"
    rt.engine = types.SimpleNamespace(cfg=types.SimpleNamespace(vocab_size=1024), max_model_len=4096,
                                      cache=types.SimpleNamespace(num_slots=streams, page_size=64, num_pages=1 << 20,
                                                                  capacity_tokens=64 << 20))
    rt.bridge = EngineBridge(asyncio.get_running_loop(), types.SimpleNamespace(on_step=tel.on_step))
    rt.scheduler = Scheduler(rt.bridge, max_active=streams, max_pending=streams, observer=tel)
    rt.scheduler.set_ready(True)
    rt.bridge.connect(gpu, rt.scheduler)
    tune_like_the_daemon()

    async def send(message: dict) -> None:
        pass

    step, per_token = 0, []
    for rnd in range(rounds):
        t0 = time.thread_time()
        calls = []
        for p in make_prompts(PROFILES["short"], streams, 0, 64, rnd * streams):
            body = json.dumps({"model": "m", "prompt": p.text, "max_tokens": tokens, "stream": True,
                               "stream_options": {"include_usage": True}, "ignore_eos": True}).encode()
            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive(messages=messages) -> dict:
                if messages:
                    return messages.pop()
                await asyncio.sleep(3600)  # the client never leaves

            scope = {"type": "http", "method": "POST", "path": "/v1/completions", "query_string": b"",
                     "headers": [(b"content-type", b"application/json")]}
            response = await create_completion(HTTPRequest(scope, receive), rt)
            calls.append(asyncio.ensure_future(response(scope, receive, send)))
        await asyncio.sleep(0)
        ids, admitted[:] = list(admitted), []
        for k in range(tokens):
            step += 1
            last = k == tokens - 1
            toks = [Token(rid, 3 + (k * 7 + i) % 900, k == 0, 0, None, (), "length" if last else None)
                    for i, rid in enumerate(ids)]
            record = StepRecord(step=step, phase="decode" if k else "prefill", request_ids=list(ids), rows=len(ids),
                                decode_rows=len(ids) if k else 0, prefill_tokens=0 if k else 100 * len(ids),
                                positions_max=100 + k, started_ns=time.time_ns(), cpu_s=0.008, gpu_s=None,
                                routes_per_rank=[], routes_per_expert=[], collective_calls=0, collective_bytes=0,
                                exchange_s=0.0, kv_slots_used=len(ids))
            rt.bridge.dispatch(StepEvents(toks, [Finished(rid, "length") for rid in ids] if last else [], [], [],
                                          record))
            for _ in range(3):
                await asyncio.sleep(0)  # the streams' tasks run
        await asyncio.wait_for(asyncio.gather(*calls), 60)
        if rnd:
            per_token.append(1e6 * (time.thread_time() - t0) / (streams * tokens))
    tel.shutdown()
    return per_token


def gpu_path(rows: int, steps: int, rounds: int, overlap: bool = False) -> list[float]:
    from pegainfer.engine.default_model import ensure_default_model
    from pegainfer.engine.engine import EngineSpec, build_engine
    from pegainfer.engine.loop import GpuThread
    from pegainfer.engine.contract import Admit
    from tools.benchkit.fake_device import FakeDevice

    engine = build_engine(EngineSpec(model_dir=str(ensure_default_model()), num_slots=rows))
    events: list = []
    gpu = GpuThread(engine, events.append, overlap=overlap)
    FakeDevice(0.0).install(engine.runner)
    for i in range(rows):
        gpu.submit(Admit(f"cmpl-{i:024x}", list(range(5, 105)), steps * (rounds + 1) + 20, True))
    gpu._apply(gpu._drain(False))
    tune_like_the_daemon()
    for _ in range(10):
        gpu.tick()
    per_step = []
    for _ in range(rounds):
        events.clear()
        t0 = time.thread_time()
        for _ in range(steps):
            gpu.tick()
        per_step.append(1e6 * (time.thread_time() - t0) / steps)
    engine.close()
    return per_step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="path", required=True)
    lp = sub.add_parser("loop")
    lp.add_argument("--streams", type=int, default=64)
    lp.add_argument("--tokens", type=int, default=64)
    lp.add_argument("--rounds", type=int, default=6)
    gp = sub.add_parser("gpu")
    gp.add_argument("--rows", type=int, default=64)
    gp.add_argument("--steps", type=int, default=200)
    gp.add_argument("--rounds", type=int, default=7)
    gp.add_argument("--overlap", action="store_true", help="launch each step before reading the one before")
    a = p.parse_args(argv)
    if a.path == "loop":
        v = asyncio.run(loop_path(a.streams, a.tokens, max(a.rounds, 2)))
        print(f"loop path, {a.streams} streams x {a.tokens} tokens: {statistics.median(v):.1f} µs CPU per token "
              f"(median of {len(v)} rounds; min {min(v):.1f})")
    else:
        v = gpu_path(a.rows, a.steps, a.rounds, overlap=a.overlap)
        print(f"GPU thread outside the forward, {a.rows} rows: {statistics.median(v):.0f} µs per step, "
              f"{statistics.median(v) / a.rows:.2f} µs per row (median of {len(v)} rounds; min {min(v):.0f} µs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
