"""The in-process serving replay: a bench_serving workload (the same prompts, output lengths and
closed-loop concurrency) driven straight into the daemon's runtime (the lifecycle scheduler, the
bridge and the GPU thread, the tokenizer pool, telemetry) with no HTTP, no SSE and no client
process. Each request is parsed from the exact body bench_serving sends (tools/benchkit/client.py),
tokenised on the daemon's pool, admitted through the scheduler and read from its token sink, and
its timeline is recorded in the same RequestRecord, so vLLM's metric definitions
(tools/benchkit/metrics.py) apply unchanged: a sink read that brought tokens is one "chunk", as one
wake-up is one SSE event on the HTTP path.

What the replay leaves out is what the HTTP path adds: the client, the socket, uvicorn, starlette,
the SSE encoding and, unless `detokenize` is set, the rendering of text (daemon.choices). The HTTP
tax of a workload is then bench_serving's output tok/s over the replay's, same workload."""
from __future__ import annotations

import time
from collections.abc import Callable

from pegainfer.daemon import protocol
from pegainfer.daemon.choices import Choices
from pegainfer.daemon.completions import context_problem
from pegainfer.daemon.runtime import Runtime
from pegainfer.daemon.shapes import COMPLETION
from pegainfer.lifecycle.rejection import Rejection
from pegainfer.lifecycle.request import Request
from pegainfer.lifecycle.sink import TokenSink
from pegainfer.lifecycle.states import RequestState
from tools.benchkit.client import request_body
from tools.benchkit.metrics import RequestRecord
from tools.benchkit.workload import PromptSpec, closed_loop


async def replay_one(rt: Runtime, prompt: PromptSpec, max_tokens: int, *, detokenize: bool) -> RequestRecord:
    """One request through the runtime as the completions handler runs it, timed from its parse."""
    rec = RequestRecord(index=prompt.index, start=time.perf_counter())
    body = request_body(rt.model_name, prompt.text, max_tokens)
    try:
        req = protocol.parse_completion(body, max_tokens_default=rt.settings.max_tokens_default)
    except protocol.APIError as e:
        rec.error = f"HTTP {e.status}: {e.message}"
        return rec
    ids = await rt.tokenize.encode(rt.tokenizer, req.prompt)
    rid = protocol.completion_id()
    rec.request_id, rec.prompt_tokens = rid, len(ids)
    request = Request(req.admit(rid, ids), rt.model_name, TokenSink(rt.settings.sink_max_buffered))
    rt.telemetry.on_request_start(rid, req, {})
    if (problem := context_problem(rt, ids, req, COMPLETION)) is not None:  # the handler's own refusal
        rt.scheduler.reject(request, problem.message, problem.code)
        rec.error = f"HTTP {problem.status}: {problem.message}"
        return rec
    try:
        rt.scheduler.submit(request)
    except Rejection as r:
        rec.error = f"rejected: {r.message}"
        return rec
    choices = Choices(req, rt.tokenizer, ids) if detokenize else None
    async for item in request.sink:
        now = time.perf_counter()
        if choices is not None:
            choices.feed(item.tokens, item.prompt)
        if item.tokens:
            rec.chunk_times.append(now - rec.start)
            rec.output_tokens += len(item.tokens)
        if item.end is not None:
            if item.end.state is not RequestState.FINISHED:
                rec.error = f"ended {item.end.state.name}: {item.end.message or item.end.reason}"
            break
    rec.usage_reported = True  # the count is the engine's own, as usage.completion_tokens is
    if rec.error is None and not rec.chunk_times:
        rec.error = "no tokens (nothing to time TTFT by)"
    rec.ok = rec.error is None
    return rec


async def replay_level(rt: Runtime, prompts: list[PromptSpec], concurrency: int, max_tokens: int, *,
                       detokenize: bool = False,
                       on_done: Callable[[RequestRecord], None] | None = None,
                       window: list[int] | None = None) -> tuple[list[RequestRecord], float]:
    """Closed loop, as tools/benchkit/client.run_level: `concurrency` workers drain the prompt list.
    Returns the records (in workload order) and the duration (first send to last completion)."""
    async def one(p: PromptSpec) -> RequestRecord:
        return await replay_one(rt, p, max_tokens, detokenize=detokenize)
    return await closed_loop(prompts, concurrency, one, on_done, window)


def http_tax(replay_levels: list[dict], http_report: dict) -> list[dict]:
    """Per concurrency level present in both: HTTP output tok/s over the replay's (medians across
    repeats), and the same for TPOT p50 (replay over HTTP, so that 1.0 is no tax either way)."""
    http = {lv["concurrency"]: lv["summary"] for lv in http_report.get("levels", [])}
    out = []
    for lv in replay_levels:
        h = http.get(lv["concurrency"])
        if h is None:
            continue
        r = lv["summary"]
        out.append({"concurrency": lv["concurrency"],
                    "http_output_throughput": h["output_throughput"]["median"],
                    "replay_output_throughput": r["output_throughput"]["median"],
                    "throughput_ratio": _ratio(h["output_throughput"]["median"], r["output_throughput"]["median"]),
                    "http_median_tpot_ms": h["median_tpot_ms"]["median"],
                    "replay_median_tpot_ms": r["median_tpot_ms"]["median"],
                    "tpot_ratio": _ratio(r["median_tpot_ms"]["median"], h["median_tpot_ms"]["median"])})
    return out


COMPARED = ("profile", "prompt_words", "max_tokens", "seed", "num_requests", "ignore_eos")


def workload_mismatch(replay: dict, http_report: dict) -> list[str]:
    """How a bench_serving report's workload differs from this replay's (both reports' `workload`
    fields): each differing field as "name: theirs there, ours here". The replay sends greedy
    requests only, so a sampled HTTP run differs too. Empty: the same workload."""
    http = http_report.get("workload")
    if not isinstance(http, dict):
        return ["no workload field (not a bench_serving report)"]
    out = [f"{k}: {http[k]!r} there, {replay[k]!r} here" for k in COMPARED if k in http and http[k] != replay[k]]
    sampling = (http.get("sampling") or {}).get("profile", "greedy")
    if sampling != "greedy":
        out.append(f"sampling: {sampling!r} there, greedy here")
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None
