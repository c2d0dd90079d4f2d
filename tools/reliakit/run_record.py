"""Everything one run produced, live or dry: the server it ran against, the baseline output, each
scenario's record, the run-wide checks (baseline, output-hash stability across the whole run, the
final idle baseline, daemon exits) and the verdict that sets the exit status: `fail` when anything
failed, `incomplete` when nothing failed but a check or a scenario was skipped (unless skips are
allowed: --allow-skips), else `pass`."""
from __future__ import annotations

import dataclasses
from typing import Any

from tools.reliakit import observation as o
from tools.reliakit import request_checks as rc
from tools.reliakit.check import FAIL, PASS, SKIP, Check, verdict
from tools.reliakit.limits import Limits
from tools.reliakit.observation import RequestObservation
from tools.reliakit.result import FAILED, PASSED, SKIPPED, ScenarioRun
from tools.reliakit.server_spans import SpanIndex


@dataclasses.dataclass(slots=True)
class RunRecord:
    limits: Limits | None = None
    baseline: RequestObservation | None = None
    scenarios: list[ScenarioRun] = dataclasses.field(default_factory=list)
    run_checks: list[Check] = dataclasses.field(default_factory=list)
    final: Check | None = None
    daemons: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    trace_files: list[str] = dataclasses.field(default_factory=list)
    spans: SpanIndex | None = None
    allow_skips: bool = False  # --allow-skips: a run with skipped checks or scenarios may still pass

    def observations(self) -> list[RequestObservation]:
        out = [self.baseline] if self.baseline is not None else []
        for run in self.scenarios:
            out += run.observations + ([run.follow_up] if run.follow_up is not None else [])
        return out

    def decide(self, spans: SpanIndex | None) -> None:
        """The run-wide checks; call after every scenario is finalized."""
        self.spans = spans
        if self.baseline is not None:
            self.run_checks.insert(0, baseline_check(self.baseline, spans))
            self.run_checks.append(rc.hash_stability(self.observations(), spans))
        if self.final is not None:
            self.run_checks.append(self.final)

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.scenarios if r.status == FAILED] + \
               [f"run:{c.name}" for c in self.run_checks if c.failed]

    def all_checks(self) -> list[tuple[str, Check]]:
        """(where, check) for every check: `scenario` names for a scenario's, `run` for run-wide ones."""
        return [(r.name, c) for r in self.scenarios for c in r.checks] + [("run", c) for c in self.run_checks]

    def check_counts(self) -> dict[str, int]:
        statuses = [c.status for _, c in self.all_checks()]
        return {"total": len(statuses), "passed": statuses.count(PASS), "failed": statuses.count(FAIL),
                "skipped": statuses.count(SKIP)}

    @property
    def skips(self) -> list[str]:
        """What did not run, one line each: skipped scenarios and skipped checks, with the reason."""
        return [f"scenario {r.name}: {r.skip_reason}" for r in self.scenarios if r.status == SKIPPED] + \
               [f"{where}:{c.name}: {c.detail}" for where, c in self.all_checks() if c.status == SKIP]

    @property
    def verdict(self) -> str:
        ran = [r for r in self.scenarios if r.status != SKIPPED]
        if self.failed or self.baseline is None or self.final is None or not ran:
            return "fail"
        return "incomplete" if self.skips and not self.allow_skips else "pass"

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "pass" else 1

    def verdict_line(self) -> str:
        """e.g. `PASS (45 checks, 12 skipped)`, `INCOMPLETE (45 checks, 12 skipped; 5 scenarios skipped)`."""
        n = self.check_counts()
        scenarios = sum(r.status == SKIPPED for r in self.scenarios)
        parts = [f"{n['total']} checks"] + [f"{n[k]} {k}" for k in ("failed", "skipped") if n[k]]
        tail = f"; {scenarios} scenario{'s' if scenarios != 1 else ''} skipped" if scenarios else ""
        return f"{self.verdict.upper()} ({', '.join(parts)}{tail})"

    def to_dict(self) -> dict[str, Any]:
        base = None
        if self.baseline is not None:
            s = rc.span_of(self.baseline, self.spans)
            base = self.baseline.to_dict(s.joined() if s is not None else None)
        return {
            "target": self.limits.to_dict() if self.limits else None,
            "trace_files": self.trace_files,
            "daemons": self.daemons,
            "baseline": base,
            "scenarios": [r.to_dict() for r in self.scenarios],
            "checks": [c.to_dict() for c in self.run_checks],
            "summary": {
                "passed": [r.name for r in self.scenarios if r.status == PASSED],
                "failed": self.failed,
                "skipped": {r.name: r.skip_reason for r in self.scenarios if r.status == SKIPPED},
                "checks": self.check_counts(),
                "skips": self.skips,
                "allow_skips": self.allow_skips,
                "verdict": self.verdict,
                "exit_code": self.exit_code,
            },
        }


def baseline_check(obs: RequestObservation, spans: SpanIndex | None) -> Check:
    """The baseline request completed in full (and, with a trace, has one completed span with an
    output hash): every follow-up is compared with it."""
    e = obs.resolved()
    problems = []
    if obs.outcome != o.COMPLETED or obs.tokens != e.tokens:
        why = obs.note or obs.error or ""
        problems.append(f"baseline {obs.outcome} with {obs.tokens} of {e.tokens} tokens ({why})")
    if spans is not None:
        s = rc.span_of(obs, spans)
        if s is None or s.reason != "completed_length" or not s.attributes.get("pegainfer.output_hash"):
            problems.append(f"baseline span: {s.reason if s else 'missing'}, output hash "
                            f"{s.attributes.get('pegainfer.output_hash') if s else None}")
    ok = f"baseline output {obs.text_sha256 and obs.text_sha256[:12]} ({obs.tokens} tokens)"
    return verdict("baseline", problems, ok, {"text_sha256": obs.text_sha256})
