"""POST /v1/chat/completions through the official openai client against the real app in this process
(tiny model, CPU): the reply is the completion of the rendered template, stream and non-stream alike
(role first, content, finish reason, usage), with the completions' sampling, n, stop, log-probs in the
chat shape, logit_bias, max_completion_tokens and, without a limit, the rest of the context; and
every refusal is an OpenAI error: bad messages, unsupported features, top_logprobs past the engine's
bound, no chat template, a template that refuses the messages, too long a conversation."""
from __future__ import annotations

import json
import shutil

import openai
import pytest

from pegainfer.engine.checkpoint_writer import tokenizer_config
from pegainfer.engine.tokenizer import Tokenizer
from tests.daemon.inprocess import InProcessDaemon

HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
RENDERED = "<\uff5cbegin\u2581of\u2581sentence\uff5c>Be brief.\n\nUser: Hello there\n\nAssistant:"
MAX_MODEL_LEN = 96


@pytest.fixture(scope="module")
def daemon(tiny_model_dir):
    with InProcessDaemon(tiny_model_dir, max_active=4, max_model_len=MAX_MODEL_LEN) as d:
        yield d


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return daemon.openai()


@pytest.fixture(scope="module")
def prompt_ids(tiny_model_dir) -> list[int]:
    """The rendered conversation's token ids: the template writes BOS itself, and none is added."""
    ids = Tokenizer(tiny_model_dir).encode(RENDERED, add_bos=False)
    assert ids.count(Tokenizer(tiny_model_dir).bos_id) == 1
    return ids


def completion(daemon, **body) -> dict:
    r = daemon.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def chat(daemon, **body):
    return daemon.client.post("/v1/chat/completions", json={"messages": HELLO, **body})


def assert_error(r, status: int, param: str | None = None, code: str | None = None, contains: str = "") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert (param is None or err["param"] == param) and (code is None or err["code"] == code), err
    assert contains in err["message"], err
    return err


def test_non_streamed_reply_is_the_completion_of_the_rendered_conversation(daemon, client, prompt_ids):
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=8, extra_body={"ignore_eos": True})
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-") and len(reply.id) == 9 + 32
    [choice] = reply.choices
    assert choice.index == 0 and choice.message.role == "assistant" and choice.finish_reason == "length"
    same = completion(daemon, prompt=prompt_ids, max_tokens=8, ignore_eos=True)
    assert choice.message.content == same["choices"][0]["text"]
    assert reply.usage.prompt_tokens == len(prompt_ids) and reply.usage.completion_tokens == 8
    assert reply.usage.total_tokens == len(prompt_ids) + 8


def test_streamed_reply_opens_with_the_role_and_equals_the_whole_one(client):
    body = dict(model="tiny", messages=HELLO, max_tokens=8, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**body).choices[0].message.content
    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].id.startswith("chatcmpl-")
    first = chunks[0].choices[0]
    assert first.delta.role == "assistant" and first.delta.content == "" and first.finish_reason is None
    assert all(c.choices[0].delta.role is None for c in chunks[1:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == whole
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_text_parts_are_joined_and_developer_is_system(client):
    base = dict(model="tiny", max_tokens=6, extra_body={"ignore_eos": True})
    plain = client.chat.completions.create(messages=[{"role": "system", "content": "a\nb"},
                                                     {"role": "user", "content": "Hello"}], **base)
    parts = client.chat.completions.create(messages=[
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}]}], **base)
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens


def test_n_seed_and_stop_behave_as_in_completions(daemon, client, prompt_ids):
    sampled = dict(max_tokens=10, temperature=1.0, seed=5, n=2)
    reply = client.chat.completions.create(model="tiny", messages=HELLO, **sampled, extra_body={"ignore_eos": True})
    same = completion(daemon, prompt=prompt_ids, ignore_eos=True, **sampled)
    assert [c.index for c in reply.choices] == [0, 1]
    assert [c.message.content for c in reply.choices] == [c["text"] for c in same["choices"]]
    streamed: dict[int, str] = {}
    for c in client.chat.completions.create(model="tiny", messages=HELLO, stream=True, **sampled,
                                            extra_body={"ignore_eos": True}):
        for ch in c.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + (ch.delta.content or "")
    assert streamed == {c.index: c.message.content for c in reply.choices}
    text = reply.choices[0].message.content
    stop = text[3:6]
    cut = client.chat.completions.create(model="tiny", messages=HELLO, stop=[stop], extra_body={"ignore_eos": True},
                                         max_tokens=10, temperature=1.0, seed=5)
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].message.content == text[:text.find(stop)]


def test_logprobs_come_in_the_chat_shape_and_equal_the_completions(daemon, client, prompt_ids):
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=5, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    same = completion(daemon, prompt=prompt_ids, max_tokens=5, logprobs=3)["choices"][0]["logprobs"]
    assert [e.token for e in content] == same["tokens"]
    assert [e.logprob for e in content] == pytest.approx(same["token_logprobs"])
    for e in content:
        # a token's bytes spell its text (U+FFFD where it holds part of a character)
        assert len(e.top_logprobs) == 3 and bytes(e.bytes).decode("utf-8", "replace") == e.token
        assert all(bytes(t.bytes).decode("utf-8", "replace") == t.token for t in e.top_logprobs)
        ranked = [t.logprob for t in e.top_logprobs]
        assert ranked == sorted(ranked, reverse=True) and e.logprob <= ranked[0] + 1e-6
    only = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3, logprobs=True)
    assert [e.top_logprobs for e in only.choices[0].logprobs.content] == [[], [], []]
    assert client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=3).choices[0].logprobs is None


def test_logit_bias_steers_the_reply(daemon, client, tiny_model_dir):
    tok = Tokenizer(tiny_model_dir)
    target = tok.encode(" mountain", add_bos=False)[0]
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=4, logit_bias={str(target): 100},
                                           extra_body={"ignore_eos": True})
    assert reply.choices[0].message.content == tok.decode([target] * 4)


def test_max_completion_tokens_and_the_default_of_the_rest_of_the_context(client, prompt_ids):
    short = client.chat.completions.create(model="tiny", messages=HELLO, max_completion_tokens=3, max_tokens=50,
                                           extra_body={"ignore_eos": True})
    assert short.usage.completion_tokens == 3
    full = client.chat.completions.create(model="tiny", messages=HELLO, extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == MAX_MODEL_LEN - len(prompt_ids)


def test_the_callers_request_id_names_the_reply(daemon):
    r = chat(daemon, max_tokens=2, stream=True)
    assert r.headers["x-request-id"].startswith("chatcmpl-")
    r = daemon.client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2},
                           headers={"X-Request-Id": "conversation-17"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "conversation-17" and r.json()["id"] == "conversation-17"


@pytest.mark.parametrize("body,param,contains", [
    ({"messages": None}, "messages", "required"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": "Hello"}, "messages", "non-empty list"),
    ({"messages": ["Hello"]}, "messages", "messages[0]"),
    ({"messages": [{"content": "hi"}]}, "messages", "role"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages", "'robot'"),
    ({"messages": [{"role": ["user"], "content": "hi"}]}, "messages", "role"),
    ({"messages": [{"role": "user"}]}, "messages", "content' is required"),
    ({"messages": [{"role": "user", "content": 7}]}, "messages", "string or a list"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages",
     "'image_url'"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, "messages", "text' must be"),
    ({"messages": [{"role": "user", "content": ["hi"]}]}, "messages", "text part"),
    ({"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages", "name"),
    ({"messages": [{"role": "tool", "content": "42", "tool_call_id": "a"}]}, "messages", "tool calling"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "a"}]}]}, "messages", "tool"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "tool calling"),
    ({"tool_choice": "required"}, "tool_choice", "tool calling"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}, "tools", "tool calling"),
    ({"tools": ["f"], "tool_choice": "none"}, "tools", "tool objects"),
    ({"guided_json": {"type": "object"}}, "guided_json", "structured output"),
    ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs", "structured output"),
    ({"min_tokens": 5}, "min_tokens", "not supported"),
    ({"echo": True}, "echo", "not supported"),
    ({"response_format": {"type": "json_object"}}, "response_format", "structured output"),
    ({"modalities": ["text", "audio"]}, "modalities", "audio"),
    ({"logprobs": True, "top_logprobs": 6}, "top_logprobs", "[0, 5] on this server"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 5]"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "[0, 5]"),
    ({"top_logprobs": 2}, "top_logprobs", "needs 'logprobs': true"),
    ({"logprobs": 3}, "logprobs", "boolean"),
    ({"messages": [{"content": "no role"}]}, "messages", "role' is required"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", ">= 1"),
    ({"temperature": 3}, "temperature", "[0, 2]"),
    ({"n": 17}, "n", None),
    ({"stream_options": {"include_usage": True}}, "stream_options", "stream"),
    ({"add_generation_prompt": "yes"}, "add_generation_prompt", "boolean"),
    ({"stop_token_ids": [10**6]}, "stop_token_ids", "vocabulary"),
])
def test_bad_chat_bodies_are_400(daemon, body, param, contains):
    assert_error(chat(daemon, max_tokens=2, **body), 400, param, contains=contains or "")


def test_chat_logprob_bytes_are_each_tokens_own_even_inside_a_character(daemon, tiny_model_dir):
    """OpenAI: `bytes` are the token's UTF-8 bytes, to be joined for the text. Two tokens that each
    hold half of "é" (0xC3, 0xA9) forced by logit_bias: each carries its own byte (its decoded text
    is U+FFFD), and the bytes of every token joined decode to the reply's content."""
    tok = Tokenizer(tiny_model_dir)
    halves = {tok.token_bytes(i): i for i in range(tok.vocab_size)}
    lead, tail = halves[b"\xc3"], halves[b"\xa9"]
    r = chat(daemon, max_tokens=6, temperature=1, seed=5, logit_bias={str(lead): 100, str(tail): 100},
             logprobs=True, top_logprobs=2)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 6 and all(e["bytes"] in ([0xC3], [0xA9]) for e in content), content
    assert all(bytes(t["bytes"]).decode("utf-8", "replace") == t["token"] for e in content for t in e["top_logprobs"])
    joined = bytes(b for e in content for b in e["bytes"])
    assert joined.decode("utf-8", "replace") == choice["message"]["content"]
    assert "\u00e9" in choice["message"]["content"] or b"\xc3\xa9" not in joined


def test_continue_final_message_continues_the_assistants_text(daemon, tiny_model_dir):
    """vLLM's continue_final_message: the prompt ends inside the last (assistant) message, so the reply
    continues it: the same tokens as a completion of that rendered text; with add_generation_prompt
    also sent true, a 400 (as vLLM); chat_template_kwargs reach the template without harm."""
    from pegainfer.daemon.chat_template import load_chat_template
    messages = HELLO + [{"role": "assistant", "content": "The answer is"}]
    text = load_chat_template(tiny_model_dir).render(messages, False, continue_final=True)
    assert text.endswith("Assistant: The answer is")
    ids = Tokenizer(tiny_model_dir).encode(text, add_bos=False)
    want = completion(daemon, prompt=ids, max_tokens=4, ignore_eos=True)["choices"][0]["text"]
    r = daemon.client.post("/v1/chat/completions", json={
        "messages": messages, "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 4,
        "ignore_eos": True, "chat_template_kwargs": {"unused_flag": True}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == want
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    both = daemon.client.post("/v1/chat/completions", json={"messages": messages, "continue_final_message": True,
                                                             "add_generation_prompt": True})
    assert_error(both, 400, "continue_final_message", contains="cannot both be true")
    assert_error(chat(daemon, continue_final_message="yes"), 400, "continue_final_message")
    assert_error(chat(daemon, chat_template_kwargs=[1]), 400, "chat_template_kwargs")
    assert_error(chat(daemon, chat_template_kwargs=[]), 400, "chat_template_kwargs")
    assert_error(chat(daemon, user=5), 400, "user")
    assert_error(chat(daemon, tools=[]), 400, "tools", contains="empty")


def test_top_logprobs_zero_needs_no_logprobs_and_whole_floats_count(daemon):
    """vLLM's checks: top_logprobs 0 without logprobs asks for nothing (200, no log-probs); 3.0
    where an integer goes is 3."""
    r = chat(daemon, max_tokens=3.0, top_logprobs=0, logprobs=False)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["logprobs"] is None and r.json()["usage"]["completion_tokens"] == 3
    assert_error(chat(daemon, max_tokens=2, top_logprobs=1), 400, "top_logprobs", contains="needs 'logprobs': true")


def test_accepted_no_op_fields_and_the_text_response_format(daemon):
    r = chat(daemon, max_tokens=2, user="u1", store=False, metadata={"a": "b"}, response_format={"type": "text"},
             tool_choice="none", modalities=["text"], parallel_tool_calls=False)
    assert r.status_code == 200, r.text
    # tools that may not be called (OpenAI and vLLM take them), and vLLM's extensions at their no-op values
    r = chat(daemon, max_tokens=2, tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="none",
             min_tokens=0, skip_special_tokens=True, guided_json=None, echo=False)
    assert r.status_code == 200, r.text


def test_too_long_a_conversation_is_a_400_naming_the_lengths(daemon):
    long = [{"role": "user", "content": "word " * 200}]
    assert_error(daemon.client.post("/v1/chat/completions", json={"messages": long}), 400, "messages",
                 "context_length_exceeded", "maximum context length is 96")
    assert_error(chat(daemon, max_tokens=MAX_MODEL_LEN), 400, "messages", "context_length_exceeded")


def test_unknown_model_404_and_bad_json_400(daemon):
    assert_error(chat(daemon, model="gpt-4o"), 404, "model", "model_not_found")
    assert_error(daemon.client.post("/v1/chat/completions", content=b"{"), 400)
    assert daemon.ready()["scheduler"]["running"] == 0


def test_models_retrieve(client, daemon):
    card = client.models.retrieve("tiny")
    assert card.id == "tiny" and card.object == "model" and card.owned_by == "pegainfer"
    assert daemon.client.get("/v1/models/tiny").json() == daemon.client.get("/v1/models").json()["data"][0]
    for missing in ("gpt-4o", "org/model"):
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve(missing)
        assert_error(daemon.client.get(f"/v1/models/{missing}"), 404, "model", "model_not_found", repr(missing))


def test_openai_client_sees_the_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=HELLO, logprobs=True, top_logprobs=20)
    assert e.value.status_code == 400 and "top_logprobs" in str(e.value)


@pytest.fixture(scope="module")
def variants(tiny_model_dir, tmp_path_factory):
    """The tiny checkpoint without a chat template, and with one that refuses a system message."""
    out = {}
    for name, template in (("plain", None), ("strict", "{% if messages[0]['role'] == 'system' %}"
                                                        "{{ raise_exception('System role not supported') }}{% endif %}"
                                                        "{% for m in messages %}{{ m['content'] }}{% endfor %}")):
        folder = tmp_path_factory.mktemp(name) / "model"
        shutil.copytree(tiny_model_dir, folder)
        config = tokenizer_config(chat_template=False)
        if template is not None:
            config["chat_template"] = template
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        out[name] = folder
    return out


def test_a_model_without_a_chat_template_answers_400_and_still_completes(variants):
    with InProcessDaemon(variants["plain"], max_active=2) as d:
        err = assert_error(d.client.post("/v1/chat/completions", json={"messages": HELLO}), 400, "messages",
                           "no_chat_template", "no usable chat template")
        assert "/v1/completions" in err["message"]
        with pytest.raises(openai.BadRequestError):
            d.openai().chat.completions.create(model="tiny", messages=HELLO, stream=True)
        assert d.client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2}).status_code == 200
        assert d.ready()["scheduler"]["rejected"] == 0  # refused before it became a request


def test_a_template_that_refuses_the_messages_is_a_400_with_its_words(variants):
    with InProcessDaemon(variants["strict"], max_active=2) as d:
        assert_error(d.client.post("/v1/chat/completions", json={"messages": HELLO}), 400, "messages",
                     contains="System role not supported")
        ok = d.client.post("/v1/chat/completions", json={"messages": HELLO[1:], "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == len(Tokenizer(variants["strict"])
                                                                                     .encode("Hello there", False))
