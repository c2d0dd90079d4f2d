"""The reliability runner's no_tracebacks check over the daemons' logs."""
from __future__ import annotations

import json

from tools.reliakit.log_checks import no_tracebacks, tracebacks


def test_a_plain_traceback_fails_the_run_and_is_located(tmp_path):
    clean, bad = tmp_path / "daemon-0.log", tmp_path / "daemon-1.log"
    clean.write_text('{"event": "serving"}\nINFO: Shutting down\n')
    bad.write_text("ok\nERROR:    Exception in ASGI application\nTraceback (most recent call last):\n"
                   '  File "x.py", line 1, in f\nstarlette.requests.ClientDisconnect\n')
    assert no_tracebacks([clean]).status == "pass"
    check = no_tracebacks([clean, bad])
    assert check.status == "fail" and "daemon-1.log:3:" in check.detail and "ClientDisconnect" in check.detail


def test_a_json_line_with_a_stack_is_a_traceback(tmp_path):
    log = tmp_path / "daemon-0.log"
    log.write_text("\n".join([json.dumps({"level": "INFO", "message": "ready", "exc_info": None}),
                              json.dumps({"level": "ERROR", "message": "boom", "exc_info": "Traceback..."}),
                              "{not json"]) + "\n")
    assert [t.split(":")[1] for t in tracebacks(log)] == ["2"]


def test_a_missing_log_has_none(tmp_path):
    assert tracebacks(tmp_path / "absent.log") == []
