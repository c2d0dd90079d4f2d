"""expert_rank_failure: SIGKILL one expert rank (a child process of the daemon) while streams
decode. Every in-flight request must end FAILED with an explicit error chunk (code `engine_failed`,
a message naming the rank and no server internals) and then [DONE] within the bound, /ready must turn 503, and the daemon
must exit non-zero: never a hang. Needs --spawn and --ep-size >= 2."""
from __future__ import annotations

import asyncio
import os
import re
import signal

from tools.reliakit import client as c
from tools.reliakit import observation as o
from tools.reliakit.check import verdict
from tools.reliakit.limits import Limits
from tools.reliakit.observation import Expectation, RequestObservation
from tools.reliakit.scenario import Context, Scenario, ScenarioError
from tools.reliakit.workload import body, long_tokens, words

STREAMS = 2
FAIL_WITHIN_S = 15.0
# what an exception's text carries and a client must not see: source locations, addresses, exception names
INTERNALS = re.compile(r"\.(?:cc|cpp|cu|h|py):\d+|\d+\.\d+\.\d+\.\d+|\]:\d+|Traceback|[A-Z][a-z]+(?:Error|Failure)\b")
EXIT_WITHIN_S = 30.0


def plan(limits: Limits) -> list[RequestObservation]:
    n = long_tokens(limits.max_model_len, 64, 400)
    failed = Expectation(o.ERROR_CHUNK, ("failed",), error_code="engine_failed")
    return [RequestObservation(f"in_flight_{i}", None, failed, body(limits.model, words(16, 50 + i), n), n)
            for i in range(STREAMS)]


async def drive(ctx: Context, planned: list[RequestObservation]) -> None:
    if ctx.daemon is None:
        raise ScenarioError("expert_rank_failure needs a daemon the runner started (--spawn)")
    ranks = ctx.daemon.expert_rank_pids()
    for _ in range(100):  # a process's cmdline reads empty for a moment around exec
        if ranks:
            break
        await asyncio.sleep(0.02)
        ranks = ctx.daemon.expert_rank_pids()
    if not ranks:
        raise ScenarioError(f"no expert rank among the children of daemon pid {ctx.daemon.pid}")
    firsts = [asyncio.Event() for _ in planned]
    tasks = [asyncio.create_task(c.stream(ctx.http, x, ctx.now, timeout=FAIL_WITHIN_S + 30, first_token=e))
             for x, e in zip(planned, firsts)]
    await asyncio.gather(*(e.wait() for e in firsts))
    victim = ranks[0]
    ctx.facts.update(killed_pid=victim, killed_rank=ctx.daemon.logged_ranks().get(victim),
                     expert_rank_pids=ranks, kill_s=round(ctx.now(), 3))
    os.kill(victim, signal.SIGKILL)
    await asyncio.gather(*tasks)
    code = await asyncio.to_thread(ctx.daemon.wait, EXIT_WITHIN_S)
    ctx.daemon.ended_by = "scenario"
    ctx.facts.update(exit_code=code, exit_s=round(ctx.now(), 3), first_503_s=ctx.probe.first_503_s)


def checks(observations, facts, limits):
    kill = facts.get("kill_s")
    late, vague = [], []
    for x in observations:
        took = None if kill is None or x.end_s is None else x.end_s - kill
        if x.outcome != o.ERROR_CHUNK or took is None or took > FAIL_WITHIN_S:
            late.append(f"{x.label}: {x.outcome} {'' if took is None else f'{took:.2f} s after the kill'}")
        message = (x.error or {}).get("message", "") if isinstance(x.error, dict) else ""
        if "rank" not in message:
            vague.append(f"{x.label}: error message {message[:80]!r} does not name the rank")
        elif INTERNALS.search(message):
            vague.append(f"{x.label}: error message {message[:120]!r} shows the server's internals")
    first_503, code = facts.get("first_503_s"), facts.get("exit_code")
    return [
        verdict("failed_within_bound", late, f"every in-flight request failed within {FAIL_WITHIN_S:g} s"),
        verdict("failure_message_explicit", vague, "every error chunk names the failed rank, and nothing internal"),
        verdict("ready_503_after_failure",
                [] if first_503 is not None and kill is not None and first_503 >= kill else
                ["/ready never answered 503 after the kill"], "/ready answered 503 after the kill"),
        verdict("exit_status_nonzero",
                [] if code not in (None, 0) else
                [f"still running {EXIT_WITHIN_S:g} s after the kill" if code is None else "exit status 0"],
                f"the daemon exited with status {code}"),
    ]


def dry_facts(observations, limits):
    return {"killed_pid": 4242, "killed_rank": 1, "expert_rank_pids": [4242], "kill_s": 1.0, "exit_code": 1,
            "exit_s": 2.0, "first_503_s": 1.2}


SCENARIO = Scenario(
    name="expert_rank_failure", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=plan, drive=drive, checks=checks, dry_facts=dry_facts, ends_server=True, min_ep_size=2)
