"""One real daemon run shared by the end-to-end telemetry tests: `pegainfer serve` on the tiny
model (CPU) with a trace file, the debug hooks and /debug/traces, the access log and a short stats
interval, driven through every way a request can end, with /metrics scraped before, twice during
one long stream and after (with /ready), then stopped with SIGTERM.
The tests only read the DaemonRun it returns."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.daemon_process import DaemonProcess
from tools.traceview import reader as trace_reader

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
FRONT_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
FRONT_PARENT_SPAN_ID = "b7ad6b7169203331"
STOP_PROMPT = [12]  # the random tiny preset's (seed 0) greedy output from this prompt ends with EOS after 6 tokens
BATCH_TOKENS = (20, 24, 28, 32)  # four at once; the shortest outlasts the arrival of the other three
LONG = {"max_tokens": 3000, "ignore_eos": True, "stream": True}  # still running when the test acts on it
LATER_CHUNKS = 8  # chunks of the long stream read between two scrapes of /metrics
STATS_INTERVAL_S = 0.2  # --log-stats-interval: several stats lines while the run is busy


@dataclasses.dataclass
class DaemonRun:
    trace_path: Path
    ids: dict[str, str]  # scenario -> request id
    finish: dict[str, str]  # scenario -> the API's finish_reason
    metrics_before: str
    metrics_during: str  # while one long stream runs
    metrics_later: str  # the same stream, some tokens later, still running
    metrics_after: str
    ready_after: dict  # GET /ready beside metrics_after
    debug_traces: str  # GET /debug/traces just before SIGTERM
    exit_code: int
    log: str
    seconds: float

    def lines(self) -> list[dict]:
        return [json.loads(x) for x in self.trace_path.read_text().splitlines() if x.strip()]

    def spans(self) -> list[trace_reader.SpanRecord]:
        return trace_reader.parse_lines(self.trace_path.read_text())


def _first_chunk(response: httpx.Response) -> tuple[str, Iterator[str]]:
    """Read SSE lines up to the first data chunk: the request id (from the header) and the rest."""
    lines = response.iter_lines()
    for line in lines:
        if line.startswith("data: {"):
            break
    return response.headers["x-request-id"], lines


def _drain(lines: Iterator[str]) -> list[str]:
    return [line for line in lines if line.startswith("data:")]


def _wait(url: str, key: str, at_least: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(url + "/ready").json()["scheduler"][key] >= at_least:
            return
        time.sleep(0.02)
    raise TimeoutError(f"scheduler counter {key} did not reach {at_least}")


def run_daemon(tmp: Path) -> DaemonRun:
    t0 = time.monotonic()
    trace_path = tmp / "trace.jsonl"
    from pegainfer.engine.default_model import ensure_default_model  # the random tiny preset: STOP_PROMPT's EOS
    daemon = DaemonProcess("--model", str(ensure_default_model()), "--trace-file", str(trace_path), "--debug-hooks", "--debug-traces", "--max-active", "2",
                           "--access-log", "--log-stats-interval", str(STATS_INTERVAL_S),
                           log_path=tmp / "daemon.log").start()
    ids: dict[str, str] = {}
    finish: dict[str, str] = {}
    try:
        url = daemon.url
        c = httpx.Client(base_url=url, timeout=30.0, limits=httpx.Limits(max_connections=8))
        before = c.get("/metrics").text
        # completed: a length-limited request carrying a traceparent, and one that stops on EOS
        r = c.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 8},
                   headers={"traceparent": TRACEPARENT})
        ids["length"], finish["length"] = r.json()["id"], r.json()["choices"][0]["finish_reason"]
        r = c.post("/v1/completions", json={"prompt": STOP_PROMPT, "max_tokens": 16})
        ids["stop"], finish["stop"] = r.json()["id"], r.json()["choices"][0]["finish_reason"]
        # four at once with two KV slots: two queue, and the engine batches them
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            bodies = [{"prompt": f"Request number {i} says", "max_tokens": BATCH_TOKENS[i], "ignore_eos": True}
                      for i in range(4)]
            posts = [pool.submit(c.post, "/v1/completions", json=b) for b in bodies]
            for i, post in enumerate(posts):
                ids[f"batch{i}"] = post.result().json()["id"]
        # cancelled through the API mid-stream; metrics scraped while it runs
        with httpx.Client(base_url=url, timeout=30.0) as s, s.stream("POST", "/v1/completions",
                                                                      json={"prompt": "cancel me", **LONG}) as resp:
            ids["cancelled"], rest = _first_chunk(resp)
            during = c.get("/metrics").text
            for _ in range(LATER_CHUNKS):
                next(line for line in rest if line.startswith("data: {"))
            later = c.get("/metrics").text
            assert c.post(f"/v1/completions/{ids['cancelled']}/cancel").status_code == 200
            assert _drain(rest)[-1] == "data: [DONE]"
        # disconnected: the client closes the stream after the first chunk
        with httpx.Client(base_url=url, timeout=30.0) as s, s.stream("POST", "/v1/completions",
                                                                      json={"prompt": "leave me", **LONG}) as resp:
            ids["disconnected"], _ = _first_chunk(resp)
        _wait(url, "disconnected", 1)
        # failed: the debug hook fails the running request
        with httpx.Client(base_url=url, timeout=30.0) as s, s.stream("POST", "/v1/completions",
                                                                      json={"prompt": "fail me", **LONG}) as resp:
            ids["failed"], rest = _first_chunk(resp)
            assert c.post(f"/debug/fail/{ids['failed']}").status_code == 200
            assert _drain(rest)[-1] == "data: [DONE]"
        # rejected: malformed JSON at the front (with a traceparent), and over the context limit
        r = c.post("/v1/completions", content=b'{"prompt": "x", ', headers={"traceparent": (
            f"00-{FRONT_TRACE_ID}-{FRONT_PARENT_SPAN_ID}-01"), "content-type": "application/json"})
        assert r.status_code == 400, r.text
        r = c.post("/v1/completions", json={"prompt": "too long", "max_tokens": 100_000})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        # the last request right before SIGTERM: its spans can only reach the file through the flush
        r = c.post("/v1/completions", json={"prompt": "last one", "max_tokens": 4})
        ids["final"] = r.json()["id"]
        after = c.get("/metrics").text
        ready_after = c.get("/ready").json()
        debug = c.get("/debug/traces").text
        c.close()
        daemon.signal(signal.SIGTERM)
        code = daemon.wait(60)
    finally:
        daemon.stop()
    return DaemonRun(trace_path, ids, finish, before, during, later, after, ready_after, debug, code, daemon.log(),
                     time.monotonic() - t0)
