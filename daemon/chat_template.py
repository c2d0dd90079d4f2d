"""The checkpoint's chat template, rendered as transformers renders it (`apply_chat_template` with
`tokenize=False`): a jinja2 ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension and a `{% generation %}` block that renders its body, the `tojson` filter
without HTML escaping, `raise_exception`, `strftime_now`, and the tokenizer's special tokens
(`bos_token`, `eos_token`, ...) as variables beside `messages`, `tools`, `documents` and
`add_generation_prompt`.

Where it comes from, as transformers looks: `chat_template.jinja` in the checkpoint folder, else
`chat_template` in tokenizer_config.json, a string, or the list of named templates
(`[{"name": ..., "template": ...}]`) of which the one named "default" is used. A checkpoint without
one (or whose template does not compile) serves no chat: `problem` says why, and the chat route
answers 400 with it."""
from __future__ import annotations

import dataclasses
import json
import secrets
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pegainfer.daemon.protocol import APIError, bad_request

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
MAX_ERROR_CHARS = 300  # of a template's own error message, in a client's 400
# continue_final_message: where the final content ends (with a random part per request, so that no
# message can carry it)
CONTINUE_MARK = "<<pegainfer-continue-{}>> "


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (templates that mark the assistant's tokens for
    training): renders its body, as transformers does when it is not tracking them."""
    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@dataclasses.dataclass(frozen=True, slots=True)
class ChatTemplate:
    template: jinja2.Template | None
    special: dict[str, str]  # bos_token, eos_token, ... as the template sees them
    source: str  # where it came from (for the start-up log)
    problem: str | None = None  # why this checkpoint serves no chat

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               continue_final: bool = False, extra: dict[str, Any] | None = None) -> str:
        """The prompt text of `messages`; a 400 when the template refuses them (its raise_exception)
        or fails on them. continue_final (vLLM's and transformers' continue_final_message): the text
        ends right after the last message's content, so the model continues that message; extra:
        the request's chat_template_kwargs, more names for the template (they may override the
        defaults given here, as in vLLM, but not `messages`)."""
        if self.template is None:
            raise APIError(400, f"this model has no usable chat template ({self.problem}); send the prompt to "
                                f"/v1/completions instead", "invalid_request_error", "messages", "no_chat_template")
        names = {"tools": None, "documents": None, "add_generation_prompt": add_generation_prompt, **self.special,
                 **(extra or {}), "messages": messages}
        if not continue_final:
            return self._render(names)
        final, mark = messages[-1]["content"], CONTINUE_MARK.format(secrets.token_hex(8))
        names["messages"] = [*messages[:-1], {**messages[-1], "content": final + mark}]  # where the content ends
        return _open_ended(self._render(names), final, mark)

    def _render(self, names: dict[str, Any]) -> str:
        assert self.template is not None
        try:
            return self.template.render(**names)
        except jinja2.exceptions.TemplateError as e:  # raise_exception, an undefined name, a sandbox refusal
            raise bad_request(f"the chat template refused these messages: {_short(e)}", "messages") from None
        # the template's own code failed on them (RecursionError: a kwarg nested ~1,000 deep through tojson)
        except (TypeError, ValueError, LookupError, ArithmeticError, RecursionError) as e:
            raise bad_request(f"the chat template failed on these messages: {type(e).__name__}: {_short(e)}",
                              "messages") from None


def _open_ended(text: str, final: str, mark: str) -> str:
    """The text rendered with `mark` after the last message's content, cut where the content
    ends (what transformers 5 does for continue_final_message): at the mark, or, where the template
    trimmed the content's end (and the mark's space with it), at the mark less the trailing space
    before it; a 400 when the template did not write the content and the mark."""
    at = text.rfind(mark.strip())
    if at < 0 or final.strip() not in text:
        raise bad_request("'continue_final_message' is set but the chat template did not write the final "
                          "message's content, so it cannot be continued", "continue_final_message")
    return text[:at] if text.startswith(mark, at) else text[:at].rstrip()


def _short(e: Exception) -> str:
    text = str(e)
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "..."


def load_chat_template(folder: str | Path) -> ChatTemplate:
    """The chat template of the checkpoint (or tokenizer) folder; never raises: a missing or broken
    template is a ChatTemplate whose `problem` says what is wrong."""
    folder = Path(folder)
    config: dict = {}
    config_path = folder / CONFIG_FILE
    try:
        if config_path.is_file():
            loaded = json.loads(config_path.read_text(encoding="utf-8"))
            config = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError) as e:
        return ChatTemplate(None, {}, f"{config_path}: {e}", f"{CONFIG_FILE} could not be read")
    special = _special_tokens(config)
    try:
        source, text, problem = _template_source(folder, config)
    except (OSError, ValueError) as e:  # an unreadable chat_template.jinja
        return ChatTemplate(None, special, f"{folder / TEMPLATE_FILE}: {e}", f"{TEMPLATE_FILE} could not be read")
    if text is None:
        return ChatTemplate(None, special, source, problem)
    try:
        return ChatTemplate(compile_template(text), special, source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        return ChatTemplate(None, special, source, f"the chat template does not compile: {_short(e)}")


def _template_source(folder: Path, config: dict) -> tuple[str, str | None, str | None]:
    """(where it is, for the log; the template text; why there is none). The reason names files,
    never the server's paths: a client reads it."""
    jinja_file = folder / TEMPLATE_FILE
    if jinja_file.is_file():
        return str(jinja_file), jinja_file.read_text(encoding="utf-8"), None
    raw = config.get("chat_template")
    where = f"{folder / CONFIG_FILE}: chat_template"
    if raw is None:
        return where, None, f"{CONFIG_FILE} has no chat_template"
    if isinstance(raw, str):
        return where, raw, None
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return f"{where} (default)", named["default"], None
        return where, None, f"the chat templates of {CONFIG_FILE} name no 'default' one"
    return where, None, f"chat_template in {CONFIG_FILE} is neither a string nor a list of named templates"


def _special_tokens(config: dict) -> dict[str, str]:
    out = {}
    for name in SPECIAL_TOKENS:
        value = config.get(name)
        if isinstance(value, dict):  # {"__type": "AddedToken", "content": ...}
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out
