"""poisoned_neighbour: a sampled, seeded stream runs alone, then again while poisoned bodies arrive
(issue 32: `top_k` 2^63 with temperature 0.5 and with temperature 0, which once killed the engine and
every stream beside them; integers past int64 in `seed`, `n`, `logprobs`, `max_tokens`,
`stop_token_ids` and the prompt; a `logit_bias` key outside the vocabulary; a huge
`repetition_penalty`) and bodies at the edges of what the API accepts (the int64 seeds, `top_p`
1e-300, `repetition_penalty` 2, `logprobs` 5 with `echo`). Every poisoned body gets a 400 with the
OpenAI error body, every edge body completes, the neighbour completes in full with the same text as
alone, and /ready stays 200."""
from __future__ import annotations

import asyncio

from tools.reliakit import client as c
from tools.reliakit.check import verdict
from tools.reliakit.limits import Limits
from tools.reliakit.observation import RequestObservation, completes, refused
from tools.reliakit.scenario import Context, Scenario
from tools.reliakit.workload import REQUEST_TIMEOUT_S, body, words

NEIGHBOUR_TOKENS = 64
EDGE_TOKENS = 4
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 20240532}
KIND = "poisoned-neighbour-sampled"


def _poisoned(model: str | None) -> list[tuple[str, dict]]:
    issue = {"prompt": "hi", "max_tokens": 4, "temperature": 0.5, "top_k": 9223372036854775808}
    if model is not None:
        issue = {"model": model, **issue}
    return [
        ("issue_top_k_2^63", issue),
        ("issue_top_k_2^63_greedy", {**issue, "temperature": 0}),
        ("issue_top_k_2^63_streamed", {**issue, "stream": True}),
        ("top_k_2^64-1", {**issue, "top_k": 2**64 - 1}),
        ("top_k_2^62_over_vocab", {**issue, "top_k": 2**62}),
        ("seed_2^64-1", {**issue, "top_k": 5, "seed": 2**64 - 1}),
        ("seed_-2^63-1", {**issue, "top_k": 5, "seed": -2**63 - 1}),
        ("n_2^63", {**issue, "top_k": 5, "n": 2**63}),
        ("logprobs_2^63_echo", {**issue, "top_k": 5, "logprobs": 2**63, "echo": True}),
        ("max_tokens_2^64-1", {**issue, "top_k": 5, "max_tokens": 2**64 - 1}),
        ("stop_token_ids_2^64-1", {**issue, "top_k": 5, "stop_token_ids": [2**64 - 1]}),
        ("prompt_id_2^63", {**issue, "top_k": 5, "prompt": [1, 2**63]}),
        ("logit_bias_outside_vocab", {**issue, "top_k": 5, "logit_bias": {"99999999": 100}}),
        ("repetition_penalty_1e308", {**issue, "top_k": 5, "repetition_penalty": 1e308}),
        ("top_k_float", {**issue, "top_k": 5.5}),  # a fraction (a whole float is its integer, as in vLLM)
    ]


def _edges() -> list[tuple[str, dict]]:
    return [("seed_int64_max", {"seed": 2**63 - 1, "temperature": 1.0}),
            ("seed_int64_min", {"seed": -2**63, "temperature": 1.0, "top_k": 1}),
            ("top_p_1e-300", {"top_p": 1e-300, "temperature": 2.0}),
            ("repetition_penalty_2", {"repetition_penalty": 2, "temperature": 0.5}),
            ("logprobs_5_echo", {"logprobs": 5, "echo": True})]


def plan(limits: Limits) -> list[RequestObservation]:
    m = limits.model

    def neighbour(label: str) -> RequestObservation:
        return RequestObservation(label, KIND, completes(NEIGHBOUR_TOKENS),
                                  body(m, words(16, 32), NEIGHBOUR_TOKENS, **SAMPLED), NEIGHBOUR_TOKENS)

    out = [neighbour("neighbour_alone"), neighbour("neighbour")]
    out += [RequestObservation(f"poisoned_{label}", None, refused(400), b) for label, b in _poisoned(m)]
    out += [RequestObservation(f"edge_{label}", None, completes(EDGE_TOKENS),
                               body(m, words(8, 33), EDGE_TOKENS, **extra), EDGE_TOKENS) for label, extra in _edges()]
    return out


async def drive(ctx: Context, planned: list[RequestObservation]) -> None:
    alone, neighbour, *rest = planned
    await c.stream(ctx.http, alone, ctx.now, timeout=REQUEST_TIMEOUT_S)
    started = asyncio.Event()
    task = asyncio.create_task(c.stream(ctx.http, neighbour, ctx.now, timeout=REQUEST_TIMEOUT_S,
                                        first_token=started))
    await started.wait()
    sends = [c.post(ctx.http, x, ctx.now, timeout=REQUEST_TIMEOUT_S) if x.label.startswith("poisoned_")
             else c.stream(ctx.http, x, ctx.now, timeout=REQUEST_TIMEOUT_S) for x in rest]
    await asyncio.gather(*sends)
    ctx.facts["ready_status_after_poison"], _ = await c.ready(ctx.http)
    await task
    ctx.facts["poisoned"] = sum(x.label.startswith("poisoned_") for x in rest)
    ctx.facts["sent_while_neighbour_streamed"] = sum(
        1 for x in rest if x.start_s is not None and neighbour.end_s is not None and x.start_s < neighbour.end_s)


def checks(observations, facts, limits):
    sent, overlapped = len(observations) - 2, facts.get("sent_while_neighbour_streamed")
    ready = facts.get("ready_status_after_poison")
    return [
        verdict("poison_beside_the_neighbour", [] if overlapped == sent else
                [f"{overlapped} of {sent} bodies were sent while the neighbour streamed"],
                f"all {sent} bodies were sent while the neighbour streamed"),
        verdict("ready_after_poison", [] if ready == 200 else [f"/ready answered {ready} after the poisoned bodies"],
                "/ready answered 200 after the poisoned bodies"),
    ]


SCENARIO = Scenario(
    name="poisoned_neighbour", description=__doc__.split(": ", 1)[1].replace("\n", " "),
    plan=plan, drive=drive, checks=checks,
    dry_facts=lambda observations, limits: {"ready_status_after_poison": 200,
                                            "poisoned": sum(x.label.startswith("poisoned_") for x in observations),
                                            "sent_while_neighbour_streamed": len(observations) - 2})
