"""A seeded generator of hostile /v1/completions bodies, for the fuzz test and the reliability scenario
`poisoned_neighbour`: valid bodies (text or token-id prompts, greedy or sampled, streamed or not) with
one to three fields replaced, about half the time by a value at the edge of what the API accepts
(top_k = the vocabulary, the int64 seeds, repetition_penalty 2 and 1e-300, logprobs 5 with echo,
logit biases of +-100 ...: these reach the engine) and otherwise by a value it must refuse with a 400
(integers past int64 such as 2^63, 2^64 - 1 and -2^63 - 1, floats and booleans where integers go,
NaN-like strings, wrong types, nested junk, huge lists, unicode, token ids outside the vocabulary);
plus a few bodies that are not JSON objects at all. `chat_bodies` makes /v1/chat/completions bodies
the same way (the messages themselves among the fields replaced: roles, content parts, tool calls).
The same seed gives the same bodies."""
from __future__ import annotations

import json
import random
from typing import Any

HUGE_INTS = [2**63, 2**63 + 1, 2**64 - 1, -2**63 - 1, -2**64 + 1, 10**19]
JUNK = [True, False, 1.5, -0.0, "NaN", "Infinity", "-inf", "1e400", "", "\u0661\u0662", "\ud7ff\u202e",
        [], [None], {}, {"$": {"a": [None, {"b": []}]}}, [[[[["deep"]]]]], "7", 1e308, -1e308]
INT_FIELDS = ("max_tokens", "top_k", "seed", "n", "best_of", "logprobs")
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
WORDS = "the a mountain river ☃ naïve 東京 über weather was cold and bright 🙂 \n".split(" ")


class HostileBodies:
    def __init__(self, seed: int, vocab: int, model: str | None = None, max_choices: int = 2):
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.model = model
        self.max_choices = max_choices  # n / best_of the server has KV slots for

    # ---- one body ---------------------------------------------------------------------------------
    def body(self) -> bytes:
        """One request body, as bytes (most are JSON objects)."""
        r = self.rng
        if r.random() < 0.03:
            return r.choice([b"", b"{", b"null", b"[1, 2]", b'"prompt"', b'{"prompt": "hi",}', b"\xff\xfe{}",
                             b'{"prompt": NaN}', b'{"prompt": "hi", "max_tokens": 1e400}', b'{"prompt": "\\ud800"}',
                             b'{"prompt": "hi", "top_k": 18446744073709551616}', b"[" * 2000 + b"]" * 2000])
        body = self._valid()
        for _ in range(r.choice((1, 1, 2, 3))):
            name = r.choice((*INT_FIELDS, *FLOAT_FIELDS, "echo", "stream", "ignore_eos", "stop", "stop_token_ids",
                             "prompt", "logit_bias", "stream_options", "model", "user"))
            body[name] = self._extreme(name, body) if r.random() < 0.5 else self._invalid(name)
        return json.dumps(body, ensure_ascii=r.random() < 0.5).encode()

    def bodies(self, n: int) -> list[bytes]:
        return [self.body() for _ in range(n)]

    def _valid(self) -> dict[str, Any]:
        r = self.rng
        prompt: Any = " ".join(r.choice(WORDS) for _ in range(r.randint(1, 12))) or "hi"
        if r.random() < 0.3:
            prompt = [r.randrange(self.vocab) for _ in range(r.randint(1, 12))]
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": r.randint(1, 4),
                                "temperature": r.choice((0, 0, 0.7, 1.0, 2.0)), "ignore_eos": True}
        if r.random() < 0.5:
            body["stream"] = True
        if r.random() < 0.5:
            body["seed"] = r.randrange(-2**63, 2**63)
        if self.model is not None and r.random() < 0.5:
            body["model"] = self.model
        return body

    # ---- accepted, at the edges -------------------------------------------------------------------
    def _extreme(self, name: str, body: dict) -> Any:
        r, v = self.rng, self.vocab
        edges: dict[str, list] = {
            "max_tokens": [1, 2, 4], "top_k": [1, v, v - 1, -1], "seed": [2**63 - 1, -2**63, 0],
            "n": list(range(1, self.max_choices + 1)), "logprobs": [0, 5],
            "best_of": [1] if body.get("stream") else list(range(1, self.max_choices + 1)),
            "temperature": [0, 1e-9, 2, 2.0], "top_p": [1e-300, 1.0, 0.5], "min_p": [0, 1.0, 1e-300],
            "presence_penalty": [-2, 2.0], "frequency_penalty": [-2.0, 2], "repetition_penalty": [2, 2.0, 1e-300, 0.5],
            "echo": [True], "stream": [True, False], "ignore_eos": [True, False],
            "stop": ["\n", ["a", "é", "🙂", "the"], "\u0000"], "stop_token_ids": [[0, v - 1], [], [1] * 50],
            "prompt": [[0, v - 1, 1], [v - 1], "\u00e9" * 20, "🙂 " * 10, ["a", "b"], [[1, 2], [v - 1]], ["x"]],
            "logit_bias": [{str(v - 1): 100, "0": -100}, {str(i): -100 for i in range(300)}, {"5": 0.5}],
            "stream_options": [{"include_usage": True}] if body.get("stream") else [None],
            "model": [self.model], "user": ["x" * 200, "\u202e"],
        }
        if name == "logprobs" and r.random() < 0.5:
            body["echo"] = True
        if name in ("n", "best_of"):  # keep n <= best_of, as the API requires
            body.pop("best_of" if name == "n" else "n", None)
        return r.choice(edges[name])

    # ---- refused ----------------------------------------------------------------------------------
    def _invalid(self, name: str) -> Any:
        r, v = self.rng, self.vocab
        specific: dict[str, list] = {
            "max_tokens": [0, -3, 10**6], "top_k": [0, -2, v + 1], "n": [0, 17, self.max_choices + 1],
            "best_of": [0, 17], "logprobs": [-1, 6, 2**63 - 1], "seed": [], "temperature": [-0.5, 2.01],
            "top_p": [0, 1.01, -1], "min_p": [-0.1, 1.5], "presence_penalty": [2.1, -2.01],
            "frequency_penalty": [3], "repetition_penalty": [0, -1, 2.01, 1e308],
            "echo": ["yes", 1], "stream": ["true", 0], "ignore_eos": [1, "no"],
            "stop": [7, [""], ["a"] * 5, [1, 2], [["nested"]]],
            "stop_token_ids": [[v + 5], [-1], [2**64 - 1], [1.0], [True], "1", [[1]], list(range(v, v + 100))],
            "prompt": ["", [], [v], [-1], [2**63], [2**64 - 1], [1, 2.0], [True], [["a"], ["b"]], ["a", ""],
                       [[1], []], [[1], [v]], ["a", [1]], ["a"] * 65, [0] * 5000, 42],
            "logit_bias": [[1, 2], {"-1": 1}, {str(v): 1}, {"1.5": 1}, {"5": 101}, {"5": "1"}, {"5": None},
                           {"5": 2**64 - 1}, {"99999999999999999999": 1}, {"\u0661": 1}, {str(i): 1 for i in range(301)}],
            "stream_options": ["yes", {"include_usage": "yes"}, [True]], "model": [42, "no-such-model", ""],
            "user": [],
        }
        pool = specific[name]
        if name in INT_FIELDS:
            pool = pool + HUGE_INTS + [2.5, 0.5]  # past int64, and fractions where an integer goes
        if name in ("prompt", "stop_token_ids"):
            pool = pool + [[1, h] for h in HUGE_INTS]
        if name == "user":
            return r.choice(JUNK)  # OpenAI's end-user id: a 400 unless a string (or null)
        pool = pool + [j for j in JUNK if not isinstance(j, bool) or name not in ("echo", "stream", "ignore_eos")]
        return r.choice(pool)

    # ---- chat ----------------------------------------------------------------------------------------
    def chat_body(self) -> bytes:
        """One /v1/chat/completions body: a valid one with one to three fields replaced, each by a
        value at the edge of what is accepted or by one that must be refused."""
        r = self.rng
        body = self._valid()
        del body["prompt"]
        body["messages"] = self._messages()
        for _ in range(r.choice((1, 1, 2, 3))):
            name = r.choice(("messages", "messages", "logprobs", "top_logprobs", "max_completion_tokens", "tools",
                             "response_format", "n", "stop", "temperature", "seed", "logit_bias", "stream_options"))
            if name == "messages":
                body[name] = self._messages() if r.random() < 0.4 else r.choice(self._bad_messages())
            elif name == "logprobs":
                body[name] = r.choice((True, False, 1, "yes"))
            elif name == "top_logprobs":
                body["logprobs"] = r.random() < 0.8
                body[name] = r.choice((0, 5, 6, 20, 21, -1, 2**63, 1.0))
            elif name == "max_completion_tokens":
                body[name] = r.choice((1, 3, 0, -1, 2**63, "4"))
            elif name == "tools":
                body[name] = r.choice(([], [{"type": "function", "function": {"name": "f"}}], "x"))
            elif name == "response_format":
                body[name] = r.choice(({"type": "text"}, {"type": "json_object"}, "json", None))
            else:
                body[name] = self._extreme(name, body) if r.random() < 0.5 else self._invalid(name)
        return json.dumps(body, ensure_ascii=r.random() < 0.5).encode()

    def chat_bodies(self, n: int) -> list[bytes]:
        return [self.chat_body() for _ in range(n)]

    def _messages(self) -> list[dict[str, Any]]:
        r = self.rng
        text = " ".join(r.choice(WORDS) for _ in range(r.randint(0, 12)))
        user: dict[str, Any] = {"role": "user", "content": text}
        if r.random() < 0.3:
            user["content"] = [{"type": "text", "text": w} for w in text.split(" ")]
        out = [user]
        if r.random() < 0.3:
            out.insert(0, {"role": r.choice(("system", "developer")), "content": "Be brief."})
        if r.random() < 0.2:
            out += [{"role": "assistant", "content": r.choice(("ok", None))}, {"role": "user", "content": "more"}]
        return out

    def _bad_messages(self) -> list[Any]:
        return [[], None, "hi", [None], [{"role": "user"}], [{"role": "robot", "content": "x"}],
                [{"role": "tool", "content": "1", "tool_call_id": "a"}], [{"role": "user", "content": 7}],
                [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
                [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user", "content": "x", "name": []}],
                [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}], [{"role": "user", "content": "x"}] * 5000,
                [{"role": "user", "content": "\ud7ff\u202e" * 3000}], [{"role": ["user"], "content": "x"}], JUNK]
