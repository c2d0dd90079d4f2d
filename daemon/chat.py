"""POST /v1/chat/completions, the request side: the body's messages checked and put in the plain
shape a chat template reads, and every other field handed to the completions parser
(daemon.protocol.parse_completion), so that a chat request samples, stops, counts and reports
log-probs exactly as a completion does. Only what differs is read here: `messages`,
`max_completion_tokens` (OpenAI's newer name for max_tokens), `logprobs` as a boolean with
`top_logprobs`, vLLM's `add_generation_prompt`, and the OpenAI features this server does not have
(tools, structured output, audio), which are refused with a 400 rather than ignored.

Messages: roles system, developer (rendered as system, which is what chat templates know),
user and assistant; content a string or a list of {type: "text", text} parts, joined with newlines
(as vLLM does for templates that read a string); an assistant's content may be null. Without
max_tokens the reply may fill the rest of the context, as OpenAI and vLLM do."""
from __future__ import annotations

import dataclasses
from typing import Any

from pegainfer.daemon.protocol import (VLLM_UNSUPPORTED, CompletionRequest, bad_request, parse_completion,
                                       refuse_unsupported_output, unsupported, whole_numbers)
from pegainfer.engine.contract import BOUNDS, MAX_LOGPROBS

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_MESSAGES = 4096
OPENAI_MAX_TOP_LOGPROBS = 20
# Fields read as a completion's, under the same names.
SHARED = ("model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
          "frequency_penalty", "repetition_penalty", "stop", "stop_token_ids", "n", "logit_bias", "ignore_eos",
          "max_tokens", "user", "include_stop_str_in_output")
# Accepted and without effect here (no tools, no storage, one service tier): not "unknown".
IGNORED = ("store", "metadata", "service_tier", "parallel_tool_calls", "prompt_cache_key",
           "safety_identifier")
CHAT_FIELDS = frozenset({*SHARED, *IGNORED, "messages", "max_completion_tokens", "logprobs", "top_logprobs",
                         "add_generation_prompt", "continue_final_message", "chat_template_kwargs", "tools",
                         "tool_choice", "functions", "function_call", "response_format", "audio", "modalities",
                         "prediction", "echo", *VLLM_UNSUPPORTED})


@dataclasses.dataclass(slots=True)
class ChatRequest:
    messages: list[dict[str, str]]  # {role, content[, name]}, as the template reads them
    add_generation_prompt: bool
    completion: CompletionRequest  # everything else; its prompt is the rendered template (set later)
    continue_final: bool = False  # vLLM's continue_final_message: the last message is continued
    template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)  # chat_template_kwargs


def parse_chat(body: Any, *, max_tokens_default: int | None = None) -> ChatRequest:
    """Validate a /v1/chat/completions body. max_tokens_default: None (the rest of the context)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    body = whole_numbers(body)
    _refuse_unsupported(body)
    messages = _messages(body.get("messages"))
    sub = {name: body[name] for name in SHARED if name in body}
    limit = body.get("max_completion_tokens")
    if limit is not None:
        found = BOUNDS["max_tokens"].problem("max_completion_tokens", limit)
        if found is not None:
            raise bad_request(str(found), "max_completion_tokens")
        sub["max_tokens"] = limit  # it wins over the deprecated max_tokens, as OpenAI documents
    sub["logprobs"] = _top_logprobs(body)
    sub["prompt"] = "."  # a stand-in: the prompt is the rendered template
    completion = parse_completion(sub, max_tokens_default=max_tokens_default or 1)
    if sub.get("max_tokens") is None:
        completion.max_tokens = max_tokens_default
    completion.prompt, completion.prompts, completion.add_bos = None, [], False
    add, cont, kwargs = template_options(body)
    return ChatRequest(messages, add, completion, cont, kwargs)


def template_options(body: dict) -> tuple[bool, bool, dict[str, Any]]:
    """How a chat body asks its messages to be rendered (the chat route's and /tokenize's):
    (add_generation_prompt, continue_final_message, chat_template_kwargs); the generation prompt is
    off where the final message is continued."""
    add = body.get("add_generation_prompt", True)
    if not isinstance(add, bool):
        raise bad_request("'add_generation_prompt' must be a boolean", "add_generation_prompt")
    cont = body.get("continue_final_message", False)
    if not isinstance(cont, bool):
        raise bad_request("'continue_final_message' must be a boolean", "continue_final_message")
    if cont and body.get("add_generation_prompt") is True:  # as vLLM: only when both are sent true
        raise bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true",
                          "continue_final_message")
    kwargs = body.get("chat_template_kwargs")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    return add and not cont, cont, kwargs


def _top_logprobs(body: dict) -> int | None:
    """The completions' `logprobs` (the top-N count, None for none) from chat's boolean `logprobs`
    and `top_logprobs`, bounded by what the engine reports (OpenAI allows 20)."""
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise bad_request(f"'logprobs' must be a boolean, got {type(wanted).__name__}", "logprobs")
    top = body.get("top_logprobs")
    if top is None:
        return 0 if wanted else None
    found = BOUNDS["logprobs"].problem("top_logprobs", top)
    if found is not None:
        if isinstance(top, int) and not isinstance(top, bool) and MAX_LOGPROBS < top <= OPENAI_MAX_TOP_LOGPROBS:
            raise bad_request(f"'top_logprobs' must be in [0, {MAX_LOGPROBS}] on this server (OpenAI allows up to "
                              f"{OPENAI_MAX_TOP_LOGPROBS}), got {top}", "top_logprobs")
        raise bad_request(str(found), "top_logprobs")
    if not wanted:
        if top == 0:  # as vLLM: 0 asks for nothing, so it needs no 'logprobs'
            return None
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return top


def _refuse_unsupported(body: dict) -> None:
    """OpenAI features this server does not have: a 400 naming them, never a silent no-op."""
    tools = body.get("tools")
    if body.get("tool_choice") == "none" and tools:  # no call may be made: the tools change nothing here
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise bad_request("'tools' must be an array of tool objects", "tools")
    elif tools:
        raise unsupported("tools", "tool calling (other than with tool_choice \"none\")", yet=False)
    if body.get("functions"):
        raise unsupported("functions", "tool calling", yet=False)
    if tools == []:  # OpenAI's schema and vLLM refuse an empty list
        raise bad_request("'tools' must not be an empty array; leave it out", "tools")
    if body.get("tool_choice") not in (None, "none"):
        raise unsupported("tool_choice", "tool calling", yet=False)
    if body.get("function_call") not in (None, "none"):
        raise unsupported("function_call", "tool calling", yet=False)
    if body.get("audio") is not None or body.get("modalities") not in (None, ["text"]):
        raise unsupported("modalities" if body.get("audio") is None else "audio", "audio output", yet=False)
    if body.get("prediction") is not None:
        raise unsupported("prediction", "predicted outputs", yet=False)
    if body.get("echo"):  # vLLM's: the last message's content before the reply
        raise unsupported("echo", "'echo' on chat completions", yet=False)
    refuse_unsupported_output(body)


def parse_messages(raw: Any) -> list[dict[str, str]]:
    """A chat body's `messages`, checked as /v1/chat/completions checks them (also /tokenize's)."""
    return _messages(raw)


def _messages(raw: Any) -> list[dict[str, str]]:
    if raw is None:
        raise bad_request("'messages' is required", "messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty list of messages", "messages")
    if len(raw) > MAX_MESSAGES:
        raise bad_request(f"'messages' holds {len(raw)} messages; at most {MAX_MESSAGES} are allowed", "messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(raw)]


def _message(m: Any, where: str) -> dict[str, str]:
    if not isinstance(m, dict):
        raise bad_request(f"'{where}' must be an object with 'role' and 'content'", "messages")
    role = m.get("role")
    if role in ("tool", "function"):
        raise unsupported("messages", f"'{where}.role' {role!r} (tool calling)", yet=False)
    if role is None:
        raise bad_request(f"'{where}.role' is required (one of {', '.join(ROLES)})", "messages")
    if not isinstance(role, str) or role not in ROLES:
        shown = repr(role[:40]) if isinstance(role, str) else f"{repr(role)[:40]} ({type(role).__name__})"
        raise bad_request(f"'{where}.role' must be one of {', '.join(ROLES)}, got {shown}", "messages")
    if m.get("tool_calls") or m.get("function_call"):
        raise unsupported("messages", f"'{where}' with tool calls (tool calling)", yet=False)
    out = {"role": ROLES[role], "content": _content(m.get("content"), role, where)}
    name = m.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise bad_request(f"'{where}.name' must be a string", "messages")
        out["name"] = name
    return out


def _content(content: Any, role: str, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        if role == "assistant":
            return ""
        raise bad_request(f"'{where}.content' is required", "messages")
    if not isinstance(content, list):
        raise bad_request(f"'{where}.content' must be a string or a list of content parts", "messages")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            shown = kind[:40] if isinstance(kind, str) else type(part).__name__
            raise bad_request(f"'{where}.content[{j}]' must be a text part ({{\"type\": \"text\", \"text\": ...}}); "
                              f"parts of type {shown!r} are not supported by this model", "messages")
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(f"'{where}.content[{j}].text' must be a string", "messages")
        texts.append(text)
    return "\n".join(texts)
