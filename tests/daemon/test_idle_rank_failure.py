"""A real daemon (host-staged, ep 2, the tiny model on CPU) whose expert rank dies or stops while no
request is running: /ready and /health turn 503 within the documented bound (1 s after a death,
the rank timeout plus 0.5 s after a stop), a new request is refused with 503 and a message naming
the rank (not accepted, then failed), and the daemon exits 1 so a supervisor restarts it."""
from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from tests.daemon_process import DaemonProcess

pytestmark = pytest.mark.slow

RANK_TIMEOUT_S = 2.0
STALL_SLACK_S = 0.5
EXIT_WITHIN_S = 10.0  # after the failure is noticed: 0.5 s for error chunks, then the ranks are stopped


def _rank_pid(d: DaemonProcess, rank: int = 1) -> int:
    """The expert rank's pid, from the daemon's `expert_rank_ready` log line."""
    for line in d.log().splitlines():
        start = line.find("{")
        if '"expert_rank_ready"' in line and start >= 0:
            event = json.loads(line[start:])
            if event["rank"] == rank:
                return int(event["pid"])
    raise AssertionError(f"no expert_rank_ready line for rank {rank}:\n{d.log()[-2000:]}")


def _seconds_until_not_ready(http: httpx.Client, t0: float, limit_s: float) -> float:
    while time.monotonic() - t0 < limit_s:
        if http.get("/ready").status_code == 503:
            return time.monotonic() - t0
        time.sleep(0.01)
    raise AssertionError(f"/ready still 200 {limit_s:g} s after the signal")


def _assert_refused_naming_the_rank(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, "stream": True})
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "not_ready" and "expert rank 1" in err["message"], err
    assert "RankFailure" not in err["message"] and "exited" not in err["message"], err  # server text stays in the log
    health = http.get("/health")
    assert health.status_code == 503 and "expert rank 1" in health.json()["error"]


def _daemon(tiny_model_dir) -> DaemonProcess:
    return DaemonProcess("--model", str(tiny_model_dir), "--backend", "host-staged", "--ep-size", "2",
                         "--rank-timeout", str(RANK_TIMEOUT_S), "--max-model-len", "256").start()


def test_idle_rank_killed_ready_503_within_a_second_then_exit_1(tiny_model_dir):
    d = _daemon(tiny_model_dir)
    try:
        # the spawned rank writes its own lines as rank 0 does (JSON: timestamp, level, logger first)
        ready = next(json.loads(x) for x in d.log().splitlines() if '"expert_rank_ready"' in x)
        assert list(ready)[:3] == ["timestamp", "level", "logger"] and ready["logger"] == "pegainfer.ep", ready
        assert ready["pid"] != d.proc.pid
        with httpx.Client(base_url=d.url, timeout=10) as http:
            time.sleep(RANK_TIMEOUT_S + 0.5)  # idle past the rank timeout: still ready
            assert http.get("/ready").status_code == 200
            os.kill(_rank_pid(d), signal.SIGKILL)
            t0 = time.monotonic()
            assert _seconds_until_not_ready(http, t0, 10.0) < 1.0
            _assert_refused_naming_the_rank(http)
        assert d.wait(EXIT_WITHIN_S) == 1
        assert time.monotonic() - t0 < 1.0 + EXIT_WITHIN_S
        assert "Traceback" not in d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


def test_idle_rank_stopped_ready_503_within_the_rank_timeout_then_exit_1(tiny_model_dir):
    d = _daemon(tiny_model_dir)
    pid = _rank_pid(d)
    try:
        with httpx.Client(base_url=d.url, timeout=10) as http:
            os.kill(pid, signal.SIGSTOP)
            t0 = time.monotonic()
            took = _seconds_until_not_ready(http, t0, RANK_TIMEOUT_S + 10.0)
            assert RANK_TIMEOUT_S - 0.3 <= took <= RANK_TIMEOUT_S + STALL_SLACK_S
            _assert_refused_naming_the_rank(http)
        assert d.wait(EXIT_WITHIN_S) == 1
        assert "Traceback" not in d.log()
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):  # never leave a stopped process behind
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
        if d.proc.poll() is None:
            d.proc.kill()
