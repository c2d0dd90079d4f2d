"""The sampling profiles the benchmarks run (issue 33: most users sample, and the headline tables
report greedy and sampled side by side): each request, or each row of a direct run, takes its
sampling parameters from its index, so a profile is the same mix at every concurrency and batch.

    greedy      temperature 0
    top-p       temperature 0.7, top_p 0.9 (a seed per request)
    penalties   temperature 0.7, top_k 50, presence_penalty 0.5, a seed per request
    logprobs    greedy with logprobs 5
    mix         of every 10 requests: 5 greedy, 3 top-p, 2 penalties with logprobs 5

The fields are the OpenAI completions API's (top_k as vLLM's extension); sampling_params gives the
engine's SamplingParams for the same request (bench_direct)."""
from __future__ import annotations

from pegainfer.engine.contract import SamplingParams

GREEDY = {"temperature": 0.0}
TOP_P = {"temperature": 0.7, "top_p": 0.9, "seed": None}
PENALTIES = {"temperature": 0.7, "top_k": 50, "presence_penalty": 0.5, "seed": None}
LOGPROBS = {"temperature": 0.0, "logprobs": 5}

# name -> ten entries: request i takes entry i % 10 ("seed": None is replaced by the request's seed)
PROFILES: dict[str, tuple[dict, ...]] = {
    "greedy": (GREEDY,) * 10,
    "top-p": (TOP_P,) * 10,
    "penalties": (PENALTIES,) * 10,
    "logprobs": (LOGPROBS,) * 10,
    "mix": (GREEDY, TOP_P, GREEDY, PENALTIES | {"logprobs": 5}, GREEDY, TOP_P, GREEDY, TOP_P, GREEDY,
            PENALTIES | {"logprobs": 5}),
}
DESCRIPTIONS = {
    "greedy": "greedy (temperature 0)",
    "top-p": "temperature 0.7, top_p 0.9, seeded",
    "penalties": "temperature 0.7, top_k 50, presence_penalty 0.5, seeded",
    "logprobs": "greedy, logprobs 5",
    "mix": "50% greedy, 30% temperature 0.7 + top_p 0.9, 20% temperature 0.7 + top_k 50 + presence_penalty 0.5 "
           "+ logprobs 5 (seeded)",
}
SEED_BASE = 1000  # request i's seed: SEED_BASE + i


def fields(profile: str, index: int) -> dict:
    """Request `index`'s sampling fields for the completions API."""
    entry = dict(PROFILES[profile][index % 10])
    if "seed" in entry:
        entry["seed"] = SEED_BASE + index
    return entry


def sampling_params(profile: str, index: int) -> SamplingParams:
    """The same request's parameters as the engine takes them."""
    f = fields(profile, index)
    return SamplingParams(temperature=f["temperature"], top_p=f.get("top_p", 1.0), top_k=f.get("top_k", -1),
                          presence_penalty=f.get("presence_penalty", 0.0), seed=f.get("seed"),
                          logprobs=f.get("logprobs"))


def describe(profile: str) -> dict:
    return {"profile": profile, "summary": DESCRIPTIONS[profile]}
