"""The two OpenAI response shapes one pipeline (daemon.completions) writes: completions
(`text_completion`, choices with `text`) and chat completions (`chat.completion` and
`chat.completion.chunk`, choices with `message` or `delta`). Everything else about a response (ids,
the choices' text, stop strings, log-probs, usage, errors) is the same for both.

A chat stream opens with one chunk per choice whose delta is `{"role": "assistant", "content": ""}`
(as OpenAI's does); later deltas carry `content`, the last one its `finish_reason` (with an empty
delta when no text came with it)."""
from __future__ import annotations

from collections.abc import Callable

import orjson

from pegainfer.daemon import protocol
from pegainfer.daemon.choice import Delta
from pegainfer.daemon.chunk_encoder import ChunkEncoder
from pegainfer.daemon.logprobs import LogprobEntry, as_chat, as_openai

Encode = Callable[[int, Delta], bytes]  # (choice index, its delta) -> one SSE event


class CompletionShape:
    route = "/v1/completions"
    id_prefix = "cmpl-"
    prompt_param = "prompt"  # what an error about the prompt names

    def encoder(self, rid: str, created: int, model: str, logprobs: bool) -> Encode:
        return ChunkEncoder(rid, created, model, logprobs).chunk

    def opening(self, rid: str, created: int, model: str, choices: int) -> bytes:
        return b""

    def choice(self, index: int, text: str, entries: list[LogprobEntry], finish_reason: str | None,
               logprobs: bool) -> dict:
        return {"index": index, "text": text, "logprobs": as_openai(entries) if logprobs else None,
                "finish_reason": finish_reason}

    def body(self, rid: str, created: int, model: str, choices: list[dict], usage: dict) -> dict:
        return {**protocol.chunk(rid, created, model, choices), "usage": usage}

    def usage_chunk(self, rid: str, created: int, model: str, usage: dict) -> dict:
        return {**protocol.chunk(rid, created, model, []), "usage": usage}


class ChatShape:
    route = "/v1/chat/completions"
    id_prefix = "chatcmpl-"
    prompt_param = "messages"

    def encoder(self, rid: str, created: int, model: str, logprobs: bool) -> Encode:
        head = b"data: " + orjson.dumps(_chunk(rid, created, model, []))[:-2]  # up to and including "choices":[

        def encode(index: int, d: Delta) -> bytes:
            choice = {"index": index, "delta": {"content": d.text} if d.text else {},
                      "logprobs": as_chat(d.entries) if logprobs and d.entries else None,
                      "finish_reason": d.finish_reason}
            return head + orjson.dumps(choice) + b"]}\n\n"
        return encode

    def opening(self, rid: str, created: int, model: str, choices: int) -> bytes:
        """The first chunk of each choice: its role."""
        return b"".join(b"data: " + orjson.dumps(_chunk(rid, created, model, [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]))
            + b"\n\n" for i in range(choices))

    def choice(self, index: int, text: str, entries: list[LogprobEntry], finish_reason: str | None,
               logprobs: bool) -> dict:
        return {"index": index, "message": {"role": "assistant", "content": text},
                "logprobs": as_chat(entries) if logprobs else None, "finish_reason": finish_reason}

    def body(self, rid: str, created: int, model: str, choices: list[dict], usage: dict) -> dict:
        return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
                "usage": usage}

    def usage_chunk(self, rid: str, created: int, model: str, usage: dict) -> dict:
        return {**_chunk(rid, created, model, []), "usage": usage}


def _chunk(rid: str, created: int, model: str, choices: list[dict]) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices}


Shape = CompletionShape | ChatShape
COMPLETION = CompletionShape()
CHAT = ChatShape()
