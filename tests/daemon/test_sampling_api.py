"""The OpenAI sampling parameters against a real daemon (tiny model, CPU): seeds reproduce whatever
else runs, stop strings that span tokens end the text and the engine's work, n choices share one
prefill, echo and best_of, log-probs equal HF's, the official client with logprobs and n, and the
trace attributes of a sampled request."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
import torch

from pegainfer.engine.engine import EngineSpec, build_engine
from pegainfer.engine.generate import generate
from pegainfer.engine.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.daemon_process import DaemonProcess
from tools.traceview.reader import load

PROMPT = "The weather in the mountains is"
PROMPT_IDS = [1, 5, 9, 200, 31, 77, 12]


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    return tmp_path_factory.mktemp("trace") / "trace.jsonl"


@pytest.fixture(scope="module")
def daemon(tiny_model_dir, trace_path):
    with DaemonProcess("--model", str(tiny_model_dir), "--served-model-name", "tiny", "--max-active", "6",
                       "--trace-file", str(trace_path)) as d:
        yield d


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return Tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def greedy(tiny_model_dir, tok):
    """prompt text -> (prompt ids, 40 greedy token ids), offline."""
    engine = build_engine(EngineSpec(model_dir=str(tiny_model_dir), num_slots=1))
    out = {p: (ids, generate(engine, [ids], 40, ignore_eos=True)[0].token_ids)
           for p, ids in ((PROMPT, tok.encode(PROMPT)), ("ids", PROMPT_IDS))}
    engine.close()
    return out


def post(d, body) -> dict:
    r = httpx.post(d.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def stream(d, body) -> list[dict]:
    with httpx.stream("POST", d.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def texts_by_index(chunks: list[dict]) -> dict[int, str]:
    out: dict[int, str] = {}
    for c in chunks:
        for ch in c["choices"]:
            out[ch["index"]] = out.get(ch["index"], "") + ch["text"]
    return out


def test_a_seed_reproduces_alone_and_among_other_requests(daemon):
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "top_p": 0.95, "seed": 42, "ignore_eos": True}
    alone = post(daemon, body)["choices"][0]["text"]

    async def crowd():
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as c:
            others = [{"prompt": "Hello", "max_tokens": 30, "ignore_eos": True},
                      {"prompt": "x y z", "max_tokens": 20, "temperature": 0.7, "ignore_eos": True},
                      {"prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "seed": 7, "ignore_eos": True}]
            rs = await asyncio.gather(*(c.post("/v1/completions", json=b) for b in [others[0], body, *others[1:]]))
            return [r.json()["choices"][0]["text"] for r in rs]

    crowded = asyncio.run(crowd())
    assert crowded[1] == alone
    assert crowded[3] != alone  # another seed, another text
    assert "".join(texts_by_index(stream(daemon, body)).values()) == alone


def _cross_token_stop(tok: Tokenizer, ids: list[int]) -> tuple[str, int, str]:
    """A stop string made of two consecutive generated tokens' texts: (stop, k, text before it)."""
    d = IncrementalDetokenizer(tok)
    full = "".join(d.push(t) for t in ids) + d.flush()
    pieces = [tok.decode([t]) for t in ids]
    for k in range(2, len(ids) - 1):
        stop = pieces[k] + pieces[k + 1]
        clean = all(p.strip() and "\ufffd" not in p for p in pieces[k:k + 2])
        at = len("".join(pieces[:k]))
        if clean and full.find(stop) == at and "".join(pieces[:k]) == full[:at]:
            return stop, k, full[:at]
    raise AssertionError(f"no clean pair of tokens in {pieces}")


def test_a_stop_string_across_two_tokens_ends_text_and_generation(daemon, tok, greedy):
    gen = greedy[PROMPT][1]
    stop, k, before = _cross_token_stop(tok, gen)
    body = {"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stop": ["\u2603never", stop]}
    steps0 = httpx.get(daemon.url + "/ready").json()["engine"]["steps"]
    full = post(daemon, body)
    steps = httpx.get(daemon.url + "/ready").json()["engine"]["steps"] - steps0
    [choice] = full["choices"]
    assert choice["text"] == before and choice["finish_reason"] == "stop"
    assert full["usage"]["completion_tokens"] == k + 2  # up to the token that completed the stop string
    assert steps < k + 10  # the engine stopped, far short of max_tokens
    chunks = stream(daemon, body)
    assert "".join(ch["text"] for c in chunks for ch in c["choices"]) == before  # no part of it ever sent
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # vLLM's include_stop_str_in_output: the same end, the stop string kept, streamed or not
    kept = post(daemon, body | {"include_stop_str_in_output": True})["choices"][0]
    assert kept["text"] == before + stop and kept["finish_reason"] == "stop"
    chunks = stream(daemon, body | {"include_stop_str_in_output": True})
    assert "".join(ch["text"] for c in chunks for ch in c["choices"]) == before + stop


def test_log_probs_with_a_stop_string_cover_every_generated_token(daemon, tok, greedy):
    """As vLLM reports them: the text ends before the stop string, the log-probs name every token
    generated (the tokens that held the stop string included, as usage counts them), streamed or not,
    and the offsets of the kept tokens point into the returned text."""
    gen = greedy[PROMPT][1]
    stop, k, before = _cross_token_stop(tok, gen)
    body = {"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "stop": [stop], "logprobs": 1}
    [choice] = post(daemon, body)["choices"]
    lp = choice["logprobs"]
    assert choice["text"] == before and len(lp["tokens"]) == len(lp["token_logprobs"]) == k + 2
    assert lp["tokens"] == [tok.decode([t]) for t in gen[:k + 2]]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(k + 2)]
    assert post(daemon, body)["usage"]["completion_tokens"] == k + 2
    chunks = stream(daemon, body)
    assert "".join(ch["text"] for c in chunks for ch in c["choices"]) == before
    streamed = [t for c in chunks for ch in c["choices"] for t in (ch.get("logprobs") or {}).get("tokens", [])]
    assert streamed == lp["tokens"]


def test_n_choices_share_one_prefill_and_reproduce(daemon, trace_path):
    body = {"prompt": PROMPT_IDS, "max_tokens": 10, "n": 3, "temperature": 1.0, "seed": 11, "ignore_eos": True}
    r = httpx.post(daemon.url + "/v1/completions", json=body, timeout=60)
    first = r.json()
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    texts = [c["text"] for c in first["choices"]]
    assert len(set(texts)) == 3 and first["usage"]["completion_tokens"] == 30
    assert [c["text"] for c in post(daemon, body)["choices"]] == texts
    chunks = stream(daemon, body)
    assert texts_by_index(chunks) == dict(enumerate(texts))
    assert {ch["index"] for c in chunks for ch in c["choices"] if ch["finish_reason"] == "length"} == {0, 1, 2}
    # evidence from the engine: one prefill step carried this request, with the prompt once
    rid = r.headers["x-request-id"]
    steps, root = _trace_of(trace_path, rid)
    prefills = [s for s in steps if s.attributes["pegainfer.step.prefill_tokens"] > 0]
    assert [s.attributes["pegainfer.step.prefill_tokens"] for s in prefills] == [len(PROMPT_IDS)]
    a = root.attributes
    assert a["gen_ai.request.choice.count"] == 3 and a["gen_ai.request.seed"] == 11
    assert a["gen_ai.request.temperature"] == 1.0 and a["gen_ai.usage.output_tokens"] == 30


def _trace_of(path, rid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        spans = load(str(path)) if path.exists() else []
        steps = [s for s in spans if s.name.startswith("engine_step")
                 and rid in s.attributes.get("pegainfer.step.request_ids", [])]
        roots = [s for s in spans if s.attributes.get("gen_ai.response.id") == rid and s.name.startswith("text_")]
        if roots and steps or time.monotonic() > deadline:
            assert roots, f"no root span for {rid}"
            return steps, roots[0]
        time.sleep(0.1)


def test_echo_puts_the_prompt_in_front(daemon):
    body = {"prompt": PROMPT, "max_tokens": 5, "ignore_eos": True}
    plain = post(daemon, body)["choices"][0]["text"]
    assert post(daemon, {**body, "echo": True})["choices"][0]["text"] == PROMPT + plain
    chunks = stream(daemon, {**body, "echo": True})
    assert chunks[0]["choices"][0]["text"].startswith(PROMPT)
    assert "".join(ch["text"] for c in chunks for ch in c["choices"]) == PROMPT + plain


def test_best_of_returns_the_candidates_of_highest_cumulative_logprob(daemon):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 3, "ignore_eos": True, "logprobs": 0}
    candidates = post(daemon, {**body, "n": 4})["choices"]
    ranked = sorted(candidates, key=lambda c: sum(c["logprobs"]["token_logprobs"]), reverse=True)
    best = post(daemon, {**body, "best_of": 4})
    assert [c["text"] for c in best["choices"]] == [ranked[0]["text"]]
    assert best["usage"]["completion_tokens"] == 32  # every candidate's tokens count
    two = post(daemon, {**body, "best_of": 4, "n": 2})["choices"]
    assert [c["index"] for c in two] == [0, 1] and [c["text"] for c in two] == [c["text"] for c in ranked[:2]]
    assert len({c["text"] for c in candidates}) > 1  # a real choice was made


@pytest.fixture(scope="module")
def hf_logprobs(tiny_model_dir, greedy):
    """[L, V] HF log-softmax over PROMPT_IDS followed by its greedy continuation."""
    from tools.hf_oracle import load_hf
    hf = load_hf(tiny_model_dir, torch.float32, "cpu")
    with torch.no_grad():
        logits = hf(torch.tensor([PROMPT_IDS + greedy["ids"][1]])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def test_logprobs_with_echo_are_hf_log_softmax(daemon, greedy, hf_logprobs):
    n_new = 6
    lp = post(daemon, {"prompt": PROMPT_IDS, "max_tokens": n_new, "ignore_eos": True, "logprobs": 5,
                       "echo": True})["choices"][0]["logprobs"]
    ids = PROMPT_IDS + greedy["ids"][1][:n_new]
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    for i in range(1, len(ids)):
        ref = hf_logprobs[i - 1]
        assert abs(lp["token_logprobs"][i] - ref[ids[i]].item()) < 1e-4
        top = lp["top_logprobs"][i]
        allowed = ref.topk(5).values.tolist() + [ref[ids[i]].item()]
        # ids that decode to the same string (partial UTF-8 as "\ufffd") share one key
        assert 1 <= len(top) <= 6 and abs(max(top.values()) - allowed[0]) < 1e-4
        assert all(min(abs(v - a) for a in allowed) < 1e-4 for v in top.values())


def test_echo_logprobs_are_the_same_when_the_prompt_is_fed_in_chunks(daemon, tiny_model_dir):
    """Prompt log-probs are computed chunk by chunk within the prefill budget: a daemon whose budget
    cuts this prompt into 3-token chunks answers the same echo + logprobs, streamed and not."""
    body = {"prompt": PROMPT_IDS + PROMPT_IDS, "max_tokens": 4, "ignore_eos": True, "logprobs": 3, "echo": True}
    whole = post(daemon, body)["choices"][0]
    with DaemonProcess("--model", str(tiny_model_dir), "--served-model-name", "tiny", "--max-prefill-tokens",
                       "3") as chunked:
        cut = post(chunked, body)["choices"][0]
        streamed = [ch for c in stream(chunked, body) for ch in c["choices"]]
    for got in (cut["logprobs"], {k: sum((ch["logprobs"][k] for ch in streamed), []) for k in cut["logprobs"]}):
        assert got["tokens"] == whole["logprobs"]["tokens"] and got["text_offset"] == whole["logprobs"]["text_offset"]
        assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
        assert got["token_logprobs"][1:] == pytest.approx(whole["logprobs"]["token_logprobs"][1:], abs=1e-5)
        for mine, ref in zip(got["top_logprobs"][1:], whole["logprobs"]["top_logprobs"][1:]):
            assert mine.keys() == ref.keys() and list(mine.values()) == pytest.approx(list(ref.values()), abs=1e-5)
    assert cut["text"] == whole["text"]


def test_logit_bias_steers_the_choice(daemon, tok, greedy):
    """+100 on one token makes it the only one drawn, greedy or sampled, and -100 bans the greedy
    choice; the log-probs stay the raw model's (the bias shapes the choice, as vLLM's does)."""
    body = {"prompt": PROMPT_IDS, "max_tokens": 4, "ignore_eos": True, "logprobs": 1}
    first = greedy["ids"][1][0]
    forced = 77 if first != 77 else 78
    for extra in ({}, {"temperature": 1.0, "seed": 4}):
        got = post(daemon, {**body, **extra, "logit_bias": {str(forced): 100}})["choices"][0]
        assert got["text"] == tok.decode([forced] * 4)
        assert tok.decode([first]) in got["logprobs"]["top_logprobs"][0]  # raw: the model's own top-1 is listed
    banned = post(daemon, {**body, "max_tokens": 1, "logprobs": 5, "logit_bias": {str(first): -100}})["choices"][0]
    assert banned["logprobs"]["tokens"][0] != tok.decode([first])
    assert post(daemon, {**body, "max_tokens": 1})["choices"][0]["text"] == tok.decode([first])


def test_openai_client_with_logprobs_and_n(daemon):
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    kw = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, "n": 2, "logprobs": 2, "temperature": 0.9,
          "seed": 5, "extra_body": {"ignore_eos": True, "top_k": 50}}
    full = client.completions.create(**kw)
    assert [c.index for c in full.choices] == [0, 1] and full.usage.completion_tokens == 12
    for c in full.choices:
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == len(c.logprobs.top_logprobs) == 6
        assert all(1 <= len(t) <= 3 for t in c.logprobs.top_logprobs)  # the top-2 and the chosen token
        assert "".join(c.logprobs.tokens).replace("\ufffd", "") == c.text.replace("\ufffd", "")
    parts = list(client.completions.create(stream=True, **kw))
    streamed: dict[int, list] = {}
    for p in parts:
        for c in p.choices:
            streamed.setdefault(c.index, []).append(c)
    assert sorted(streamed) == [0, 1]
    for c in full.choices:
        assert "".join(s.text for s in streamed[c.index]) == c.text
        assert [t for s in streamed[c.index] if s.logprobs for t in s.logprobs.token_logprobs] == \
            c.logprobs.token_logprobs
        assert streamed[c.index][-1].finish_reason == "length"
