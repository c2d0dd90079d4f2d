"""connection_burst: bursts of new streaming connections opened all at once (by default 2 bursts of
256; `tools/reliability.py --burst SIZExCOUNT`, e.g. 1024x10 on the GPU host), each burst on fresh
connections once the server is idle. The server must take every connection and answer each request:
a request either streams in full or is refused with 429 queue_full or 503 too_many_connections
(both with Retry-After); none may be reset,
refused at the socket or left without an end, and every one must end in exactly one terminal state
on the server (the trace join's rule)."""
from __future__ import annotations

import asyncio

import httpx

from tools.reliakit import client as c
from tools.reliakit import observation as o
from tools.reliakit.check import verdict
from tools.reliakit.limits import Limits
from tools.reliakit.observation import RequestObservation, refused
from tools.reliakit.ready_probe import wait_idle
from tools.reliakit.scenario import Context, Scenario
from tools.reliakit.workload import REQUEST_TIMEOUT_S, completing

TOKENS = 8
WORDS = 12
SHAPE = {"size": 256, "count": 2}  # connections per burst, bursts; set by tools/reliability.py --burst


def parse_shape(text: str) -> dict[str, int]:
    """'SIZExCOUNT' (e.g. 1024x10) -> {"size": SIZE, "count": COUNT}; ValueError otherwise."""
    try:
        size, count = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--burst must be SIZExCOUNT, e.g. 1024x10, got {text!r}") from None
    if not (1 <= size <= 8192 and 1 <= count <= 100):
        raise ValueError(f"--burst wants 1..8192 connections and 1..100 bursts, got {text!r}")
    return {"size": size, "count": count}


def _answered(obs: RequestObservation) -> RequestObservation:
    """Streams in full, or is refused with 429 (the queue is full) or 503 (the connection cap)."""
    busy = refused(429, "queue_full", retry_after=True)
    busy.either = refused(503, "too_many_connections", retry_after=True)
    obs.expect.either = busy
    return obs


def plan(limits: Limits) -> list[RequestObservation]:
    return [_answered(completing(f"burst{b}_{i}", limits.model, WORDS, 40 + i % 3, TOKENS))
            for b in range(SHAPE["count"]) for i in range(SHAPE["size"])]


async def drive(ctx: Context, planned: list[RequestObservation]) -> None:
    size = SHAPE["size"]
    for start in range(0, len(planned), size):
        await wait_idle(ctx.http)  # each burst meets an idle server and opens new connections only
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=0)
        async with httpx.AsyncClient(headers=c.AUTH, base_url=ctx.base_url, limits=limits, timeout=REQUEST_TIMEOUT_S) as fresh:
            await asyncio.gather(*(c.stream(fresh, x, ctx.now, timeout=REQUEST_TIMEOUT_S)
                                   for x in planned[start:start + size]))
    ctx.facts.update(bursts=SHAPE["count"], connections_per_burst=size)


def checks(observations, facts, limits):
    reset = [f"{x.label}: {x.note}" for x in observations if x.outcome == o.CONNECTION_ERROR]
    no_end = [f"{x.label}: {x.outcome}" for x in observations if x.outcome in (o.INCOMPLETE, o.TIMED_OUT)]
    accepted = [x for x in observations if x.status == 200]
    lost = [f"{x.label}: {x.outcome}, {x.tokens} of {x.max_tokens} tokens" for x in accepted
            if x.outcome != o.COMPLETED or x.tokens != x.max_tokens]
    other = [f"{x.label}: HTTP {x.status}" for x in observations if x.status not in (None, 200, 429, 503)]
    return [
        verdict("no_connection_resets", reset + no_end,
                f"all {len(observations)} connections answered ({facts.get('bursts')} bursts of "
                f"{facts.get('connections_per_burst')})", {"connections": len(observations)}),
        verdict("burst_nothing_lost", lost + other,
                f"{len(accepted)} accepted requests completed in full; the rest were refused with 429 or 503",
                {"accepted": len(accepted), "queue_full": sum(1 for x in observations if x.status == 429),
                 "too_many_connections": sum(1 for x in observations if x.status == 503)}),
    ]


def dry_facts(observations, limits):
    return {"bursts": SHAPE["count"], "connections_per_burst": SHAPE["size"]}


SCENARIO = Scenario(
    name="connection_burst", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=plan, drive=drive, checks=checks, dry_facts=dry_facts)
