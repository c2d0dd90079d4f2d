"""The OpenAI-compatible HTTP surface against a real daemon: shapes, the official client, and every
error status produced by a real request with its error JSON checked."""
from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from tests.daemon_process import DaemonProcess


@pytest.fixture(scope="module")
def daemon(tiny_model_dir):
    d = DaemonProcess("--model", str(tiny_model_dir), "--served-model-name", "tiny", "--max-active", "2",
                      "--max-pending", "1", "--max-body-bytes", "4096", "--max-model-len", "256", "--debug-hooks")
    with d:
        yield d


def post(d, body, **kw):
    return httpx.post(d.url + "/v1/completions", json=body, timeout=60, **kw)


def assert_error(resp: httpx.Response, status: int, *, param=None, code=None, contains=()):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    for c in contains:
        assert c in err["message"]


def test_models_health_ready(daemon):
    models = httpx.get(daemon.url + "/v1/models").json()
    [m] = models["data"]
    assert m["id"] == "tiny" and m["max_model_len"] == 256
    assert (m["backend"], m["maturity"], m["batch_invariant"]) == ("local", "production", True)
    assert httpx.get(daemon.url + "/health").json()["status"] == "ok"
    ready = httpx.get(daemon.url + "/ready").json()
    assert ready["status"] == "ready" and ready["kv_slots_total"] == 2


def test_non_streaming_shape(daemon):
    r = post(daemon, {"model": "tiny", "prompt": "Hello", "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["finish_reason"] == "length" and body["choices"][0]["index"] == 0
    u = body["usage"]
    assert u["completion_tokens"] == 5 and u["total_tokens"] == u["prompt_tokens"] + 5 and u["prompt_tokens"] >= 2


def test_streaming_shape_with_usage(daemon):
    with httpx.stream("POST", daemon.url + "/v1/completions", timeout=60,
                      json={"prompt": [5, 6, 7], "max_tokens": 6, "stream": True, "ignore_eos": True,
                            "stream_options": {"include_usage": True}}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-1]["usage"]["prompt_tokens"] == 3
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "text_completion" for c in chunks)


def test_openai_client_unchanged(daemon):
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    full = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=8,
                                     extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 8
    parts = list(client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=8, stream=True,
                                           extra_body={"ignore_eos": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == full.choices[0].text
    assert parts[-1].choices[0].finish_reason == "length"
    assert [m.id for m in client.models.list()] == ["tiny"]


@pytest.mark.parametrize("body,param,code", [
    ({"prompt": "", "max_tokens": 4}, "prompt", None),
    ({"prompt": [], "max_tokens": 4}, "prompt", None),
    ({"max_tokens": 4}, "prompt", None),
    ({"prompt": 42}, "prompt", None),
    ({"prompt": "hi", "max_tokens": -3}, "max_tokens", None),
    ({"prompt": "hi", "max_tokens": "ten"}, "max_tokens", None),
    ({"prompt": "hi", "stream": "yes"}, "stream", None),
    ({"prompt": "hi", "temperature": -1}, "temperature", None),
    ({"prompt": "hi", "temperature": 2.5}, "temperature", None),
    ({"prompt": "hi", "top_p": 1.5}, "top_p", None),
    ({"prompt": "hi", "top_p": 0}, "top_p", None),
    ({"prompt": "hi", "top_k": -2}, "top_k", None),
    ({"prompt": "hi", "guided_regex": "a+"}, "guided_regex", "unsupported_parameter"),
    ({"prompt": "hi", "guided_choice": ["a", "b"]}, "guided_choice", "unsupported_parameter"),
    ({"prompt": "hi", "response_format": {"type": "json_object"}}, "response_format", "unsupported_parameter"),
    ({"prompt": "hi", "min_tokens": 3}, "min_tokens", "unsupported_parameter"),
    ({"prompt": "hi", "include_stop_str_in_output": "yes"}, "include_stop_str_in_output", None),
    ({"prompt": "hi", "skip_special_tokens": False}, "skip_special_tokens", "unsupported_parameter"),
    ({"prompt": "hi", "min_p": 1.5}, "min_p", None),
    ({"prompt": "hi", "seed": "seven"}, "seed", None),
    ({"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty", None),
    ({"prompt": "hi", "frequency_penalty": -3}, "frequency_penalty", None),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty", None),
    ({"prompt": "hi", "logprobs": 6}, "logprobs", None),
    ({"prompt": "hi", "logprobs": -1}, "logprobs", None),
    ({"prompt": "hi", "n": 0}, "n", None),
    ({"prompt": "hi", "n": 17}, "n", None),
    ({"prompt": "hi", "n": 3}, "n", None),  # more choices than this server's 2 KV slots
    ({"prompt": "hi", "n": 2, "best_of": 1}, "best_of", None),
    ({"prompt": "hi", "best_of": 2, "stream": True}, "best_of", None),
    ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop", None),
    ({"prompt": "hi", "stop": [""]}, "stop", None),
    ({"prompt": "hi", "stop": 7}, "stop", None),
    ({"prompt": "hi", "stop_token_ids": [99999]}, "stop_token_ids", None),
    ({"prompt": "hi", "echo": "yes"}, "echo", None),
    ({"prompt": "hi", "user": 5}, "user", None),
    ({"prompt": [1, 99999]}, "prompt", None),
])
def test_invalid_requests_400(daemon, body, param, code):
    assert_error(post(daemon, body), 400, param=param, code=code)


@pytest.mark.parametrize("body", [
    {"temperature": 0.7, "top_p": 0.5, "top_k": 5, "min_p": 0.01, "seed": 3},
    {"n": 2, "temperature": 1.0},
    {"best_of": 2, "temperature": 1.0},
    {"logprobs": 2},
    {"echo": True, "logprobs": 0},
    {"stop": "zz", "stop_token_ids": [1], "presence_penalty": 0.5, "frequency_penalty": -0.5,
     "repetition_penalty": 1.2},
])
def test_sampling_parameters_are_accepted(daemon, body):
    """What answered 400 "not supported yet" before sampling existed now generates."""
    r = post(daemon, {"prompt": "hi", "max_tokens": 3, "ignore_eos": True, **body})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == body.get("n", 1)


def test_top_k_zero_is_off_as_in_vllm(daemon):
    """vLLM takes top_k 0 as off, like -1: the same seeded tokens as leaving it out."""
    base = {"prompt": "hi", "max_tokens": 6, "ignore_eos": True, "temperature": 1.0, "seed": 11}
    texts = [post(daemon, {**base, **extra}).json()["choices"][0]["text"]
             for extra in ({}, {"top_k": 0}, {"top_k": -1})]
    assert texts[0] == texts[1] == texts[2]


def test_echo_with_max_tokens_zero_scores_the_prompt(daemon):
    """OpenAI's and vLLM's prompt scoring (lm-eval-harness's loglikelihood): echo with max_tokens 0
    returns the prompt and its log-probs, nothing generated, nothing billed; streamed the same. Without
    echo, max_tokens 0 stays a 400."""
    scored = post(daemon, {"prompt": "the cat sat", "max_tokens": 0, "echo": True, "logprobs": 2})
    assert scored.status_code == 200, scored.text
    body = scored.json()
    choice = body["choices"][0]
    assert choice["text"] == "the cat sat" and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    prompt_tokens = body["usage"]["prompt_tokens"]
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["total_tokens"] == prompt_tokens
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == prompt_tokens
    assert lp["token_logprobs"][0] is None and all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    # the same log-probs as the prompt part of an echo that generates
    generated = post(daemon, {"prompt": "the cat sat", "max_tokens": 2, "echo": True, "logprobs": 2,
                              "ignore_eos": True}).json()["choices"][0]["logprobs"]
    assert generated["token_logprobs"][:prompt_tokens] == lp["token_logprobs"]
    with httpx.stream("POST", daemon.url + "/v1/completions", timeout=60,
                      json={"prompt": "the cat sat", "max_tokens": 0, "echo": True, "stream": True}) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "the cat sat"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert_error(post(daemon, {"prompt": "hi", "max_tokens": 0}), 400, param="max_tokens")
    # scoring runs one position past the prompt: a prompt of the whole context says so
    assert_error(post(daemon, {"prompt": [5] * 256, "max_tokens": 0, "echo": True}), 400,
                 code="context_length_exceeded", contains=("echo with max_tokens 0",))
    assert_error(post(daemon, {"prompt": "hi", "max_tokens": False, "echo": True}), 400, param="max_tokens")


def test_include_usage_null_is_not_asked(daemon):
    """vLLM types stream_options.include_usage Optional[bool]: null streams without the usage chunk."""
    with httpx.stream("POST", daemon.url + "/v1/completions", timeout=60,
                      json={"prompt": "hi", "max_tokens": 2, "stream": True,
                            "stream_options": {"include_usage": None}}) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]" and all(json.loads(x).get("usage") is None for x in lines[:-1])
    for falsy in (0, "", []):  # only null means "not asked"
        assert_error(post(daemon, {"prompt": "hi", "stream": True, "stream_options": {"include_usage": falsy}}), 400,
                     param="stream_options")


def test_unknown_fields_are_ignored(daemon):
    assert post(daemon, {"prompt": "hi", "max_tokens": 2, "user": "x", "some_vendor_field": {"a": 1}}).status_code == 200


def test_malformed_json_400(daemon):
    r = httpx.post(daemon.url + "/v1/completions", content=b"{not json", timeout=30)
    assert_error(r, 400, contains=("JSON",))


def test_over_context_400_names_lengths(daemon):
    assert_error(post(daemon, {"prompt": [5] * 200, "max_tokens": 100}), 400, code="context_length_exceeded",
                 contains=("256", "200", "100"))


def test_unknown_model_404(daemon):
    assert_error(post(daemon, {"model": "gpt-9", "prompt": "hi"}), 404, param="model", code="model_not_found")


def test_body_too_large_413(daemon):
    assert_error(post(daemon, {"prompt": "x" * 10000}), 413, code="request_too_large")


def test_queue_full_429_with_retry_after(daemon):
    """max_active 2 + max_pending 1: the fourth concurrent request is refused, the others complete."""
    results: list[int] = []
    body = {"prompt": [5, 6], "max_tokens": 200, "ignore_eos": True}
    threads = [threading.Thread(target=lambda: results.append(post(daemon, body).status_code)) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while httpx.get(daemon.url + "/ready").json()["scheduler"]["waiting"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    r = post(daemon, body)
    assert_error(r, 429, code="queue_full")
    assert 1 <= int(r.headers["retry-after"]) <= 60  # whole seconds from the queue and the service rate
    assert r.headers["x-request-id"].startswith("cmpl-")  # refused after it got an id: traceable
    for t in threads:
        t.join()
    assert results == [200, 200, 200]


def test_cancel_endpoint(daemon):
    with httpx.stream("POST", daemon.url + "/v1/completions", timeout=60,
                      json={"prompt": [5, 6], "max_tokens": 240, "stream": True, "ignore_eos": True}) as r:
        rid = r.headers["x-request-id"]
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["id"] == rid
        c = httpx.post(f"{daemon.url}/v1/completions/{rid}/cancel")
        assert c.status_code == 200 and c.json()["cancelled"] is True
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["error"]["code"] == "request_cancelled"
    assert_error(httpx.post(f"{daemon.url}/v1/completions/{rid}/cancel"), 404, code="request_not_found")


def test_error_after_stream_started_is_an_error_chunk(daemon):
    with httpx.stream("POST", daemon.url + "/v1/completions", timeout=60,
                      json={"prompt": [8, 9], "max_tokens": 240, "stream": True, "ignore_eos": True}) as r:
        rid = r.headers["x-request-id"]
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        assert httpx.post(f"{daemon.url}/debug/fail/{rid}").status_code == 200
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    err = json.loads(rest[-2][6:])["error"]
    assert err == {"message": "the engine failed while running this request", "type": "server_error",
                   "param": None, "code": "engine_failed"}  # the engine's own text stays in the server
    logged = [json.loads(line) for line in daemon.log().splitlines() if '"event":"request_failed"' in line]
    assert any(e["request_id"] == rid and "injected failure" in e["error"] for e in logged)


def test_api_key_401(tiny_model_dir):
    with DaemonProcess("--model", str(tiny_model_dir), "--api-key", "s3cret") as d:
        assert_error(post(d, {"prompt": "hi"}), 401, code="invalid_api_key")
        assert_error(post(d, {"prompt": "hi"}, headers={"Authorization": "Bearer nope"}), 401)
        ok = post(d, {"prompt": "hi", "max_tokens": 2}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert httpx.get(d.url + "/health").status_code == 200  # health stays open


def test_loading_503(tiny_model_dir):
    d = DaemonProcess("--model", str(tiny_model_dir), "--debug-load-delay", "3")
    d.start(wait_ready=False)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = post(d, {"prompt": "hi", "max_tokens": 2})
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert_error(r, 503, code="not_ready")
        assert httpx.get(d.url + "/ready").status_code == 503
        assert httpx.get(d.url + "/health").status_code == 200
        d.wait_ready()
        assert post(d, {"prompt": "hi", "max_tokens": 2}).status_code == 200
    finally:
        assert d.stop() == 0
