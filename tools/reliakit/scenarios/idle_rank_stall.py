"""idle_rank_stall: with no request running, SIGSTOP one expert rank (alive, but silent). /ready must
answer 503 within the rank timeout plus 0.5 s of the stop (and not more than 0.5 s before the rank
timeout: a live rank is not failed early), a request sent then must be refused with 503 (code
`not_ready`, a message naming the rank), and the daemon must exit non-zero within 10 s of the 503.
The stopped rank is resumed and killed afterwards if the daemon left it. Needs --spawn and
--ep-size >= 2."""
from __future__ import annotations

import signal

from tools.reliakit.scenario import Scenario
from tools.reliakit.scenarios import idle_rank

STALL = idle_rank.IdleSignal(signal.SIGSTOP, ready_503_from_s=idle_rank.RANK_TIMEOUT_S - idle_rank.SLACK_S,
                             ready_503_within_s=idle_rank.RANK_TIMEOUT_S + idle_rank.SLACK_S)

SCENARIO = Scenario(
    name="idle_rank_stall", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=idle_rank.plan, drive=idle_rank.driver("idle_rank_stall", STALL), checks=idle_rank.checks(STALL),
    dry_facts=idle_rank.dry_facts(STALL), ends_server=True, min_ep_size=2)
