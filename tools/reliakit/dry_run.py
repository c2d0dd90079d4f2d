"""--dry-run: the artifact a passing run would write, without a server. Every selected scenario's
planned requests are given the outcome they expect, with fixed ids, times and hashes and matching
request spans, and then go through the same strict rules as a live run; the result is
deterministic and schema-valid."""
from __future__ import annotations

import hashlib

from pegainfer.daemon.settings import Settings
from tools.reliakit import observation as o
from tools.reliakit import server_checks as sc
from tools.reliakit.check import PASS, Check
from tools.reliakit.limits import Limits
from tools.reliakit.observation import RequestObservation
from tools.reliakit.result import SKIPPED, ScenarioRun
from tools.reliakit.run_record import RunRecord
from tools.reliakit.scenario import SHARED_FLAGS, Scenario
from tools.reliakit.server_spans import RootSpan, SpanIndex
from tools.reliakit.workload import follow_up

MODEL = "dry-run-model"
MATURITY = "dry-run"
IDLE = {"scheduler": {"running": 0, "waiting": 0}, "engine": {"running": 0, "waiting": 0},
        "kv_slots_free": 4, "kv_slots_total": 4, "kv_pages": {"free": 64, "in_use": 0, "total": 64, "page_size": 64}}


def _hex(text: str, n: int = 64) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _limits(flags: tuple[str, ...], backend: str, ep_size: int) -> Limits:
    f = dict(zip(flags[::2], flags[1::2]))
    return Limits(MODEL, backend, MATURITY, ep_size, int(f.get("--max-active", 4)), int(f.get("--max-pending", 8)),
                  int(f.get("--max-model-len", 512)), int(f.get("--max-body-bytes", Settings().max_body_bytes)))


def _fabricate(x: RequestObservation, where: str, n: int, limits: Limits, spans: SpanIndex) -> None:
    """Give `x` the outcome it expects and a matching request span."""
    e = x.expect
    x.trace_id = _hex(f"{where}/{x.label}", 32)
    x.status, x.outcome, x.tokens = e.status, e.outcome, e.tokens
    x.start_s, x.end_s = round(0.01 * n, 3), round(0.01 * n + 0.5, 3)
    accepted = e.status == 200 or "rejected" not in e.server_reasons  # it ran, whatever its end
    if accepted:
        x.request_id = f"cmpl-dryrun{n:04x}"
        x.first_token_s = round(x.start_s + 0.05, 3)
    if e.outcome == o.COMPLETED:
        x.text, x.finish_reason, x.done = f"dry-run output of {x.kind or x.label}", "length", True
    if e.outcome in (o.HTTP_ERROR, o.ERROR_CHUNK):
        message = {"engine_failed": "expert rank 1 failed; the engine stopped while running this request",
                   "not_ready": "server not ready: expert rank 1 failed"}.get(e.error_code, "dry run")
        x.error = {"message": message, "type": "invalid_request_error", "param": None, "code": e.error_code}
        x.error_body, x.done = {"error": x.error}, e.outcome == o.ERROR_CHUNK
    x.retry_after = "1" if e.retry_after else None
    x.text_sha256 = hashlib.sha256(x.text.encode()).hexdigest()
    a = {"gen_ai.operation.name": "text_completion", "pegainfer.terminal_reason": e.server_reasons[0],
         "pegainfer.backend": limits.backend, "pegainfer.backend_maturity": limits.maturity}
    if accepted:
        a.update({"gen_ai.response.id": x.request_id, "gen_ai.usage.output_tokens": x.tokens or 1,
                  "pegainfer.output_hash": _hex(f"ids of {x.kind or x.label}"),
                  "pegainfer.active_set_size_max": limits.max_active,
                  "pegainfer.decode_batch_size_max": min(2, limits.max_active),
                  "pegainfer.pending_depth_at_admit": 1 if "queue_" in x.label else 0,
                  "pegainfer.queue_s": 0.1 if "queue_" in x.label else 0.0})
    else:
        a["http.response.status_code"] = e.status
    spans[x.trace_id] = [RootSpan(x.trace_id, x.trace_id[:16], f"text_completion {MODEL}", a)]


def _scenario(s: Scenario, backend: str, ep_size: int, spawn: bool, spans: SpanIndex, n: int) -> ScenarioRun:
    run = ScenarioRun(s.name, s.description)
    limits = _limits(s.flags, backend, ep_size)
    reason = s.skip_reason(limits, spawn)
    if reason is not None:
        run.status, run.skip_reason = SKIPPED, reason
        return run
    run.limits, run.duration_s = limits, 1.0
    run.server = {"url": "http://127.0.0.1:0", "daemon": None, "flags": list(s.flags) if spawn else None}
    run.observations = s.plan(limits)
    for i, x in enumerate(run.observations):
        _fabricate(x, s.name, n + i, limits, spans)
    run.follow_up = follow_up(MODEL)
    _fabricate(run.follow_up, s.name, n + len(run.observations), limits, spans)
    ends = s.ends_server
    run.probe = {"samples": 10, "running_max": limits.max_active, "waiting_max": 1 if s.requires(limits).get(
        "pending_queue") else 0, "decode_batch_max": min(2, limits.max_active),
                 "statuses": {"200": 8, "503": 2} if ends else {"200": 10}, "first_503_s": 1.2 if ends else None}
    run.facts = s.dry_facts(run.observations, limits)
    run.checks = [Check("scenario_ran", PASS, "the scenario drove all its requests")]
    if not ends:  # a scenario that ends its server has no idle_after (runner.py)
        run.checks.append(sc.idle("idle_after", 200, IDLE))
    return run


def dry_record(scenarios: list[Scenario], backend: str, ep_size: int, spawn: bool) -> RunRecord:
    spans: SpanIndex = {}
    rec = RunRecord(limits=_limits(SHARED_FLAGS, backend, ep_size))
    rec.baseline = follow_up(MODEL, "baseline")
    _fabricate(rec.baseline, "run", 0, rec.limits, spans)
    for i, s in enumerate(scenarios):
        rec.scenarios.append(_scenario(s, backend, ep_size, spawn, spans, 100 * (i + 1)))
    rec.final = sc.idle("final_idle", 200, IDLE)
    for run, s in zip(rec.scenarios, scenarios):
        run.finalize(s, rec.baseline, spans)
    rec.decide(spans)
    return rec
