"""The scenarios, in the order a run takes them: the overload scenario first (it has a daemon of its
own), then those that share one daemon, then those that end the server process."""
from __future__ import annotations

from tools.reliakit.scenario import Scenario
from tools.reliakit.scenarios import (
    cancel_disconnect,
    connection_burst,
    double_sigterm,
    drain,
    expert_rank_failure,
    idle_rank_death,
    idle_rank_stall,
    invalid_requests,
    loop_stall_huge_prompts,
    mixed_short_long,
    overload_active_cap,
    poisoned_neighbour,
)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    overload_active_cap.SCENARIO,
    cancel_disconnect.SCENARIO,
    invalid_requests.SCENARIO,
    poisoned_neighbour.SCENARIO,
    mixed_short_long.SCENARIO,
    loop_stall_huge_prompts.SCENARIO,
    connection_burst.SCENARIO,
    drain.SCENARIO,
    double_sigterm.SCENARIO,
    expert_rank_failure.SCENARIO,
    idle_rank_death.SCENARIO,
    idle_rank_stall.SCENARIO,
)}


def select(names: str | None) -> list[Scenario]:
    """The scenarios named (comma-separated, any order; run in the registry's order), or all."""
    if not names:
        return list(SCENARIOS.values())
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in SCENARIOS]
    if unknown or not wanted:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown) or '(none given)'}; "
                         f"known: {', '.join(SCENARIOS)}")
    return [s for s in SCENARIOS.values() if s.name in wanted]
