"""Serving workloads: named profiles (prompt words and output tokens per request) and the prompts
they make, from a fixed word list and a fixed seed, so every run of a profile sends the same text.

Prompt *words* are what the client controls; how many tokens they become depends on the server's
tokenizer, so the report records the real prompt tokens from each response's usage chunk."""
from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable

# Common English words (plus a few from the tokenizer corpus), fixed: changing this list changes
# every benchmark's prompts. One leading space joins them, so most are one or two BPE tokens.
WORDS: tuple[str, ...] = tuple("""
the of and to in is was for on that with as it at by from his her they this be are or had not but one all were
when there can an which their said if do will each about how up out them then she many some so these would
other into has more two like him see time could no make than first been its who now people my made over did
down only way find use may water long little very after words called just where most know get through back
much before go good new write our used me man too any day same right look think also around another came
come work three word must because does part even place well such here take why things help put years
different away again off went old number great tell men say small every found still between name should
home big give air line set own under read last never us left end along while might next sound below saw
something thought both few those always looked show large often together asked house world going want
school important until form food keep children feet land side without boy once animals life enough took
sometimes four head above kind began almost live page got earth need far hand high year mother light parts
country father let night following picture being study second eyes soon times story boys since white days
ever paper hard near sentence better best across during today others however sure means knew try told
young miles sun ways thing whole hear example heard several change answer room sea against top turned
learn point city play toward five using himself usually harbour tide boat river stone bridge garden window
morning engine token request
""".split())


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    name: str
    words: tuple[int, ...]  # prompt words of request i: words[i % len(words)]
    max_tokens: int
    summary: str


PROFILES: dict[str, Profile] = {
    "short": Profile("short", (64,), 64, "64-word prompts, 64 output tokens"),
    "mixed": Profile("mixed", (64, 512), 64, "prompts alternating 64 and 512 words, 64 output tokens"),
    "long": Profile("long", (2048,), 64, "2048-word prompts, 64 output tokens"),
}

DEFAULT_SWEEP = (1, 4, 8, 16, 32, 64, 128, 256)


@dataclasses.dataclass(frozen=True, slots=True)
class PromptSpec:
    index: int
    words: int
    text: str


def prompt_text(seed: int, index: int, words: int) -> str:
    """Request `index`'s prompt: `words` words drawn with a generator seeded by (seed, index), so a
    prompt does not depend on how many others were made (levels of a sweep share their prefix)."""
    rng = random.Random(f"pegainfer-bench:{seed}:{index}")
    return " ".join(rng.choice(WORDS) for _ in range(words))


def make_prompts(profile: Profile, n: int, seed: int, words_override: int | None = None,
                 first_index: int = 0) -> list[PromptSpec]:
    out = []
    for i in range(first_index, first_index + n):
        words = words_override or profile.words[i % len(profile.words)]
        out.append(PromptSpec(i, words, prompt_text(seed, i, words)))
    return out


def requests_per_level(concurrency: int, num_requests: int | None) -> int:
    """--num-requests when given, else enough for every worker to send several: max(4 N, 16)."""
    return num_requests if num_requests is not None else max(4 * concurrency, 16)


def parse_levels(text: str | None) -> list[int]:
    if not text:
        return list(DEFAULT_SWEEP)
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--concurrency must be comma-separated integers, got {text!r}") from None
    if not levels or any(n < 1 for n in levels):
        raise ValueError(f"--concurrency levels must be positive, got {text!r}")
    return levels


async def closed_loop(prompts: list[PromptSpec], concurrency: int, one: Callable[[PromptSpec], Awaitable],
                      on_done: Callable | None = None, window: list[int] | None = None) -> tuple[list, float]:
    """`concurrency` workers drain the prompt list, each sending its next request (one(prompt), which
    returns its RequestRecord) as soon as its last one ends. Returns the records in workload
    order and the duration, first send to last completion; `window`, where given, gets the same
    interval on the wall clock, [start ns, end ns] (what a server's trace is compared with)."""
    pending = iter(prompts)
    records: list = []

    async def worker() -> None:
        for p in pending:  # a shared iterator: each prompt goes to exactly one worker
            rec = await one(p)
            records.append(rec)
            if on_done is not None:
                on_done(rec)

    t0, t0_ns = time.perf_counter(), time.time_ns()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    duration = time.perf_counter() - t0
    if window is not None:
        window[:] = [t0_ns, t0_ns + round(duration * 1e9)]
    records.sort(key=lambda r: r.index)
    for rec in records:  # when each was sent, from the level's start (a burst's spread on the client)
        rec.sent_s = rec.start - t0
    return records, duration
