"""Log-probs in the OpenAI completions shape: `{tokens, token_logprobs, top_logprobs, text_offset}`,
one entry per token, built from the engine's (token id, log-prob, top-N) and the tokenizer.

Which log-probs: the log-softmax of the raw model logits (before penalties and temperature, vLLM's
default), of the token that was chosen, and the N most likely (N = the request's `logprobs`). Each
top_logprobs dict holds the top-N and, as vLLM does, the chosen token too (so it may hold N + 1).
A token's string is its own decoded text; `text_offset` is where the token's text starts in the
choice's text (the echoed prompt, when echo is on, starts at 0). The first prompt token has no
log-prob: null in token_logprobs and top_logprobs.

Chat completions carry the same log-probs in their own shape (`as_chat`): per token `{token,
logprob, bytes, top_logprobs: [{token, logprob, bytes}, ...]}` with exactly the top N in rank order,
the chosen token not added; `bytes` are the token's own (engine.tokenizer token_bytes), so a token
holding part of a character carries that part, and the bytes joined give the text's UTF-8."""
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
    # the top N as the engine ranked them, each (text, log-prob, its bytes): chat's top_logprobs
    ranked: tuple[tuple[str, float, bytes], ...] = ()
    raw: bytes | None = None  # the token's own bytes (chat's `bytes`; part of a character, maybe)


def entry(tok: Tokenizer, token_id: int, logprob: float | None, top: TopLogprobs, offset: int) -> LogprobEntry:
    token = tok.decode([token_id])
    if logprob is None:
        return LogprobEntry(token, None, None, offset)
    alternatives = tuple((tok.decode([tid]), lp, tok.token_bytes(tid)) for tid, lp in top)
    merged: dict[str, float] = {}
    for text, lp, _ in alternatives:
        merged.setdefault(text, lp)  # two ids that decode alike: keep the likelier
    merged.setdefault(token, logprob)
    return LogprobEntry(token, logprob, merged, offset, alternatives, tok.token_bytes(token_id))


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


def as_chat(entries: list[LogprobEntry]) -> dict:
    """The chat completions shape: `{"content": [...]}`, one item per generated token."""
    return {"content": [{"token": e.token, "logprob": e.logprob,
                         "bytes": list(e.raw if e.raw is not None else e.token.encode()),
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(raw)} for t, lp, raw in e.ranked]}
                        for e in entries]}
