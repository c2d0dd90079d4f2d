"""The reliability artifact: --dry-run writes a deterministic artifact that validates against the
schema, --scenarios selects a subset, scenarios that end the server are skipped (with the reason)
under --url, a run with skips is INCOMPLETE (exit 1) unless --allow-skips, the verdict line counts
checks and skips, the schema validator itself rejects broken artifacts, and usage errors exit 2."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools import reliability
from tools.reliakit.artifact import InvalidArtifact, write
from tools.reliakit.scenarios import SCENARIOS
from tools.reliakit.schema import SCHEMA
from tools.reliakit.schema_check import validate

ROOT = Path(__file__).resolve().parents[2]


def dry(tmp_path: Path, *args: str, code: int = 0) -> dict:
    out = tmp_path / "artifact.json"
    assert reliability.main(["--dry-run", "--out", str(out), *args]) == code
    return json.loads(out.read_text())


def test_dry_run_is_schema_valid_and_covers_every_scenario(tmp_path):
    doc = dry(tmp_path, "--spawn", "--backend", "host-staged", "--ep-size", "2")
    assert validate(doc, SCHEMA) == []
    assert [s["name"] for s in doc["scenarios"]] == list(SCENARIOS)
    checks = sum(len(s["checks"]) for s in doc["scenarios"]) + len(doc["checks"])
    assert doc["summary"] == {"passed": list(SCENARIOS), "failed": [], "skipped": {}, "verdict": "pass",
                              "checks": {"total": checks, "passed": checks, "failed": 0, "skipped": 0},
                              "skips": [], "allow_skips": False, "exit_code": 0}
    assert doc["dry_run"] is True and doc["mode"] == "spawn" and doc["artifact"] == "pegainfer-reliability"
    for s in doc["scenarios"]:
        names = [c["name"] for c in s["checks"]]
        assert {"trace_coverage", "trace_fields", "terminal_reasons", "client_outcomes", "no_unexplained_timeouts",
                "output_hash_stability", "follow_up", "scenario_ran"} <= set(names), s["name"]
        # idle_after only where a server is left to be idle: not a skip where the scenario ends it
        assert ("idle_after" in names) is not SCENARIOS[s["name"]].ends_server, s["name"]
        assert all(c["status"] == "pass" for c in s["checks"])
        assert s["trace_coverage"]["missing"] == 0 and s["requests"]
    overload = next(s for s in doc["scenarios"] if s["name"] == "overload_active_cap")
    assert {"active_set_evidence", "pending_queue_evidence", "decode_batch_evidence", "queue_full_seen",
            "nothing_lost"} <= {c["name"] for c in overload["checks"]}
    assert [c["name"] for c in doc["checks"]] == ["baseline", "output_hash_stability", "final_idle"]


def test_dry_run_is_deterministic(tmp_path):
    out = tmp_path / "a.json"
    argv = ["--dry-run", "--spawn", "--allow-skips", "--out", str(out)]
    assert reliability.main(argv) == 0
    first = out.read_bytes()
    assert reliability.main(argv) == 0
    assert out.read_bytes() == first
    assert json.loads(first)["date"] == "2000-01-01T00:00:00+00:00"


def test_scenarios_selects_a_subset_in_registry_order(tmp_path):
    doc = dry(tmp_path, "--spawn", "--scenarios", "invalid_requests,cancel_disconnect")
    assert [s["name"] for s in doc["scenarios"]] == ["cancel_disconnect", "invalid_requests"]
    assert doc["requested"]["scenarios"] == ["cancel_disconnect", "invalid_requests"]


def test_ep1_skips_the_rank_failure_and_url_skips_what_ends_the_server(tmp_path):
    doc = dry(tmp_path, "--spawn", "--allow-skips")
    assert set(doc["summary"]["skipped"]) == {n for n, s in SCENARIOS.items() if s.min_ep_size > 1} >= \
        {"expert_rank_failure", "idle_rank_death", "idle_rank_stall"}
    doc = dry(tmp_path, "--url", "http://127.0.0.1:9", "--allow-skips")
    skipped = doc["summary"]["skipped"]
    assert set(skipped) == {n for n, s in SCENARIOS.items() if s.ends_server} >= \
        {"drain", "double_sigterm", "expert_rank_failure", "idle_rank_death", "idle_rank_stall"}
    assert "needs --spawn" in skipped["drain"] and "needs --spawn" in skipped["double_sigterm"]
    assert validate(doc, SCHEMA) == []


def test_the_schema_rejects_broken_artifacts(tmp_path):
    doc = dry(tmp_path, "--spawn", "--allow-skips")
    for breakage, words in [
        (lambda d: d.pop("summary"), "missing 'summary'"),
        (lambda d: d["scenarios"][0]["requests"][0].update(outcome="fine"), "not in"),
        (lambda d: d["scenarios"][0]["checks"][0].update(status="ok"), "not in"),
        (lambda d: d["scenarios"][0]["requests"][0].update(extra=1), "unexpected 'extra'"),
        (lambda d: d["scenarios"][0]["requests"][0]["expected"].update(tokens="24"), "is not integer"),
        (lambda d: d["summary"].update(exit_code=True), "not in"),
        (lambda d: d["summary"].update(verdict="incomplete-ish"), "not in"),
        (lambda d: d["summary"]["checks"].pop("skipped"), "missing 'skipped'"),
    ]:
        broken = copy.deepcopy(doc)
        breakage(broken)
        problems = validate(broken, SCHEMA)
        assert any(words in p for p in problems), (words, problems)
        with pytest.raises(InvalidArtifact):
            write(broken, tmp_path / "broken.json")


@pytest.mark.parametrize("argv", [
    ["--out", "x.json"],  # neither --url nor --spawn
    ["--spawn", "--url", "http://127.0.0.1:1", "--out", "x.json"],
    ["--spawn", "--out", "x.json", "--scenarios", "no_such_scenario"],
    ["--spawn", "--out", "x.json", "--trace-file", "t.jsonl"],
    ["--url", "http://127.0.0.1:1", "--backend", "nccl", "--out", "x.json"],
    ["--spawn", "--ep-size", "0", "--out", "x.json"],
    ["--url", "http://127.0.0.1:1", "--device", "cuda", "--out", "x.json"],
    ["--spawn", "--model", "m", "--random-preset", "lite", "--out", "x.json"],
])
def test_usage_errors_exit_2(argv):
    with pytest.raises(SystemExit) as e:
        reliability.parse_args(argv)
    assert e.value.code == 2


def test_spawned_daemons_get_the_device_and_preset(tmp_path):
    from tools.reliakit.daemon_pool import DaemonPool
    flags = DaemonPool(tmp_path, None, "host-staged", 2, "cuda", "lite").base_flags
    assert flags == ["--random-preset", "lite", "--backend", "host-staged", "--ep-size", "2", "--device", "cuda"]
    assert "--device" in DaemonPool(tmp_path, "m", "local", 1).base_flags  # cpu by default, said explicitly


def test_runs_as_a_script_from_the_repository_root(tmp_path):
    out = tmp_path / "artifact.json"
    r = subprocess.run([sys.executable, "tools/reliability.py", "--dry-run", "--spawn", "--out", str(out),
                        "--scenarios", "drain"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[-1].startswith("PASS (")
    assert json.loads(out.read_text())["scenarios"][0]["name"] == "drain"


@pytest.mark.parametrize("backend, says", [("nccl", "needs one CUDA GPU per rank"),
                                           ("nccl-over-gloo-test", "is test-only")])
def test_spawn_refuses_a_transport_the_daemons_cannot_run_in_one_line(backend, says, tmp_path, capsys):
    """No daemon starts and no artifact is written for a transport that cannot move the bytes here."""
    out = tmp_path / "r.json"
    assert reliability.main(["--spawn", "--backend", backend, "--ep-size", "2", "--out", str(out)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("reliability: error: ") and says in line and "host-staged" in line
    assert not out.exists()


def test_skips_make_the_run_incomplete_unless_allowed(tmp_path, capsys):
    doc = dry(tmp_path, "--url", "http://127.0.0.1:9", code=1)  # five scenarios need --spawn
    s = doc["summary"]
    assert (s["verdict"], s["exit_code"], s["failed"], s["allow_skips"]) == ("incomplete", 1, [], False)
    assert len(s["skips"]) == 5 and all(x.startswith("scenario ") and "needs --spawn" in x for x in s["skips"])
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"INCOMPLETE ({s['checks']['total']} checks; 5 scenarios skipped): wrote")
    assert any("--allow-skips" in line for line in err)
    doc = dry(tmp_path, "--url", "http://127.0.0.1:9", "--allow-skips")
    assert (doc["summary"]["verdict"], doc["summary"]["allow_skips"]) == ("pass", True)
    assert capsys.readouterr().err.splitlines()[-1].startswith("PASS (")
    assert validate(doc, SCHEMA) == []


def test_skipped_checks_are_counted_and_a_failure_outranks_them():
    from tools.reliakit.check import FAIL, skipped
    from tools.reliakit.dry_run import dry_record
    rec = dry_record(list(SCENARIOS.values()), "host-staged", 2, spawn=True)
    total = rec.check_counts()["total"]
    assert (rec.verdict, rec.verdict_line()) == ("pass", f"PASS ({total} checks)")
    for run in rec.scenarios[:2]:  # as a run without the trace file records them
        run.checks[0] = skipped(run.checks[0].name, "no trace file (--trace-file): the server's records were not read")
    assert rec.verdict == "incomplete" and rec.exit_code == 1
    assert rec.verdict_line() == f"INCOMPLETE ({total} checks, 2 skipped)"
    assert len(rec.skips) == 2 and rec.skips[0].startswith(f"{rec.scenarios[0].name}:{rec.scenarios[0].checks[0].name}:")
    rec.allow_skips = True
    assert (rec.verdict, rec.exit_code, rec.verdict_line()) == ("pass", 0, f"PASS ({total} checks, 2 skipped)")
    rec.scenarios[2].checks[0].status = FAIL
    rec.scenarios[2].status = "failed"
    assert (rec.verdict, rec.exit_code) == ("fail", 1)
    assert rec.verdict_line() == f"FAIL ({total} checks, 1 failed, 2 skipped)"


def _script_calls() -> list[tuple[str, list[str]]]:
    """Every `tools/reliability.py ...` call in the shell scripts under tools/, its arguments as parsed."""
    import re
    import shlex
    calls = []
    for script in sorted((ROOT / "tools").rglob("*.sh")):
        text = script.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if "tools/reliability.py" in line and not line.lstrip().startswith("#"):
                args = line.split("tools/reliability.py", 1)[1]
                args = re.split(r"\s(?:2>&1|\||>|;|&&)", args)[0]
                calls.append((script.name, shlex.split(args)))
    return calls


def test_the_scripts_that_run_the_gate_accept_exactly_the_skips_they_expect():
    calls = _script_calls()
    assert {name for name, _ in calls} >= {"h200_gate.sh", "h200_invariance.sh"}
    for name, args in calls:
        a = reliability.parse_args(args)  # every flag a script passes still exists
        if a.url:
            expected = any(s.ends_server for s in a.selected)
        else:
            expected = any(s.min_ep_size > a.ep_size for s in a.selected)
        assert a.allow_skips == expected, (name, args)
