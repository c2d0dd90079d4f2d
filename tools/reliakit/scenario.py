"""What a scenario is: a name, the daemon settings it needs under --spawn, whether it ends the
server, the requests it plans (each with its expectation), the coroutine that drives them, the
scenario-specific checks over what it saw, and the scheduler evidence it requires. Scenarios are
data; the runner (runner.py) and the dry run (dry_run.py) treat them all the same way."""
from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from tools.reliakit.check import Check
from tools.reliakit.daemon import SpawnedDaemon
from tools.reliakit.limits import Limits
from tools.reliakit.observation import RequestObservation
from tools.reliakit.ready_probe import ReadyProbe

# Daemon settings under --spawn. Most scenarios share them (and one daemon); the overload scenario
# needs a tiny active set and queue of its own. The KV cache holds 16 pages of 64 tokens, half what
# four requests of the whole context need: long requests preempt each other, so the storms of
# cancels and disconnects also hit sequences waiting to be recomputed (every page must come back)
SHARED_FLAGS = ("--max-active", "4", "--max-pending", "8", "--max-model-len", "512", "--kv-cache-tokens", "1024",
                "--drain-timeout", "30", "--rank-timeout", "5")


class ScenarioError(RuntimeError):
    """The scenario could not do what it is for (the failure is recorded, the run goes on)."""


@dataclasses.dataclass(slots=True)
class Context:
    base_url: str
    http: httpx.AsyncClient
    now: Callable[[], float]  # seconds since the run started
    limits: Limits
    probe: ReadyProbe
    daemon: SpawnedDaemon | None  # None under --url
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)


Plan = Callable[[Limits], list[RequestObservation]]
Drive = Callable[[Context, list[RequestObservation]], Awaitable[None]]
Checks = Callable[[list[RequestObservation], dict[str, Any], Limits], list[Check]]
Requires = Callable[[Limits], dict[str, tuple[int, int | None]]]  # evidence kind -> (at least, at most)


@dataclasses.dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    plan: Plan
    drive: Drive
    checks: Checks
    dry_facts: Callable[[list[RequestObservation], Limits], dict[str, Any]]
    flags: tuple[str, ...] = SHARED_FLAGS
    ends_server: bool = False
    min_ep_size: int = 1
    requires: Requires = lambda limits: {}
    skip_if: Callable[[Limits], str | None] = lambda limits: None

    def skip_reason(self, limits: Limits, spawned: bool) -> str | None:
        if self.ends_server and not spawned:
            return "ends the server process: needs --spawn (the runner cannot restart a server it did not start)"
        if limits.ep_size < self.min_ep_size:
            return f"needs --ep-size >= {self.min_ep_size}; this server runs ep_size {limits.ep_size}"
        return self.skip_if(limits)


def no_checks(observations: list[RequestObservation], facts: dict[str, Any], limits: Limits) -> list[Check]:
    return []


def no_facts(observations: list[RequestObservation], limits: Limits) -> dict[str, Any]:
    return {}
