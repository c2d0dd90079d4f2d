"""The access log, on the real app in process: off by default (no line at all); with --access-log one
JSON line per HTTP request (method, path without its query, status, duration, request id, client),
never the API key; a handler that raises still gets its line (status 500). And the setting's flag."""
from __future__ import annotations

import json
import logging

import pytest
from starlette.testclient import TestClient

from pegainfer.daemon import access
from pegainfer.daemon.app import build_app
from pegainfer.daemon.runtime import Runtime
from pegainfer.daemon.settings import Settings, SettingsError, add_flags, resolve
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.telemetry.hub import Telemetry
from tests.lifecycle.fakes import FakeEngine, make_request

KEY = "s3cret-key-never-logged"


def client(access_log: bool) -> TestClient:
    rt = Runtime(Settings(model="/nonexistent", api_key=KEY, access_log=access_log), Telemetry())
    rt.scheduler = Scheduler(FakeEngine(), max_active=2, max_pending=2)
    rt.scheduler.set_ready(True)
    request = make_request("cmpl-" + "a" * 32)
    request.owner = access.identity({"authorization": f"Bearer {KEY}"}, KEY)
    rt.scheduler.submit(request)
    return TestClient(build_app(rt), raise_server_exceptions=False)


def access_lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "pegainfer.access"]


def drive(c: TestClient) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    assert c.get("/health?token=" + KEY).status_code == 200  # a query string is never logged
    assert c.post("/v1/completions", json={"prompt": "x"}).status_code == 401
    assert c.post(f"/v1/completions/cmpl-{'a' * 32}/cancel", headers=auth).status_code == 200
    assert c.get("/nope", headers=auth).status_code == 404


def test_access_log_is_off_by_default(caplog):
    caplog.set_level(logging.INFO)
    assert Settings().access_log is False
    drive(client(access_log=False))
    assert access_lines(caplog) == []


def test_one_line_per_request_without_the_key(caplog):
    caplog.set_level(logging.INFO)
    drive(client(access_log=True))
    lines = access_lines(caplog)
    assert [(x["method"], x["path"], x["status"]) for x in lines] == [
        ("GET", "/health", 200), ("POST", "/v1/completions", 401),
        ("POST", f"/v1/completions/cmpl-{'a' * 32}/cancel", 200), ("GET", "/nope", 404)]
    for x in lines:
        assert x["event"] == "http_request" and x["duration_ms"] >= 0 and x["client"]
        assert set(x) == {"event", "method", "path", "status", "duration_ms", "request_id", "client"}
    assert not any(KEY in r.getMessage() for r in caplog.records if r.name.startswith("pegainfer"))


def test_a_handler_that_raises_still_gets_its_line(caplog):
    caplog.set_level(logging.INFO)
    rt = Runtime(Settings(model="/nonexistent", access_log=True), Telemetry())

    def broken(*args, **kw):
        raise RuntimeError("bug")

    rt.telemetry.render_metrics = broken
    assert TestClient(build_app(rt), raise_server_exceptions=False).get("/metrics").status_code == 500
    [line] = [x for x in access_lines(caplog) if x["path"] == "/metrics"]
    assert line["status"] == 500


def test_the_settings_flags():
    import argparse
    p = argparse.ArgumentParser()
    add_flags(p)
    s = resolve(p.parse_args(["--access-log", "--log-stats-interval", "2.5"]), environ={})
    assert s.access_log is True and s.log_stats_interval == 2.5
    assert resolve(p.parse_args([]), environ={}).log_stats_interval == 10.0
    assert resolve(p.parse_args(["--log-stats-interval", "0"]), environ={}).log_stats_interval == 0
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(SettingsError, match="log_stats_interval"):
            resolve(p.parse_args(["--log-stats-interval", bad]), environ={})
