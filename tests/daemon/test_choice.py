"""One choice's output from engine tokens: text through the detokenizer and the stop scan, log-prob
entries released with their text (and cut at a stop string), stop tokens add no text, and the
counts that usage and best_of read."""
from __future__ import annotations

import dataclasses

import pytest

from pegainfer.daemon.choice import ChoiceOutput, Delta
from pegainfer.daemon.choices import Choices
from pegainfer.daemon.protocol import parse_completion
from pegainfer.engine.contract import PromptLogprobs, Token
from pegainfer.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return Tokenizer(str(tiny_model_dir))


def tokens(tok, text: str, *, last: str | None = None, lp: float = -1.0) -> list[Token]:
    ids = tok.encode(text, add_bos=False)
    return [Token("r", t, i == 0, 0, lp, ((t, lp),), last if i == len(ids) - 1 else None) for i, t in enumerate(ids)]


def run(c: ChoiceOutput, ts: list[Token]) -> list[Delta]:
    return [c.push(t) for t in ts]


def test_text_and_entries_stream_in_step(tok):
    c = ChoiceOutput(0, tok, [], logprobs=True)
    out = run(c, tokens(tok, "hello world, again", last="length"))
    assert "".join(d.text for d in out) == "hello world, again" and out[-1].finish_reason == "length"
    entries = [e for d in out for e in d.entries]
    assert "".join(e.token for e in entries) == "hello world, again"
    assert [e.offset for e in entries] == [len("".join(x.token for x in entries[:i])) for i in range(len(entries))]
    assert c.tokens == len(entries) and c.cumulative_logprob == -len(entries)


def test_a_stop_string_across_tokens_cuts_text_not_entries(tok):
    """The text ends before the stop string; the log-prob entries name every token that counts, the
    two that spelled "o wor" included (vLLM's reading: one entry per generated token)."""
    c = ChoiceOutput(0, tok, ["o wor"], logprobs=True)  # "o" + " wor" are two tokens
    out = run(c, tokens(tok, "hello world, again and again"))
    assert "".join(d.text for d in out) == "hell" and c.finish_reason == "stop" and c.stopped_by_string
    entries = [e for d in out for e in d.entries]
    assert [e.token for e in entries] == ["he", "ll", "o", " wor"] and [e.offset for e in entries] == [0, 2, 4, 5]
    assert c.tokens == 4 == len(entries)  # he, ll, o, " wor": the rest came after the stop and does not count


def test_a_stop_token_adds_no_text(tok):
    c = ChoiceOutput(0, tok, [], logprobs=False)
    ts = tokens(tok, "hello")
    ts.append(Token("r", 259, False, 0, None, (), "stop"))  # " a" as a stop token id
    assert "".join(d.text for d in run(c, ts)) == "hello" and c.finish_reason == "stop" and c.tokens == 4


def test_partial_characters_are_held_until_complete(tok):
    c = ChoiceOutput(0, tok, [], logprobs=True)
    out = run(c, tokens(tok, "日本", last="length"))
    assert [d.text for d in out] == ["", "日", "", "本"]
    assert [e.offset for d in out for e in d.entries] == [0, 0, 1, 1]


def test_choices_echo_and_best_of(tok):
    req = parse_completion({"prompt": "hello", "echo": True, "n": 1, "best_of": 2, "logprobs": 1}, max_tokens_default=4)
    cs = Choices(req, tok, tok.encode("hello"))
    prompt = [None] + [(-0.5, ((t, -0.5),)) for t in tok.encode("hello")[1:]]
    a = [dataclasses.replace(t, index=0, logprob=-3.0) for t in tokens(tok, " a", last="length")]
    b = [dataclasses.replace(t, index=1, logprob=-1.0) for t in tokens(tok, " and", last="length")]
    deltas, stopped = cs.feed(a + b, [PromptLogprobs("r", prompt, 0)])
    assert not stopped and [i for i, _ in deltas] == [0, 1]
    [best] = cs.final()
    assert best["index"] == 0 and best["text"] == "hello and"  # candidate 1: the higher cumulative log-prob
    lp = best["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["tokens"][-1] == " and" and lp["text_offset"][-1] == len("hello")
    assert cs.completion_tokens == 2


def test_choices_join_a_chunked_prompts_log_prob_events(tok):
    """One PromptLogprobs event per prompt chunk, each with where it starts, joined into the whole
    prompt's entries in order whatever the chunk sizes, across several reads of the sink."""
    whole = [None] + [(-float(i), ((i, -float(i)),)) for i in range(1, 10)]
    for chunk in (1, 3, 4, 9, 10):
        req = parse_completion({"prompt": [5] * 10, "echo": True, "logprobs": 1}, max_tokens_default=4)
        cs = Choices(req, tok, [5] * 10)
        events = [PromptLogprobs("r", whole[:chunk + 1], 0)]  # first chunk: None + `chunk` entries
        start = chunk + 1
        while start < len(whole):
            events.append(PromptLogprobs("r", whole[start:start + chunk], start))
            start += chunk
        cs.feed([], events[:1])  # an earlier read brought the first chunk alone
        cs.feed([], events[1:])
        assert cs._prompt == whole
