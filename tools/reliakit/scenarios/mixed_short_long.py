"""mixed_short_long_with_failures: 16-word and 128-word prompts interleaved (each prompt sent twice,
so the same request meets different batches and must still give the same output), with a long
stream cancelled through the API after its first token and a request refused for exceeding the
context in the middle of the mix. Every completing request finishes in full; decode batches carry
several rows at different positions."""
from __future__ import annotations

import asyncio

from tools.reliakit import client as c
from tools.reliakit import observation as o
from tools.reliakit.limits import Limits
from tools.reliakit.observation import Expectation, RequestObservation, refused
from tools.reliakit.scenario import Context, Scenario
from tools.reliakit.scenarios.cancel_disconnect import checks as cancel_checks
from tools.reliakit.workload import (
    REQUEST_TIMEOUT_S,
    body,
    completing,
    long_tokens,
    words,
)

TOKENS = 24
STAGGER_S = 0.02
SHORT, LONG = 16, 128
CANCEL_LABEL, REJECT_LABEL = "cancelled_long", "rejected_over_context"


def plan(limits: Limits) -> list[RequestObservation]:
    m = limits.model
    mix = [(SHORT, 20), (LONG, 30), (SHORT, 21), (LONG, 31)] * 2
    out = [completing(f"{'short' if n == SHORT else 'long'}_{i}", m, n, seed, TOKENS)
           for i, (n, seed) in enumerate(mix)]
    long = long_tokens(limits.max_model_len, 320, 200)
    out.insert(3, RequestObservation(CANCEL_LABEL, None,
                                     Expectation(o.ERROR_CHUNK, ("cancelled",), error_code="request_cancelled"),
                                     body(m, words(LONG, 32), long), long))
    out.insert(6, RequestObservation(REJECT_LABEL, None, refused(400, "context_length_exceeded"),
                                     body(m, words(LONG, 33), limits.max_model_len), limits.max_model_len))
    return out


async def drive(ctx: Context, planned: list[RequestObservation]) -> None:
    tasks, cancelled, got_token = [], None, asyncio.Event()
    for x in planned:
        if x.label == CANCEL_LABEL:
            cancelled = x
            tasks.append(asyncio.create_task(c.stream(ctx.http, x, ctx.now, timeout=REQUEST_TIMEOUT_S,
                                                      first_token=got_token)))
        else:
            tasks.append(asyncio.create_task(c.stream(ctx.http, x, ctx.now, timeout=REQUEST_TIMEOUT_S)))
        await asyncio.sleep(STAGGER_S)
    await got_token.wait()
    ctx.facts["cancel_status"] = await c.cancel(ctx.http, cancelled.request_id)
    await asyncio.gather(*tasks)


def requires(limits: Limits) -> dict[str, tuple[int, int | None]]:
    a = limits.max_active
    return {"active_set": (min(2, a), a), "decode_batch": (min(2, a), a)}


SCENARIO = Scenario(
    name="mixed_short_long_with_failures", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=plan, drive=drive, checks=cancel_checks, dry_facts=lambda observations, limits: {"cancel_status": 200},
    requires=requires)
