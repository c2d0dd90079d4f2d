"""Log-probs in the OpenAI completions shape: `{tokens, token_logprobs, top_logprobs, text_offset}`,
one entry per token, built from the engine's (token id, log-prob, top-N) and the tokenizer.

Which log-probs: the log-softmax of the raw model logits (before penalties and temperature, vLLM's
default), of the token that was chosen, and the N most likely (N = the request's `logprobs`). Each
top_logprobs dict holds the top-N and, as vLLM does, the chosen token too (so it may hold N + 1).
A token's string is its own decoded text; `text_offset` is where the token's text starts in the
choice's text (the echoed prompt, when echo is on, starts at 0). The first prompt token has no
log-prob: null in token_logprobs and top_logprobs."""
from __future__ import annotations

import dataclasses

from pegainfer.engine.contract import TopLogprobs
from pegainfer.engine.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclasses.dataclass(frozen=True, slots=True)
class LogprobEntry:
    token: str
    logprob: float | None
    top: dict[str, float] | None
    offset: int


def entry(tok: Tokenizer, token_id: int, logprob: float | None, top: TopLogprobs, offset: int) -> LogprobEntry:
    token = tok.decode([token_id])
    if logprob is None:
        return LogprobEntry(token, None, None, offset)
    ranked: dict[str, float] = {}
    for tid, lp in top:
        ranked.setdefault(tok.decode([tid]), lp)  # two ids that decode alike: keep the likelier
    ranked.setdefault(token, logprob)
    return LogprobEntry(token, logprob, ranked, offset)


def prompt_entries(tok: Tokenizer, prompt_ids: list[int],
                   logprobs: list[tuple[float, TopLogprobs] | None]) -> list[LogprobEntry]:
    """One entry per prompt token, offsets from the prompt's incremental decoding."""
    detok = IncrementalDetokenizer(tok)
    out, offset = [], 0
    for tid, lp in zip(prompt_ids, logprobs):
        out.append(entry(tok, tid, lp[0], lp[1], offset) if lp is not None else
                   LogprobEntry(tok.decode([tid]), None, None, offset))
        offset += len(detok.push(tid))
    return out


def as_openai(entries: list[LogprobEntry]) -> dict:
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [e.top for e in entries], "text_offset": [e.offset for e in entries]}
