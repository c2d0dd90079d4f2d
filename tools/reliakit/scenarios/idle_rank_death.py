"""idle_rank_death: with no request running, SIGKILL one expert rank (a child process of the daemon).
/ready must answer 503 within 1 s, a request sent then must be refused with 503 (code `not_ready`,
a message naming the rank), not accepted and then failed, and the daemon must exit non-zero within
10 s of the 503. Needs --spawn and --ep-size >= 2."""
from __future__ import annotations

import signal

from tools.reliakit.scenario import Scenario
from tools.reliakit.scenarios import idle_rank

DEATH = idle_rank.IdleSignal(signal.SIGKILL, ready_503_from_s=0.0, ready_503_within_s=1.0)

SCENARIO = Scenario(
    name="idle_rank_death", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=idle_rank.plan, drive=idle_rank.driver("idle_rank_death", DEATH), checks=idle_rank.checks(DEATH),
    dry_facts=idle_rank.dry_facts(DEATH), ends_server=True, min_ep_size=2)
