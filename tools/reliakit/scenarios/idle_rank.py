"""What idle_rank_death and idle_rank_stall share: with no request running, signal one expert rank
(a child process of the daemon), time how long /ready takes to answer 503, then send one request,
which must be refused with 503 (code `not_ready`, a message naming the rank), not accepted and then
failed, and wait for the daemon to exit non-zero. A stopped rank is resumed and killed afterwards
wherever the daemon did not reap it, so no run leaves a stopped process behind."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable

from tools.reliakit import client as c
from tools.reliakit import observation as o
from tools.reliakit.check import Check, verdict
from tools.reliakit.daemon import cmdline
from tools.reliakit.limits import Limits
from tools.reliakit.observation import RequestObservation, refused
from tools.reliakit.ready_probe import wait_idle
from tools.reliakit.scenario import SHARED_FLAGS, Context, ScenarioError
from tools.reliakit.scenarios.expert_rank_failure import INTERNALS
from tools.reliakit.workload import REQUEST_TIMEOUT_S, body, words

SLACK_S = 0.5  # the documented slack on the rank timeout
EXIT_AFTER_503_S = 10.0  # from /ready's 503 to the process's exit: 0.5 s for error chunks, then the ranks stop
RANK_TIMEOUT_S = float(dict(zip(SHARED_FLAGS[::2], SHARED_FLAGS[1::2]))["--rank-timeout"])


@dataclasses.dataclass(frozen=True, slots=True)
class IdleSignal:
    """The signal to send and the window /ready must turn 503 in, in seconds after it."""
    sig: signal.Signals
    ready_503_from_s: float
    ready_503_within_s: float


def plan(limits: Limits) -> list[RequestObservation]:
    return [RequestObservation("after_failure", None, refused(503, "not_ready", retry_after=True),
                               body(limits.model, words(8, 60), 8), 8)]


async def _expert_ranks(ctx: Context, name: str) -> list[int]:
    if ctx.daemon is None:
        raise ScenarioError(f"{name} needs a daemon the runner started (--spawn)")
    for _ in range(100):  # a process's cmdline reads empty for a moment around exec
        ranks = ctx.daemon.expert_rank_pids()
        if ranks:
            return ranks
        await asyncio.sleep(0.02)
    raise ScenarioError(f"no expert rank among the children of daemon pid {ctx.daemon.pid}")


def driver(name: str, how: IdleSignal) -> Callable:
    async def drive(ctx: Context, planned: list[RequestObservation]) -> None:
        ranks = await _expert_ranks(ctx, name)
        status, snapshot = await wait_idle(ctx.http)
        sched = snapshot.get("scheduler") or {}
        victim = ranks[0]
        ctx.facts.update(signal=how.sig.name, victim_pid=victim, victim_rank=ctx.daemon.logged_ranks().get(victim),
                         expert_rank_pids=ranks, rank_timeout_s=RANK_TIMEOUT_S,
                         idle_at_signal=status == 200 and sched.get("running") == 0 and sched.get("waiting") == 0)
        signalled = ctx.now()
        ctx.facts["signal_s"] = round(signalled, 3)
        os.kill(victim, how.sig)
        try:
            while ctx.now() - signalled < how.ready_503_within_s + 10.0:
                status, _ = await c.ready(ctx.http)
                if status == 503:
                    ctx.facts.update(ready_503_s=round(ctx.now(), 3), ready_503_after_s=round(ctx.now() - signalled, 3))
                    break
                await asyncio.sleep(0.01)
            await c.stream(ctx.http, planned[0], ctx.now, timeout=REQUEST_TIMEOUT_S)
            code = await asyncio.to_thread(ctx.daemon.wait, how.ready_503_within_s + EXIT_AFTER_503_S + 10.0)
            ctx.daemon.ended_by = "scenario"
            ctx.facts.update(exit_code=code, exit_s=round(ctx.now(), 3),
                             exit_after_s=round(ctx.now() - signalled, 3) if code is not None else None)
        finally:
            _release(victim)

    return drive


def _release(pid: int) -> None:
    """SIGCONT then SIGKILL an expert rank the daemon left behind (it is one while its command line
    still says so)."""
    if "spawn_main" not in cmdline(pid):
        return
    for sig in (signal.SIGCONT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def checks(how: IdleSignal) -> Callable:
    def check(observations: list[RequestObservation], facts: dict, limits: Limits) -> list[Check]:
        after = facts.get("ready_503_after_s")
        late = ([f"/ready never answered 503 after {how.sig.name}"] if after is None else
                [f"/ready answered 503 {after:.3f} s after {how.sig.name}, later than {how.ready_503_within_s:g} s"]
                if after > how.ready_503_within_s else [])
        early = ([f"/ready answered 503 {after:.3f} s after {how.sig.name}, before {how.ready_503_from_s:g} s: "
                  f"a rank that is alive was failed before the rank timeout"]
                 if after is not None and after < how.ready_503_from_s else [])
        refusals, vague = [], []
        for x in observations:
            if x.outcome != o.HTTP_ERROR or x.status != 503:
                refusals.append(f"{x.label}: {x.outcome} (status {x.status}), not refused with 503")
            message = x.error.get("message", "") if isinstance(x.error, dict) else ""
            if "rank" not in message:
                vague.append(f"{x.label}: error message {message[:80]!r} does not name the rank")
            elif INTERNALS.search(message):
                vague.append(f"{x.label}: error message {message[:120]!r} shows the server's internals")
        code, exit_s, ready_s = facts.get("exit_code"), facts.get("exit_s"), facts.get("ready_503_s")
        slow_exit = [] if code is None or exit_s is None or ready_s is None or \
            exit_s - ready_s <= EXIT_AFTER_503_S else [f"exited {exit_s - ready_s:.1f} s after /ready's 503"]
        bound = (f"{how.ready_503_from_s:g}-" if how.ready_503_from_s > 0 else "") + f"{how.ready_503_within_s:g} s"
        return [
            verdict("idle_at_signal", [] if facts.get("idle_at_signal") else ["a request was running or waiting"],
                    f"no request was running or waiting when {how.sig.name} was sent"),
            verdict("ready_503_within_bound", late + early, f"/ready answered 503 {after} s after {how.sig.name} "
                                                            f"(bound {bound})"),
            verdict("refused_after_failure", refusals, "the request sent after the failure was refused with 503"),
            verdict("failure_message_explicit", vague, "the refusal names the failed rank"),
            verdict("exit_status_nonzero",
                    ([] if code not in (None, 0) else
                     ["still running after the bound" if code is None else "exit status 0"]) + slow_exit,
                    f"the daemon exited with status {code}, {facts.get('exit_after_s')} s after {how.sig.name}"),
        ]

    return check


def dry_facts(how: IdleSignal) -> Callable:
    def facts(observations: list[RequestObservation], limits: Limits) -> dict:
        after = round((how.ready_503_from_s + how.ready_503_within_s) / 2, 3)  # mid-window
        return {"signal": how.sig.name, "victim_pid": 4242, "victim_rank": 1, "expert_rank_pids": [4242],
                "rank_timeout_s": RANK_TIMEOUT_S, "idle_at_signal": True, "signal_s": 1.0,
                "ready_503_s": round(1.0 + after, 3), "ready_503_after_s": after, "exit_code": 1,
                "exit_s": round(2.0 + after, 3), "exit_after_s": round(1.0 + after, 3)}

    return facts
