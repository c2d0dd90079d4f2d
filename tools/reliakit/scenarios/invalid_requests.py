"""invalid_requests: bodies the server must refuse, each with its status and an OpenAI error body
{"error": {message, type, param, code}}: an empty prompt, a prompt plus max_tokens over the context,
unsupported parameters (suffix, best_of 2 on a stream), sampling parameters out of
range (temperature -0.5, top_p 1.5, n 0 and 17, logprobs -1 and 6), malformed JSON, a body that
is not an object, wrong types, a negative max_tokens and an unknown model; a valid neighbouring stream runs meanwhile and
completes. Every refusal must leave a `rejected` request span with its HTTP status."""
from __future__ import annotations

import asyncio

from tools.reliakit import client as c
from tools.reliakit.limits import Limits
from tools.reliakit.observation import RequestObservation, refused
from tools.reliakit.scenario import Context, Scenario, no_checks, no_facts
from tools.reliakit.workload import REQUEST_TIMEOUT_S, body, completing, words

NEIGHBOUR_TOKENS = 32


def plan(limits: Limits) -> list[RequestObservation]:
    m, p = limits.model, words(16, 5)
    cases = [
        ("empty_prompt", body(m, "", 8), 400, None),
        ("over_context", body(m, p, limits.max_model_len), 400, "context_length_exceeded"),
        ("suffix", {**body(m, p, 8), "suffix": "and so on"}, 400, "unsupported_parameter"),
        ("best_of_2_streamed", body(m, p, 8, best_of=2), 400, None),
        ("temperature_negative", body(m, p, 8, temperature=-0.5), 400, None),
        ("n_0", body(m, p, 8, n=0), 400, None),
        ("logprobs_negative", body(m, p, 8, logprobs=-1), 400, None),
        ("top_p_above_1", body(m, p, 8, top_p=1.5), 400, None),
        ("logprobs_6", body(m, p, 8, logprobs=6), 400, None),
        ("n_17", body(m, p, 8, n=17), 400, None),
        ("malformed_json", b'{"prompt": "an unterminated string, "max_tokens": 8', 400, None),
        ("not_an_object", b'["prompt", 8]', 400, None),
        ("wrong_type_prompt", body(m, 42, 8), 400, None),
        ("wrong_type_max_tokens", body(m, p, "eight"), 400, None),
        ("wrong_type_stream", {**body(m, p, 8), "stream": "yes"}, 400, None),
        ("negative_max_tokens", body(m, p, -3), 400, None),
        ("unknown_model", body("no-such-model", p, 8), 404, "model_not_found"),
    ]
    # Sampling is supported, so only values outside the protocol's ranges belong here.
    return [completing("neighbour", m, 16, 1, NEIGHBOUR_TOKENS)] + [
        RequestObservation(label, None, refused(status, code), b) for label, b, status, code in cases]


async def drive(ctx: Context, planned: list[RequestObservation]) -> None:
    neighbour, *invalid = planned
    started = asyncio.Event()
    task = asyncio.create_task(c.stream(ctx.http, neighbour, ctx.now, timeout=REQUEST_TIMEOUT_S, first_token=started))
    await started.wait()
    for obs in invalid:  # one after another, while the neighbour decodes
        await c.post(ctx.http, obs, ctx.now, timeout=REQUEST_TIMEOUT_S)
    await task


SCENARIO = Scenario(
    name="invalid_requests", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=plan, drive=drive, checks=no_checks, dry_facts=no_facts)
