"""One scenario's record in the artifact: its requests (each joined with its server span), counts by
client outcome and by server terminal reason, output hashes per request kind, trace coverage,
active/pending/decode-batch maxima, the follow-up, and every check with its verdict. `finalize`
runs the strict rules once the trace files can be read."""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from tools.reliakit import request_checks as rc
from tools.reliakit import server_checks as sc
from tools.reliakit.check import Check
from tools.reliakit.limits import Limits
from tools.reliakit.observation import RequestObservation
from tools.reliakit.scenario import Scenario
from tools.reliakit.server_spans import SpanIndex

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclasses.dataclass(slots=True)
class ScenarioRun:
    name: str
    description: str
    status: str = PASSED
    skip_reason: str | None = None
    server: dict[str, Any] = dataclasses.field(default_factory=dict)
    limits: Limits | None = None
    observations: list[RequestObservation] = dataclasses.field(default_factory=list)
    follow_up: RequestObservation | None = None
    probe: dict[str, Any] = dataclasses.field(default_factory=dict)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    checks: list[Check] = dataclasses.field(default_factory=list)  # decided while the server was up
    duration_s: float | None = None
    spans: SpanIndex | None = None

    def finalize(self, scenario: Scenario, baseline: RequestObservation | None, spans: SpanIndex | None) -> None:
        """Add the strict rules that need the trace, the scenario's own checks, and the status."""
        self.spans = spans
        if self.status == SKIPPED:
            return
        everything = self.observations + ([self.follow_up] if self.follow_up is not None else [])
        backend = self.limits.backend if self.limits else None
        maturity = self.limits.maturity if self.limits else None
        self.checks += [
            rc.trace_coverage(everything, spans),
            rc.trace_fields(everything, spans, backend, maturity),
            rc.terminal_reasons(everything, spans),
            rc.client_outcomes(self.observations),
            rc.timeouts(everything),
            rc.hash_stability(everything, spans),
        ]
        if self.limits is not None:
            seen = sc.maxima(self.observations, spans, self.probe)
            for kind, (at_least, at_most) in scenario.requires(self.limits).items():
                self.checks.append(sc.evidence(kind, seen[kind], at_least=at_least, at_most=at_most))
            self.checks += scenario.checks(self.observations, self.facts, self.limits)
        self.checks.append(sc.follow_up(baseline, self.follow_up, spans))
        self.status = FAILED if any(c.failed for c in self.checks) else PASSED

    def to_dict(self) -> dict[str, Any]:
        spans = self.spans
        everything = self.observations + ([self.follow_up] if self.follow_up is not None else [])
        reasons: Counter[str] = Counter()
        for x in self.observations:
            s = rc.span_of(x, spans)
            if s is not None:
                reasons[s.reason] += 1
        coverage = None
        if spans is not None and self.status != SKIPPED:
            counts = [len(rc.terminal_spans(x, spans)) for x in everything if x.sent]
            coverage = {"requests": len(counts), "exactly_one": counts.count(1), "missing": counts.count(0),
                        "duplicated": sum(1 for n in counts if n > 1)}
        return {
            "name": self.name, "description": self.description, "status": self.status,
            "skip_reason": self.skip_reason, "server": self.server,
            "limits": self.limits.to_dict() if self.limits else None,
            "duration_s": self.duration_s,
            "outcomes": dict(sorted(Counter(x.outcome for x in self.observations).items())),
            "terminal_reasons": dict(sorted(reasons.items())) if spans is not None and self.status != SKIPPED else None,
            "hashes": rc.hash_groups(everything, spans),
            "trace_coverage": coverage,
            "maxima": sc.maxima(self.observations, spans, self.probe) if self.status != SKIPPED else None,
            "ready_probe": self.probe or None,
            "facts": self.facts,
            "requests": [_request(x, spans) for x in self.observations],
            "follow_up": _request(self.follow_up, spans) if self.follow_up is not None else None,
            "checks": [c.to_dict() for c in self.checks],
        }


def _request(x: RequestObservation, spans: SpanIndex | None) -> dict[str, Any]:
    s = rc.span_of(x, spans)
    return x.to_dict(s.joined() if s is not None else None)
