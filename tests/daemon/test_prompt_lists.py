"""`prompt` as a list, as OpenAI takes it (strings, or token-id lists), against the real app in this
process: one choice per prompt and n, `index` = prompt_index * n + choice_index, each prompt's text
the one it has alone, usage summed, stream and non-stream alike; the bounds (prompts, prompts x n,
the server's request slots) and a bad prompt refuse the whole request with a 400 before anything
runs; a cancel of the request's id ends all its prompts. Also `suffix` (refused) and unknown fields
(accepted, each name logged once)."""
from __future__ import annotations

import json
import logging

import pytest

from pegainfer.daemon.protocol import MAX_PROMPTS, MAX_SEQUENCES
from tests.daemon.inprocess import InProcessDaemon

PROMPTS = ["The weather in the mountains is", "Hello", "x y z"]
IDS = [[5, 6, 7], [300, 2, 9, 14], [77]]


@pytest.fixture(scope="module")
def daemon(tiny_model_dir):
    with InProcessDaemon(tiny_model_dir, max_active=4, max_pending=4, max_model_len=128) as d:
        yield d


def post(d, **body) -> dict:
    r = d.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def sse(d, **body) -> list:
    r = d.client.post("/v1/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    items = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: ")]
    assert items[-1] == "[DONE]"
    return [json.loads(i) for i in items[:-1]]


def texts(chunks: list[dict]) -> dict[int, str]:
    out: dict[int, str] = {}
    for c in chunks:
        for ch in c["choices"]:
            out[ch["index"]] = out.get(ch["index"], "") + ch["text"]
    return out


def assert_400(r, param: str = "prompt", contains: str = "") -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and contains in err["message"], err
    return err


@pytest.mark.parametrize("prompts", [PROMPTS, IDS], ids=["strings", "token-id-lists"])
def test_each_prompt_gets_its_choices_with_the_openai_index(daemon, prompts):
    sampled = {"max_tokens": 6, "temperature": 1.0, "seed": 3, "ignore_eos": True}
    alone = [post(daemon, prompt=p, n=2, **sampled) for p in prompts]
    together = post(daemon, prompt=prompts, n=2, **sampled)
    assert [c["index"] for c in together["choices"]] == list(range(2 * len(prompts)))
    assert [c["text"] for c in together["choices"]] == [c["text"] for a in alone for c in a["choices"]]
    assert all(c["finish_reason"] == "length" for c in together["choices"])
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert together["usage"][key] == sum(a["usage"][key] for a in alone)
    chunks = sse(daemon, prompt=prompts, n=2, stream_options={"include_usage": True}, **sampled)
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert texts(chunks) == {c["index"]: c["text"] for c in together["choices"]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == together["usage"]
    ends = [ch["index"] for c in chunks for ch in c["choices"] if ch["finish_reason"] == "length"]
    assert sorted(ends) == list(range(2 * len(prompts)))


def test_one_prompt_in_a_list_is_that_prompt(daemon):
    assert post(daemon, prompt=["Hello"], max_tokens=4)["choices"] == post(daemon, prompt="Hello", max_tokens=4)["choices"]


def test_echo_and_logprobs_per_prompt(daemon):
    out = post(daemon, prompt=["Hello", "x y z"], max_tokens=2, echo=True, logprobs=1)
    assert [c["text"].startswith(p) for c, p in zip(out["choices"], ["Hello", "x y z"])] == [True, True]
    assert all(c["logprobs"]["token_logprobs"][0] is None for c in out["choices"])


def test_best_of_ranks_within_each_prompt(daemon):
    out = post(daemon, prompt=PROMPTS[:2], max_tokens=3, n=1, best_of=2, temperature=1.0, seed=9)
    assert [c["index"] for c in out["choices"]] == [0, 1] and out["usage"]["completion_tokens"] == 2 * 2 * 3


@pytest.mark.parametrize("prompt,contains", [
    (["a", ""], "'prompt[1]' is empty"),
    ([[5, 6], []], "'prompt[1]' is empty"),
    (["a", [5, 6]], "not a mix"),
    ([[5, 6], [1.5]], "token ids"),
    ([[5, 6], [-1]], "token ids"),
    ([["a"]], "must hold token ids"),
    (["a"] * (MAX_PROMPTS + 1), f"at most {MAX_PROMPTS}"),
    ([[5, 6], [10**6]], "prompt 1: prompt token id 1000000 is outside the vocabulary"),
    (["a", "word " * 200], "prompt 1: this model's maximum context length is 128"),
])
def test_a_bad_prompt_refuses_the_whole_request_before_anything_runs(daemon, prompt, contains):
    before = daemon.ready()
    assert_400(daemon.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4}), contains=contains)
    after = daemon.ready()
    assert after["engine"]["steps"] == before["engine"]["steps"]  # nothing reached the engine
    assert after["scheduler"]["submitted"] == before["scheduler"]["submitted"]


def test_the_sequence_and_slot_bounds(daemon):
    assert_400(daemon.client.post("/v1/completions", json={"prompt": ["a"] * 20, "n": 16}),
               contains=f"at most {MAX_SEQUENCES}")
    # 9 prompts need 9 request slots; this server holds 4 running + 4 queued
    assert_400(daemon.client.post("/v1/completions", json={"prompt": ["a"] * 9, "max_tokens": 2}),
               contains="--max-active + --max-pending")
    assert len(post(daemon, prompt=["a"] * 8, max_tokens=2)["choices"]) == 8


def test_cancelling_the_request_id_ends_every_prompt(daemon):
    with daemon.client.stream("POST", "/v1/completions", json={"prompt": PROMPTS[:2], "max_tokens": 100, "stream": True,
                                                               "ignore_eos": True}) as r:
        rid = r.headers["x-request-id"]
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        live = daemon.rt.request_ids.requests(rid)
        assert [q.request_id for q in live] == [f"{rid}-0", f"{rid}-1"]
        cancel = daemon.client.post(f"/v1/completions/{rid}/cancel")
        assert cancel.status_code == 200 and cancel.json()["cancelled"] is True
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][6:])["error"]["code"] == "request_cancelled"
    assert all(q.is_terminal for q in live)
    assert daemon.client.post(f"/v1/completions/{rid}/cancel").status_code == 404
    assert daemon.ready()["scheduler"]["running"] == 0


def test_suffix_is_refused(daemon):
    err = assert_400(daemon.client.post("/v1/completions", json={"prompt": "def f(", "suffix": "return 1"}), "suffix")
    assert err["code"] == "unsupported_parameter" and "not supported" in err["message"]


def test_unknown_fields_are_accepted_and_each_name_logged_once(daemon, caplog):
    caplog.set_level(logging.WARNING, logger="pegainfer.daemon")
    for _ in range(3):
        post(daemon, prompt="hi", max_tokens=1, frobnicate=1, **{"x" * 500: True, "bad\nname": 2})
    lines = [r.getMessage() for r in caplog.records if "unknown field" in r.getMessage()]
    assert len(lines) == 3, lines
    assert any("'frobnicate'" in line for line in lines)
    assert any("'" + "x" * 64 + "'..." in line for line in lines) and not any("x" * 65 in line for line in lines)
    assert any("'bad\\nname'" in line for line in lines) and not any("\n" in line for line in lines)
    r = daemon.client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 1, "frobnicate": 1, "suffix": "x"})
    assert r.status_code == 200
    chat_lines = [r.getMessage() for r in caplog.records if "/v1/chat/completions" in r.getMessage()]
    assert len(chat_lines) == 2 and any("'suffix'" in line for line in chat_lines)  # a completions field


def test_a_client_that_leaves_a_list_of_prompts_ends_them_all(daemon):
    with daemon.client.stream("POST", "/v1/completions", json={"prompt": PROMPTS[:2], "max_tokens": 100, "stream": True,
                                                               "ignore_eos": True}) as r:
        rid = r.headers["x-request-id"]
        live = daemon.rt.request_ids.requests(rid)
        lines = r.iter_lines()
        assert next(lines).startswith("data: ") and not any(q.is_terminal for q in live)
    # the client closed the stream after one chunk
    assert [q.state.name for q in live] == ["DISCONNECTED", "DISCONNECTED"]
    assert daemon.rt.request_ids.requests(rid) is None
    assert daemon.ready()["scheduler"]["running"] == 0
