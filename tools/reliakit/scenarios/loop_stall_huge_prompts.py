"""loop_stall_huge_prompts: a neighbour stream runs while 8 prompts of about 1 MB (1,000,000
characters, or as many as the server's max_body_bytes allows) arrive at once. Each huge prompt gets
its 400 `context_length_exceeded` (or completes, if it fits the context); the neighbour completes,
and its largest gap between chunks while the huge prompts arrive stays within 200 ms of its largest
gap before them (issue 32: tokenising such prompts on the event loop froze other streams for 6 s)."""
from __future__ import annotations

import asyncio
import json

from tools.reliakit import client as c
from tools.reliakit.check import verdict
from tools.reliakit.limits import Limits
from tools.reliakit.observation import RequestObservation, completes, refused
from tools.reliakit.scenario import SHARED_FLAGS, Context, Scenario
from tools.reliakit.workload import REQUEST_TIMEOUT_S, body, completing, long_tokens, words

HUGE = 8
PROMPT_CHARS = 1_000_000
MIN_PROMPT_CHARS = 100_000  # smaller prompts are not huge: they cannot show a stall
BODY_OVERHEAD = 1024  # the JSON around the prompt
ALLOWED_EXTRA_GAP_S = 0.2
BASELINE_CHUNKS = 24  # the neighbour's gaps before the burst: this many chunks, or BASELINE_MAX_S
BASELINE_MAX_S = 1.0


def prompt_chars(limits: Limits) -> int:
    return min(PROMPT_CHARS, (limits.max_body_bytes or 0) - BODY_OVERHEAD)


def _huge(limits: Limits, i: int, text: str) -> RequestObservation:
    text = text[i:] + text[:i]  # eight different prompts
    expect = refused(400, "context_length_exceeded")
    expect.either = completes(1)
    # Serialised here, so that the runner's own loop does not spend 10 ms per body while it should be
    # timing the neighbour's chunks.
    return RequestObservation(f"huge_{i}", None, expect, json.dumps(body(limits.model, text, 1)).encode(), 1)


def plan(limits: Limits) -> list[RequestObservation]:
    chars = prompt_chars(limits)
    text = words(chars // 3, 60)[:chars]  # words average more than 5 characters with their space
    neighbour = completing("neighbour", limits.model, 16, 61, long_tokens(limits.max_model_len, 64, 480))
    return [neighbour] + [_huge(limits, i, text) for i in range(HUGE)]


async def drive(ctx: Context, planned: list[RequestObservation]) -> None:
    neighbour, *huge = planned
    times: list[float] = []
    started = asyncio.Event()
    task = asyncio.create_task(c.stream(ctx.http, neighbour, ctx.now, timeout=REQUEST_TIMEOUT_S,
                                        first_token=started, chunk_times=times))
    await started.wait()
    t0 = ctx.now()
    while len(times) <= BASELINE_CHUNKS and ctx.now() - t0 < BASELINE_MAX_S and not task.done():
        await asyncio.sleep(0.01)
    before = list(times)
    burst_start = ctx.now()
    await asyncio.gather(*(c.stream(ctx.http, x, ctx.now, timeout=REQUEST_TIMEOUT_S) for x in huge))
    burst_end = ctx.now()
    await task
    during = [b - a for a, b in zip(times, times[1:]) if b > burst_start and a < burst_end]
    ctx.facts.update({
        "prompt_chars": len(json.loads(huge[0].body)["prompt"]), "huge_prompts": len(huge),
        "burst_start_s": round(burst_start, 3), "burst_s": round(burst_end - burst_start, 3),
        "baseline_gap_ms": _ms(max((b - a for a, b in zip(before, before[1:])), default=None)),
        "burst_gap_ms": _ms(max(during, default=None)),
        "neighbour_spanned_burst": bool(times) and times[-1] > burst_end,
    })


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def checks(observations: list[RequestObservation], facts: dict, limits: Limits) -> list:
    base, burst = facts.get("baseline_gap_ms"), facts.get("burst_gap_ms")
    problems = []
    if base is None or burst is None:
        problems.append("the neighbour's gaps between chunks were not measured")
    elif burst > base + ALLOWED_EXTRA_GAP_S * 1000:
        problems.append(f"the neighbour's largest gap was {burst:g} ms while {facts.get('huge_prompts')} prompts of "
                        f"{facts.get('prompt_chars')} characters arrived, {base:g} ms before: the loop stalled")
    if not facts.get("neighbour_spanned_burst"):
        problems.append("the neighbour stream ended before the huge prompts were answered: the gap was not seen")
    keys = ("baseline_gap_ms", "burst_gap_ms", "burst_s", "prompt_chars")
    return [verdict("neighbour_gap_within_bound", problems,
                    f"largest gap {burst} ms while the huge prompts arrived ({facts.get('burst_s')} s), "
                    f"{base} ms before (allowed: +{ALLOWED_EXTRA_GAP_S * 1000:g} ms)",
                    {k: facts.get(k) for k in keys})]


def skip_if(limits: Limits) -> str | None:
    if limits.max_body_bytes is None:
        return "the server does not say its largest request body (max_body_bytes in /v1/models)"
    if prompt_chars(limits) < MIN_PROMPT_CHARS:
        return (f"the server's max_body_bytes {limits.max_body_bytes} is too small for a huge prompt "
                f"(at least {MIN_PROMPT_CHARS + BODY_OVERHEAD} bytes)")
    return None


def dry_facts(observations: list[RequestObservation], limits: Limits) -> dict:
    return {"prompt_chars": prompt_chars(limits), "huge_prompts": HUGE, "burst_start_s": 1.0, "burst_s": 0.1,
            "baseline_gap_ms": 12.0, "burst_gap_ms": 20.0, "neighbour_spanned_burst": True}


SCENARIO = Scenario(
    name="loop_stall_huge_prompts", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=plan, drive=drive, checks=checks, dry_facts=dry_facts, flags=SHARED_FLAGS, skip_if=skip_if)
