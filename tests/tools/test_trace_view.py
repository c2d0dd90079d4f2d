"""tools/trace_view.py on the real daemon run's trace: the HTML page in headless Chromium (DOM
rows for requests and engine steps, a screenshot), the CLI filters, a URL source, Perfetto JSON."""
from __future__ import annotations

import functools
import http.server
import json
import shutil
import struct
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.tools.browser import dump_dom, rows, screenshot
from tests.telemetry.run import DaemonRun

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "trace_view.py"
REASONS = {"completed_length": 6, "completed_stop": 1, "cancelled": 1, "disconnected": 1, "failed": 1, "rejected": 2}


def view(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=60, cwd="/")


@pytest.fixture(scope="module")
def page(daemon_run: DaemonRun, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("view") / "trace.html"
    proc = view(str(daemon_run.trace_path), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{out}: 12 requests, {_step_count(daemon_run)} engine steps (html)"
    return out


def _step_count(run: DaemonRun) -> int:
    return sum(1 for s in run.spans() if s.name.startswith("engine_step "))


def test_page_is_self_contained(page: Path):
    text = page.read_text()
    assert "<script src" not in text and "<link" not in text and "http://" not in text and "https://" not in text
    assert text.count("<html") == 1


def test_dom_has_a_row_per_request_and_per_engine_step(daemon_run: DaemonRun, page: Path, tmp_path: Path):
    dom = rows(dump_dom(page, tmp_path / "profile"))
    assert Counter(r["data-terminal-reason"] for r in dom.requests) == REASONS
    by_id = {r["data-request-id"]: r for r in dom.requests}
    for scenario, reason in (("failed", "failed"), ("cancelled", "cancelled"), ("disconnected", "disconnected"),
                             ("stop", "completed_stop"), ("length", "completed_length")):
        assert by_id[daemon_run.ids[scenario]]["data-terminal-reason"] == reason
    assert len(dom.steps) == _step_count(daemon_run)
    assert {s["data-phase"] for s in dom.steps} >= {"prefill", "decode"}
    shared = [s for s in dom.steps if s["data-phase"] == "decode" and len(s["data-request-ids"].split()) == 2]
    assert shared and all(set(s["data-request-ids"].split()) <= set(by_id) for s in shared)
    # the script ran: bars are laid out and the filter summary is filled in
    assert dom.styled_bars >= 3 * 8
    assert dom.text["shown-count"] == "12 of 12 requests shown"


def test_screenshot_for_a_person(daemon_run: DaemonRun, page: Path, tmp_path: Path):
    shot = tmp_path / "trace_view.png"
    screenshot(page, shot, tmp_path / "profile", fragment=f"#request={daemon_run.ids['batch3']}")
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (1400, 900)
    assert shot.stat().st_size > 20_000
    (ROOT / "artifacts").mkdir(exist_ok=True)
    shutil.copy(shot, ROOT / "artifacts" / "trace_view.png")


def test_reason_and_time_filters(daemon_run: DaemonRun, tmp_path: Path):
    out = tmp_path / "f.html"
    assert view(str(daemon_run.trace_path), "--out", str(out), "--reason", "failed").returncode == 0
    wrong = view(str(daemon_run.trace_path), "--out", str(out), "--reason", "failed,length")  # OpenAI's word, not ours
    assert wrong.returncode == 2 and "'length' is not a terminal reason (one of completed_length" in wrong.stderr
    dom = rows(out.read_text())
    assert [r["data-request-id"] for r in dom.requests] == [daemon_run.ids["failed"]]
    assert dom.steps and all(daemon_run.ids["failed"] in s["data-request-ids"].split() for s in dom.steps)
    assert view(str(daemon_run.trace_path), "--out", str(out), "--reason", "cancelled,disconnected",
                "--reason", "rejected").returncode == 0
    assert Counter(r["data-terminal-reason"] for r in rows(out.read_text()).requests) == {
        "cancelled": 1, "disconnected": 1, "rejected": 2}
    # a window from the failed request's start to its end keeps it and drops the first request
    failed = next(s for s in daemon_run.spans() if s.attributes.get("gen_ai.response.id") == daemon_run.ids["failed"])
    since, until = _iso(failed.start_ns), _iso(failed.end_ns)
    assert view(str(daemon_run.trace_path), "--out", str(out), "--since", since, "--until", until).returncode == 0
    kept = {r["data-request-id"] for r in rows(out.read_text()).requests}
    assert daemon_run.ids["failed"] in kept and daemon_run.ids["length"] not in kept


def _iso(ns: int) -> str:
    import datetime
    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).isoformat(timespec="microseconds")


def test_perfetto_trace_events(daemon_run: DaemonRun, tmp_path: Path):
    out = tmp_path / "trace.json"
    assert view(str(daemon_run.trace_path), "--out", str(out), "--format", "perfetto").returncode == 0
    events = json.loads(out.read_text())["traceEvents"]
    for e in events:
        assert e["ph"] in ("X", "i", "M", "s", "f") and isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["name"]
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[1] == "engine steps" and len(names) == 1 + 12
    assert sum(e["ph"] == "X" and e["tid"] == 1 for e in events) == _step_count(daemon_run)
    rid = daemon_run.ids["length"]
    tid = next(t for t, n in names.items() if n.startswith(rid))
    mine = [e for e in events if e["tid"] == tid and e["ph"] == "X"]
    root = next(e for e in mine if e["cat"] == "request")
    assert {e["name"] for e in mine if e["cat"] == "phase"} == {"queue", "prefill", "decode"}
    for e in mine:  # phases nest inside the request's slice
        assert root["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= root["ts"] + root["dur"] + 1
    assert any(e["ph"] == "i" and e["tid"] == tid and e["name"] == "first_token" for e in events)


def test_reads_a_url(daemon_run: DaemonRun, tmp_path: Path):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(daemon_run.trace_path.parent))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{daemon_run.trace_path.name}"
        proc = view(url, "--out", str(tmp_path / "u.html"), "--reason", "completed_stop")
        assert proc.returncode == 0, proc.stderr
        kept = rows((tmp_path / "u.html").read_text()).requests
        assert [r["data-request-id"] for r in kept] == [daemon_run.ids["stop"]]
    finally:
        server.shutdown()
        server.server_close()


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path):
    proc = view(str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x.html"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("trace_view: error:")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    proc = view(str(bad), "--out", str(tmp_path / "x.html"))
    assert proc.returncode == 2 and "line 1" in proc.stderr
    proc = view(str(bad), "--out", str(tmp_path / "x.html"), "--since", "yesterday")
    assert proc.returncode == 2 and "ISO 8601" in proc.stderr


def test_perfetto_flows_from_each_request_to_its_engine_steps(daemon_run: DaemonRun, tmp_path: Path):
    """Chrome trace-event flow events: per (request, step) one "s" on the request's track inside its
    slice and one "f" (binding to the enclosing slice) inside that step's slice on the engine track."""
    from tools.traceview import reader
    out = tmp_path / "trace.json"
    assert view(str(daemon_run.trace_path), "--out", str(out), "--format", "perfetto").returncode == 0
    events = json.loads(out.read_text())["traceEvents"]
    requests, _ = reader.build(reader.load(str(daemon_run.trace_path)))
    names = {e["args"]["name"].split(" ")[0]: e["tid"] for e in events if e.get("name") == "thread_name"}
    steps = {e["args"]["pegainfer.step.index"]: e for e in events if e["ph"] == "X" and e["cat"] == "engine_step"}
    roots = {e["tid"]: e for e in events if e["ph"] == "X" and e["cat"] == "request"}
    starts = [e for e in events if e["ph"] == "s"]
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len(ends) == sum(len(r.steps) for r in requests) > 0
    assert len({e["id"] for e in starts}) == len(starts)  # one id per pair
    for r in requests:
        tid = names[r.request_id]
        mine = [e for e in starts if e["tid"] == tid]
        assert sorted(e["args"]["step"] for e in mine) == sorted(r.steps), r.request_id
        root = roots[tid]
        for s in mine:
            f = ends[s["id"]]
            step = steps[s["args"]["step"]]
            assert f["tid"] == 1 and f["bp"] == "e" and f["cat"] == s["cat"] == "flow" and f["name"] == s["name"]
            assert step["ts"] <= f["ts"] <= step["ts"] + step["dur"]  # inside the step it points at
            assert root["ts"] <= s["ts"] <= root["ts"] + root["dur"]  # inside the request it leaves
            assert r.request_id in step["args"]["request_ids"]
    batch = [r for r in requests if len(r.steps) > 1]
    assert batch, "no request took part in more than one step"
