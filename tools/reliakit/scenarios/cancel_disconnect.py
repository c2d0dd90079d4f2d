"""cancel_disconnect: three ways a stream ends early, next to one that must not notice. A client
closes its stream after the first token, another closes the raw connection after the first response
bytes (before any token is read), a third is cancelled through POST /v1/completions/{id}/cancel; a
neighbouring request runs alongside and completes in full. The server must say disconnected,
disconnected, cancelled (with an error chunk, then [DONE]) and completed_length."""
from __future__ import annotations

import asyncio

from tools.reliakit import client as c
from tools.reliakit import observation as o
from tools.reliakit.check import verdict
from tools.reliakit.limits import Limits
from tools.reliakit.observation import Expectation, RequestObservation
from tools.reliakit.scenario import Context, Scenario
from tools.reliakit.workload import (
    REQUEST_TIMEOUT_S,
    body,
    completing,
    long_tokens,
    words,
)

NEIGHBOUR_TOKENS = 32
LONG_TOKENS = 200


def plan(limits: Limits) -> list[RequestObservation]:
    long = long_tokens(limits.max_model_len, 64, LONG_TOKENS)

    def early(label: str, expect: Expectation, seed: int) -> RequestObservation:
        return RequestObservation(label, None, expect, body(limits.model, words(16, seed), long), long)

    return [
        completing("neighbour", limits.model, 16, 1, NEIGHBOUR_TOKENS),
        early("close_after_first_token", Expectation(o.CLOSED, ("disconnected",)), 2),
        early("close_after_early_bytes", Expectation(o.CLOSED, ("disconnected",)), 3),
        early("cancel_via_api", Expectation(o.ERROR_CHUNK, ("cancelled",), error_code="request_cancelled"), 4),
    ]


async def drive(ctx: Context, planned: list[RequestObservation]) -> None:
    neighbour, first_close, early, cancelled = planned
    started, got_token = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(c.stream(ctx.http, neighbour, ctx.now, timeout=REQUEST_TIMEOUT_S,
                                          first_token=started))]
    await started.wait()
    tasks += [
        asyncio.create_task(c.stream(ctx.http, first_close, ctx.now, timeout=REQUEST_TIMEOUT_S,
                                     close_after_first_token=True)),
        asyncio.create_task(c.close_after_early_bytes(ctx.base_url, early, ctx.now)),
        asyncio.create_task(c.stream(ctx.http, cancelled, ctx.now, timeout=REQUEST_TIMEOUT_S, first_token=got_token)),
    ]
    await got_token.wait()
    ctx.facts["cancel_status"] = await c.cancel(ctx.http, cancelled.request_id)
    await asyncio.gather(*tasks)


def checks(observations, facts, limits):
    status = facts.get("cancel_status")
    problems = [] if status == 200 else [f"POST .../cancel answered {status}, expected 200"]
    return [verdict("cancel_endpoint", problems, "the cancel endpoint accepted the running request's id")]


SCENARIO = Scenario(
    name="cancel_disconnect", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=plan, drive=drive, checks=checks, dry_facts=lambda observations, limits: {"cancel_status": 200})
