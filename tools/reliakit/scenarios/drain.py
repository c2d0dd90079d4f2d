"""drain: SIGTERM while streams run. Once /ready says 503 (draining), a new request must be refused
with 503 and error code `draining` (and a Retry-After header), every accepted stream must still
complete in full, and the process must exit with status 0 within the bound. Needs --spawn."""
from __future__ import annotations

import asyncio
import signal

from tools.reliakit import client as c
from tools.reliakit.check import verdict
from tools.reliakit.limits import Limits
from tools.reliakit.observation import RequestObservation, refused
from tools.reliakit.scenario import Context, Scenario, ScenarioError
from tools.reliakit.workload import REQUEST_TIMEOUT_S, body, completing, words

TOKENS = 96
STREAMS = 3
READY_503_WITHIN_S = 5.0
EXIT_WITHIN_S = 60.0


def plan(limits: Limits) -> list[RequestObservation]:
    accepted = [completing(f"accepted_{i}", limits.model, 16, 40 + i, TOKENS) for i in range(STREAMS)]
    late = RequestObservation("refused_while_draining", None, refused(503, "draining", retry_after=True),
                              body(limits.model, words(16, 44), 8), 8)
    return accepted + [late]


async def drive(ctx: Context, planned: list[RequestObservation]) -> None:
    if ctx.daemon is None:
        raise ScenarioError("drain needs a daemon the runner started (--spawn)")
    *accepted, late = planned
    firsts = [asyncio.Event() for _ in accepted]
    tasks = [asyncio.create_task(c.stream(ctx.http, x, ctx.now, timeout=REQUEST_TIMEOUT_S, first_token=e))
             for x, e in zip(accepted, firsts)]
    await asyncio.gather(*(e.wait() for e in firsts))
    ctx.facts["sigterm_s"] = round(ctx.now(), 3)
    ctx.daemon.signal(signal.SIGTERM)
    status = None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_503_WITHIN_S
    while loop.time() < deadline:
        status, _ = await c.ready(ctx.http)
        if status == 503:
            break
        await asyncio.sleep(0.01)
    ctx.facts["ready_status_while_draining"] = status
    await c.post(ctx.http, late, ctx.now, timeout=REQUEST_TIMEOUT_S)
    await asyncio.gather(*tasks)
    code = await asyncio.to_thread(ctx.daemon.wait, EXIT_WITHIN_S)
    ctx.daemon.ended_by = "scenario"
    ctx.facts["exit_code"] = code
    ctx.facts["exit_s"] = round(ctx.now(), 3)


def checks(observations, facts, limits):
    ready = facts.get("ready_status_while_draining")
    code = facts.get("exit_code")
    return [
        verdict("ready_503_while_draining", [] if ready == 503 else [f"/ready answered {ready} after SIGTERM"],
                "/ready answered 503 while draining"),
        verdict("exit_status_zero", [] if code == 0 else
                [f"exit status {code}" if code is not None else f"still running {EXIT_WITHIN_S:g} s after SIGTERM"],
                "the daemon exited 0 after the drain"),
    ]


SCENARIO = Scenario(
    name="drain", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=plan, drive=drive, checks=checks, ends_server=True,
    dry_facts=lambda observations, limits: {"sigterm_s": 1.0, "ready_status_while_draining": 503,
                                            "exit_code": 0, "exit_s": 2.0})
