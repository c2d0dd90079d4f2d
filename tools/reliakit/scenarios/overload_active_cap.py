"""overload_active_cap: more concurrent streams than --max-active, then more than max-active plus
max-pending. First max_active + max_pending streams at once: the surplus must wait in the pending
queue (pending depth or /ready waiting > 0) and every one must complete in full. Then
max_active + max_pending + 3 at once: some must be refused with 429 and a Retry-After header, and
nothing may be lost among the accepted: each completes with its full token count. The active set
must reach max_active and never exceed it; decode batches must carry several rows."""
from __future__ import annotations

import asyncio

from tools.reliakit import client as c
from tools.reliakit import observation as o
from tools.reliakit.check import verdict
from tools.reliakit.limits import Limits
from tools.reliakit.observation import RequestObservation, refused
from tools.reliakit.ready_probe import wait_idle
from tools.reliakit.scenario import Context, Scenario
from tools.reliakit.workload import REQUEST_TIMEOUT_S, completing

TOKENS = 24
# the burst's requests are longer: the first of them must still hold the active set and the queue when
# the last arrive (a fast device ends 24 tokens before a client has sent a hundred requests: on the
# H200 no 429 came back with 24)
BURST_TOKENS = 200
EXTRA = 3  # the burst's requests beyond max_active + max_pending
LARGEST_BURST = 160
FLAGS = ("--max-active", "2", "--max-pending", "2", "--max-model-len", "512")


def _accepted_or_refused(obs: RequestObservation, accepted_first: bool) -> RequestObservation:
    """In the burst a request is either accepted (and must complete in full) or refused with 429."""
    full, busy = obs.expect, refused(429, "queue_full", retry_after=True)
    obs.expect = full if accepted_first else busy
    obs.expect.either = busy if accepted_first else full
    return obs


def plan(limits: Limits) -> list[RequestObservation]:
    room = limits.max_active + limits.max_pending
    queue = [completing(f"queue_{i}", limits.model, 16, 10 + i % 2, TOKENS) for i in range(room)]
    held = max(TOKENS, min(BURST_TOKENS, limits.max_model_len - 64))  # 16 words take well under 64 tokens
    burst = [_accepted_or_refused(completing(f"burst_{i}", limits.model, 16, 10 + i % 2, held), i < room)
             for i in range(room + EXTRA)]
    return queue + burst


async def drive(ctx: Context, planned: list[RequestObservation]) -> None:
    room = ctx.limits.max_active + ctx.limits.max_pending
    queue, burst = planned[:room], planned[room:]
    await asyncio.gather(*(c.stream(ctx.http, x, ctx.now, timeout=REQUEST_TIMEOUT_S) for x in queue))
    await wait_idle(ctx.http)  # the burst starts from an empty server
    await asyncio.gather(*(c.stream(ctx.http, x, ctx.now, timeout=REQUEST_TIMEOUT_S) for x in burst))


def checks(observations, facts, limits):
    burst = [x for x in observations if x.label.startswith("burst_")]
    queue = [x for x in observations if x.label.startswith("queue_")]
    busy = [x for x in burst if x.status == 429]
    accepted = [x for x in observations if x.status == 200]
    lost = [f"{x.label}: {x.outcome}, {x.tokens} of {x.max_tokens} tokens" for x in accepted
            if x.outcome != o.COMPLETED or x.tokens != x.max_tokens]
    refused_early = [f"{x.label}: HTTP {x.status} although the queue had room" for x in queue if x.status != 200]
    none_busy = (f"no 429 among {len(burst)} burst requests (max_active {limits.max_active}, "
                 f"max_pending {limits.max_pending})")
    return [
        verdict("queue_full_seen", [] if busy else [none_busy],
                f"{len(busy)} of {len(burst)} burst requests refused with 429", {"refused": len(busy)}),
        verdict("nothing_lost", lost + refused_early,
                f"all {len(accepted)} accepted requests completed with their full token count",
                {"accepted": len(accepted)}),
    ]


def requires(limits: Limits) -> dict[str, tuple[int, int | None]]:
    a = limits.max_active
    return {"active_set": (a, a), "pending_queue": (1, limits.max_pending), "decode_batch": (min(2, a), a)}


def skip_if(limits: Limits) -> str | None:
    if limits.max_pending < 1:
        return "the server has max_pending 0: there is no pending queue to show"
    if limits.max_active + limits.max_pending + EXTRA > LARGEST_BURST:
        return (f"max_active {limits.max_active} + max_pending {limits.max_pending} is too large for a burst "
                f"here (at most {LARGEST_BURST - EXTRA}); start the server with smaller limits")
    return None


def dry_facts(observations, limits):
    return {}


SCENARIO = Scenario(
    name="overload_active_cap", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=plan, drive=drive, checks=checks, dry_facts=dry_facts, flags=FLAGS, requires=requires, skip_if=skip_if)
