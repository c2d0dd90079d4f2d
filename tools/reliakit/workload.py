"""What the runner sends: fixed prompts (from the benchmark's word list and a seed, so every run
sends the same text), greedy ignore_eos request bodies, request kinds (same prompt and parameters:
the same output, always), and the clean follow-up request every scenario ends with."""
from __future__ import annotations

from tools.benchkit.workload import prompt_text
from tools.reliakit.observation import RequestObservation, completes

FOLLOW_UP_WORDS = 12
FOLLOW_UP_SEED = 7
FOLLOW_UP_TOKENS = 24
REQUEST_TIMEOUT_S = 60.0


def words(n: int, seed: int) -> str:
    return prompt_text(seed, 0, n)


def body(model: str | None, prompt: object, max_tokens: object, **extra: object) -> dict:
    """A streamed, greedy, ignore_eos request with usage in the stream (the real token count)."""
    out = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
           "stream_options": {"include_usage": True}, "ignore_eos": True, **extra}
    if model is not None:
        out = {"model": model, **out}
    return out


def kind(n_words: int, seed: int, max_tokens: int) -> str:
    return f"w{n_words}-s{seed}-t{max_tokens}"


def completing(label: str, model: str | None, n_words: int, seed: int, max_tokens: int) -> RequestObservation:
    """A request that must finish with exactly max_tokens tokens (its kind joins the drift rule)."""
    return RequestObservation(label, kind(n_words, seed, max_tokens), completes(max_tokens),
                              body(model, words(n_words, seed), max_tokens), max_tokens)


def follow_up(model: str | None, label: str = "follow_up") -> RequestObservation:
    """The clean follow-up: a fixed prompt, greedy, ignore_eos, a fixed max_tokens; sent alone."""
    obs = completing(label, model, FOLLOW_UP_WORDS, FOLLOW_UP_SEED, FOLLOW_UP_TOKENS)
    obs.kind = "follow_up"
    return obs


def long_tokens(max_model_len: int, prompt_tokens_margin: int, want: int) -> int:
    """max_tokens for a stream that must still be running when the runner acts on it."""
    return max(8, min(want, max_model_len - prompt_tokens_margin))
