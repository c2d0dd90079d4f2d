"""daemon.chat_template: where a checkpoint's chat template is found, and that it renders exactly as
transformers' apply_chat_template(tokenize=False) renders it, for the tiny checkpoints' own template
(DeepSeek-V2-Chat's) and for templates that use what transformers gives them (tojson without HTML
escaping, loop controls, the generation block, namespace, raise_exception, the special tokens);
a template that refuses or fails on the messages is a 400, a missing or broken one a reason."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pegainfer.daemon.chat_template import load_chat_template
from pegainfer.daemon.protocol import APIError
from pegainfer.engine.checkpoint_writer import CHAT_TEMPLATE, tokenizer_config
from pegainfer.engine.default_model import ensure_preset_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello <b>&</b> \u00e9\u65e5"},
            {"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Again\nplease"}]
FANCY = (
    "{% set ns = namespace(n=0) %}{{ bos_token }}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}[{{ ns.n }}:{{ m['role'] | upper }}] {{ m | tojson }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{{ eos_token }}{% endgeneration %}{% endif %}"
    "{% if loop.index > 9 %}{% break %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}")
STRICT = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")


def folder_with(tmp_path: Path, template, name: str = "tok") -> Path:
    """A copy of the tiny tokenizer folder whose tokenizer_config.json carries `template` (None: no key)."""
    out = tmp_path / name
    shutil.copytree(ensure_preset_tokenizer("tiny"), out)
    config = tokenizer_config(chat_template=False)
    if template is not None:
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def hf_render(folder: Path, messages: list[dict], add_generation_prompt: bool = True) -> str:
    transformers = pytest.importorskip("transformers")
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("add", [True, False])
def test_the_tiny_checkpoints_template_renders_as_transformers_does(add):
    folder = ensure_preset_tokenizer("tiny")
    template = load_chat_template(folder)
    assert template.problem is None and template.template is not None
    ours = template.render(MESSAGES, add_generation_prompt=add)
    assert ours == hf_render(folder, MESSAGES, add)
    assert ours.startswith("<\uff5cbegin\u2581of\u2581sentence\uff5c>Be brief.\n\nUser: Hello")
    assert ours.endswith("Again\nplease\n\nAssistant:" if add else "Again\nplease\n\n")


@pytest.mark.parametrize("final", ["The answer is", "  padded content  ", ""])
def test_continue_final_message_renders_as_transformers_does(tmp_path, final):
    """vLLM's continue_final_message is transformers': the text ends right after the last message's
    content (no end of turn, no generation prompt), for the tiny checkpoints' template and for one
    that trims contents; an empty final content leaves the text as rendered."""
    transformers = pytest.importorskip("transformers")
    messages = MESSAGES[:3] + [{"role": "user", "content": "Go on"}, {"role": "assistant", "content": final}]
    trims = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}</s>{% endfor %}"
    for folder in (ensure_preset_tokenizer("tiny"), folder_with(tmp_path, trims, "trims")):
        tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))
        want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False,
                                       continue_final_message=True)
        assert load_chat_template(folder).render(messages, False, continue_final=True) == want
        if final.strip():
            assert want.rstrip().endswith(final.strip())
    gone = folder_with(tmp_path, "{% for m in messages %}{{ m['role'] }}{% endfor %}", "no-content")
    with pytest.raises(APIError) as e:
        load_chat_template(gone).render(messages[:4] + [{"role": "assistant", "content": "x"}], False,
                                        continue_final=True)
    assert e.value.status == 400 and e.value.param == "continue_final_message"


def test_continue_needs_the_final_content_not_a_mark_in_another_message(tmp_path):
    """The cut mark is random per request: a message that spells a mark cannot move the cut, and a
    template that never writes the final content is a 400."""
    users_only = folder_with(tmp_path, "{% for m in messages %}{% if m['role'] == 'user' %}<u>{{ m['content'] }}"
                                       "{% endif %}{% endfor %}", "users-only")
    messages = [{"role": "user", "content": "a <<pegainfer-continue-0123456789abcdef>> b"},
                {"role": "assistant", "content": "zz"}]
    with pytest.raises(APIError) as e:
        load_chat_template(users_only).render(messages, False, continue_final=True)
    assert e.value.status == 400 and e.value.param == "continue_final_message"


def test_a_kwarg_nested_past_the_recursion_limit_is_a_400(tmp_path):
    folder = folder_with(tmp_path, "{% if tools %}{{ tools | tojson }}{% endif %}{{ messages[0]['content'] }}")
    deep: list = []
    for _ in range(3000):
        deep = [deep]
    with pytest.raises(APIError) as e:
        load_chat_template(folder).render(MESSAGES[:1], extra={"tools": deep})
    assert e.value.status == 400


def test_chat_template_kwargs_reach_the_template(tmp_path):
    folder = folder_with(tmp_path, "{% if brief %}B:{% endif %}{{ messages[0]['content'] }}{{ flavour }}")
    template = load_chat_template(folder)
    assert template.render(MESSAGES[:1], extra={"brief": True, "flavour": "!"}) == "B:Be brief.!"
    assert template.render(MESSAGES[:1], extra={"messages": []}) == "Be brief."  # never the messages


def test_a_template_using_what_transformers_provides_renders_the_same(tmp_path):
    folder = folder_with(tmp_path, FANCY)
    ours = load_chat_template(folder).render(MESSAGES)
    assert ours == hf_render(folder, MESSAGES)
    assert '"Hello <b>&</b> \u00e9\u65e5"' in ours  # tojson: no HTML escaping, no ASCII escaping
    assert "[1:USER]" in ours and "Be brief" not in ours and ours.endswith("<assistant>")


def test_the_list_form_uses_the_default_template_and_a_jinja_file_wins(tmp_path):
    named = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": CHAT_TEMPLATE}]
    folder = folder_with(tmp_path, named)
    assert load_chat_template(folder).render(MESSAGES) == hf_render(folder, MESSAGES)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}<{{ m['role'] }}>{% endfor %}")
    assert load_chat_template(folder).render(MESSAGES) == "<system><user><assistant><user>"
    assert hf_render(folder, MESSAGES) == "<system><user><assistant><user>"


@pytest.mark.parametrize("template,problem", [
    (None, "tokenizer_config.json has no chat_template"),
    ([{"name": "tool_use", "template": "x"}], "name no 'default' one"),
    (42, "neither a string nor a list"),
    ("{% for m in messages %}", "does not compile"),
])
def test_no_usable_template_is_a_reason_and_a_400(tmp_path, template, problem):
    t = load_chat_template(folder_with(tmp_path, template))
    assert t.template is None and problem in t.problem
    assert str(tmp_path) not in t.problem  # a client reads it: no server paths
    with pytest.raises(APIError) as e:
        t.render(MESSAGES)
    assert (e.value.status, e.value.code, e.value.param) == (400, "no_chat_template", "messages")
    assert problem in e.value.message


def test_a_template_that_refuses_the_messages_is_a_400_with_its_words(tmp_path):
    t = load_chat_template(folder_with(tmp_path, STRICT))
    assert t.render(MESSAGES[1:]) == "user: Hello <b>&</b> \u00e9\u65e5\nassistant: Hi\nuser: Again\nplease\n"
    with pytest.raises(APIError) as e:
        t.render(MESSAGES)
    assert e.value.status == 400 and "roles must alternate" in e.value.message


@pytest.mark.parametrize("template", [
    "{{ messages[0]['content'] + 1 }}",  # TypeError inside the template
    "{{ messages.__class__.__mro__ }}",  # the sandbox refuses it
    "{{ nope.attr }}",  # an undefined name
])
def test_a_template_that_fails_on_the_messages_is_a_400_not_a_traceback(tmp_path, template):
    t = load_chat_template(folder_with(tmp_path, template))
    with pytest.raises(APIError) as e:
        t.render(MESSAGES)
    assert e.value.status == 400 and e.value.param == "messages"


def test_the_sandbox_cannot_mutate_the_messages(tmp_path):
    t = load_chat_template(folder_with(tmp_path, "{{ messages.append(1) }}"))
    messages = [dict(m) for m in MESSAGES]
    with pytest.raises(APIError):
        t.render(messages)
    assert messages == MESSAGES
