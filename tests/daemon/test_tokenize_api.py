"""vLLM's /tokenize, /detokenize and /version on the in-process daemon (tiny model): a prompt's ids are
the ids a completion runs (its usage counts them), chat messages' ids the rendered template's (the
chat reply's usage counts them), detokenize inverts tokenize, and every bad body is an OpenAI error
JSON with the right status; behind --api-key like /v1/*."""
from __future__ import annotations

import pytest

from pegainfer.daemon.chat_template import load_chat_template
from pegainfer.engine.tokenizer import Tokenizer
from tests.daemon.inprocess import InProcessDaemon

HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def daemon(tiny_model_dir):
    with InProcessDaemon(tiny_model_dir, max_active=2, max_model_len=MAX_MODEL_LEN) as d:
        yield d


def post(daemon, path: str, **body):
    return daemon.client.post(path, json=body)


def assert_error(r, status: int, param: str | None = None, code: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert (param is None or err["param"] == param) and (code is None or err["code"] == code), err


def test_a_prompts_ids_are_the_ones_a_completion_runs(daemon, tiny_model_dir):
    tok = Tokenizer(tiny_model_dir)
    text = "def f(x):\n    return x * 2  # é 日本"
    r = post(daemon, "/tokenize", model="tiny", prompt=text)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok.encode(text) and body["tokens"][0] == tok.bos_id
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == MAX_MODEL_LEN
    assert body["token_strs"] is None
    used = post(daemon, "/v1/completions", prompt=text, max_tokens=1).json()["usage"]["prompt_tokens"]
    assert used == body["count"]
    plain = post(daemon, "/tokenize", prompt=text, add_special_tokens=False, return_token_strs=True).json()
    assert plain["tokens"] == body["tokens"][1:]
    # the vocabulary's byte-level pieces, as vLLM returns them: GPT-2's alphabet spelling the text's bytes
    from pegainfer.engine.tokenizer import _unicode_to_byte
    table = _unicode_to_byte()
    assert len(plain["token_strs"]) == len(plain["tokens"])
    assert bytes(table[c] for piece in plain["token_strs"] for c in piece) == text.encode()


def test_chat_messages_tokenize_as_the_chat_route_renders_them(daemon, tiny_model_dir):
    text = load_chat_template(tiny_model_dir).render(HELLO)
    want = Tokenizer(tiny_model_dir).encode(text, add_bos=False)
    got = post(daemon, "/tokenize", messages=HELLO).json()
    assert got["tokens"] == want
    used = post(daemon, "/v1/chat/completions", messages=HELLO, max_tokens=1).json()["usage"]["prompt_tokens"]
    assert used == got["count"]
    no_prompt = post(daemon, "/tokenize", messages=HELLO, add_generation_prompt=False).json()
    assert no_prompt["count"] < got["count"]
    cont = HELLO + [{"role": "assistant", "content": "Well"}]
    ids = post(daemon, "/tokenize", messages=cont, continue_final_message=True, add_generation_prompt=False).json()
    assert Tokenizer(tiny_model_dir).decode(ids["tokens"]).endswith("Assistant: Well")


def test_detokenize_inverts_tokenize_and_skips_special_tokens(daemon, tiny_model_dir):
    text = "Zażółć gęślą jaźń 🙂"
    ids = post(daemon, "/tokenize", prompt=text).json()["tokens"]
    r = post(daemon, "/detokenize", model="tiny", tokens=ids)
    assert r.status_code == 200 and r.json() == {"prompt": text}


@pytest.mark.parametrize("path,body,status,param", [
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages"),
    ("/tokenize", {"messages": HELLO, "continue_final_message": True, "add_generation_prompt": True}, 400,
     "continue_final_message"),
    ("/tokenize", {"prompt": "x", "model": "gpt-9"}, 404, "model"),
    ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, 10**6]}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, -1]}, 400, "tokens"),
    ("/detokenize", {"tokens": [True]}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "model": "gpt-9"}, 404, "model"),
])
def test_bad_bodies_are_openai_errors(daemon, path, body, status, param):
    assert_error(post(daemon, path, **body), status, param)


def test_malformed_and_mistyped_bodies(daemon):
    assert_error(daemon.client.post("/tokenize", content=b"{nope"), 400)
    assert_error(daemon.client.post("/detokenize", content=b"[1, 2]"), 400)
    assert_error(daemon.client.post("/tokenize", content=b"x", headers={"Content-Type": "text/plain"}), 415,
                 code="unsupported_media_type")
    assert_error(daemon.client.get("/tokenize"), 405)


def test_version(daemon):
    r = daemon.client.get("/version")
    assert r.status_code == 200 and isinstance(r.json()["version"], str) and r.json()["version"]


def test_the_tokenizer_routes_are_behind_the_api_key(tiny_model_dir):
    with InProcessDaemon(tiny_model_dir, max_active=1, max_model_len=MAX_MODEL_LEN, api_key="sekret") as d:
        assert_error(d.client.post("/tokenize", json={"prompt": "hi"}), 401)
        assert_error(d.client.post("/detokenize", json={"tokens": [1]}), 401)
        ok = d.client.post("/tokenize", json={"prompt": "hi"}, headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200 and ok.json()["count"] >= 1
        assert d.client.get("/version").status_code == 200
