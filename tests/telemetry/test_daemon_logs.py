"""End to end, from the shared daemon run's stdout and stderr (tests/telemetry/run.py: --access-log,
a 0.2 s stats interval): every line is one JSON object with timestamp, level and logger, uvicorn's
start-up lines included; one access line per HTTP request, carrying the request id a completion
answered with; stats lines with vLLM's fields while the run was busy."""
from __future__ import annotations

import datetime
import json

from tests.telemetry.run import DaemonRun


def lines(run: DaemonRun) -> list[dict]:
    out = []
    for n, text in enumerate(run.log.splitlines(), 1):
        try:
            line = json.loads(text)
        except ValueError:
            raise AssertionError(f"line {n} is not JSON: {text[:300]}") from None
        assert isinstance(line, dict), text
        out.append(line)
    return out


def test_every_line_is_json_with_timestamp_level_and_logger(daemon_run: DaemonRun):
    got = lines(daemon_run)
    assert len(got) > 20
    for line in got:
        assert list(line)[:3] == ["timestamp", "level", "logger"], line
        assert datetime.datetime.fromisoformat(line["timestamp"]).tzinfo is not None
        assert line["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        assert "exception" not in line, line  # a traceback in a server log is a bug
    uvicorn = [x["message"] for x in got if x["logger"].startswith("uvicorn")]
    assert any(m.startswith("Started server process") for m in uvicorn), uvicorn
    assert any(m.startswith("Uvicorn running on") for m in uvicorn), uvicorn
    assert not any("color_message" in x for x in got)
    events = [x["event"] for x in got if x["logger"] == "pegainfer.engine" and "event" in x]
    assert "serving" in events and events[-1] == "stopped"


def test_access_log_has_one_line_per_request_with_its_id(daemon_run: DaemonRun):
    access = [x for x in lines(daemon_run) if x["logger"] == "pegainfer.access"]
    assert access and all(x["event"] == "http_request" for x in access)
    for x in access:
        assert {"method", "path", "status", "duration_ms", "request_id", "client"} <= set(x)
        assert x["duration_ms"] >= 0 and x["client"].startswith("127.0.0.1:")
    completions = [x for x in access if x["path"] == "/v1/completions"]
    by_id = {x["request_id"]: x for x in completions}
    for scenario in ("length", "stop", "cancelled", "failed", "final"):
        assert by_id[daemon_run.ids[scenario]]["status"] == 200, scenario
    assert [x["status"] for x in completions if x["request_id"] is None] == [400]  # the malformed JSON
    assert any(x["path"] == "/metrics" and x["method"] == "GET" for x in access)
    cancels = [x for x in access if x["path"].endswith("/cancel")]
    assert len(cancels) == 1 and cancels[0]["status"] == 200 and cancels[0]["method"] == "POST"


def test_stats_lines_while_serving(daemon_run: DaemonRun):
    stats = [x for x in lines(daemon_run) if x["logger"] == "pegainfer.stats"]
    assert stats and all(x["event"] == "stats" for x in stats)
    keys = {"prompt_tokens_per_s", "generation_tokens_per_s", "running", "waiting", "kv_cache_usage", "preemptions",
            "interval_s"}
    assert all(keys <= set(x) for x in stats)
    busy = [x for x in stats if x["generation_tokens_per_s"] > 0]
    assert busy and any(x["prompt_tokens_per_s"] > 0 for x in stats)
    assert all(0 <= x["kv_cache_usage"] <= 1 and x["preemptions"] == 0 for x in stats)
    assert any(x["running"] >= 1 for x in busy)
