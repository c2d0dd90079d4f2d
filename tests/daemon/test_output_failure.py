"""A fault while rendering one request's output (detokenising, stop strings, log-probs) fails that
request alone: its stream gets an error chunk with code `request_failed` and then [DONE] (a JSON
500 without streaming), the scheduler ends it FAILED and tells the engine to drop it, the log gets
one structured `request_failed` line without a traceback, and a neighbouring stream on the same
loop goes on to its end. The handler runs for real (scheduler, sinks, token details, choices, the
tiny tokenizer); the fault comes from a tokenizer that cannot decode one token id."""
from __future__ import annotations

import asyncio
import json
import logging
import types

import pytest
from starlette.requests import Request as HTTPRequest

from pegainfer.daemon.choices import Choices
from pegainfer.daemon import output
from pegainfer.daemon.output import Part, Reply
from pegainfer.daemon.protocol import parse_completion
from pegainfer.engine.default_model import ensure_preset_tokenizer
from pegainfer.engine.contract import FinishReason, Token
from pegainfer.engine.tokenizer import Tokenizer
from pegainfer.lifecycle.request import Request
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.lifecycle.sink import TokenSink
from pegainfer.lifecycle.states import RequestState
from tests.lifecycle.fakes import FakeEngine

SENTINEL = 777  # the one token id the faulty tokenizer cannot decode


class UndecodableToken(Tokenizer):
    """The tiny preset's tokenizer, except that any text holding SENTINEL fails to decode."""

    def decode(self, ids: list[int]) -> str:
        if SENTINEL in ids:
            raise ValueError(f"cannot decode token {SENTINEL}")
        return super().decode(ids)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return UndecodableToken(str(ensure_preset_tokenizer("tiny")))


def setup(tok, bodies: dict[str, dict]):
    engine = FakeEngine()
    scheduler = Scheduler(engine, max_active=4, max_pending=4)
    scheduler.set_ready(True)
    rt = types.SimpleNamespace(scheduler=scheduler)
    live = {}
    for rid, body in bodies.items():
        req = parse_completion(body, max_tokens_default=16)
        ids = req.prompt_ids if req.prompt_ids is not None else tok.encode(req.prompt)
        request = Request(req.admit(rid, ids), "tiny", TokenSink(64))
        scheduler.submit(request)
        live[rid] = (request, Choices(req, tok, ids))
    return rt, engine, live


def feed(rt, rid: str, token_ids: list[int], finish: bool) -> None:
    """What the bridge does with one engine step's tokens for a request."""
    for i, t in enumerate(token_ids):
        last = finish and i == len(token_ids) - 1
        rt.scheduler.on_token(Token(rid, t, False, 0, finish_reason=FinishReason.LENGTH if last else None), 1)
    if finish:
        rt.scheduler.on_finished(rid, "length")


def sse(raw: bytes) -> list:
    return [json.loads(e[6:]) if e[6:] != b"[DONE]" else "[DONE]" for e in raw.split(b"\n\n") if e]


async def read_all(gen) -> bytes:
    return b"".join([part async for part in gen])


async def test_a_stream_whose_output_cannot_render_fails_alone(tok, caplog):
    caplog.set_level(logging.INFO)
    stream = {"stream": True, "max_tokens": 6}
    rt, engine, live = setup(tok, {"victim": {"prompt": [5, 6, 7], **stream}, "neighbour": {"prompt": "hi", **stream}})
    readers = {rid: asyncio.create_task(read_all(output.stream(rt, Reply(rid, 0, "tiny", [Part(request, choices)]))))
               for rid, (request, choices) in live.items()}
    for step in ([40], [41], [SENTINEL], [42], [43], [44]):  # the victim's third token cannot be decoded
        if live["victim"][0].state is not RequestState.FAILED:
            feed(rt, "victim", step, finish=False)
        feed(rt, "neighbour", [t for t in step if t != SENTINEL] or [45], finish=False)
        await asyncio.sleep(0)
    feed(rt, "neighbour", [46], finish=True)
    victim, neighbour = sse(await readers["victim"]), sse(await readers["neighbour"])

    assert victim[-1] == "[DONE]" and victim[-2]["error"]["code"] == "request_failed"
    assert set(victim[-2]["error"]) == {"message", "type", "param", "code"} and victim[-2]["error"]["type"] == "server_error"
    assert "".join(c["choices"][0]["text"] for c in victim[:-2]) == tok.decode([40, 41])
    assert live["victim"][0].state is RequestState.FAILED and engine.cancelled == ["victim"]

    assert neighbour[-1] == "[DONE]" and neighbour[-2]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["text"] for c in neighbour[:-1]) == tok.decode([40, 41, 45, 42, 43, 44, 46])
    assert live["neighbour"][0].state is RequestState.FINISHED

    lines = [r for r in caplog.records if "request_failed" in r.getMessage()]
    assert len(lines) == 1 and json.loads(lines[0].getMessage())["request_id"] == "victim"
    assert not any(r.exc_info for r in caplog.records)


async def test_a_non_streamed_request_whose_output_cannot_render_gets_a_json_error(tok, caplog):
    caplog.set_level(logging.INFO)
    rt, engine, live = setup(tok, {"victim": {"prompt": "hi", "max_tokens": 3, "logprobs": 1}})
    request, choices = live["victim"]

    async def receive():  # a client that stays connected
        await asyncio.Event().wait()

    http = HTTPRequest({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive)
    answer = asyncio.create_task(output.complete(http, rt, Reply("victim", 0, "tiny", [Part(request, choices)])))
    feed(rt, "victim", [40, SENTINEL], finish=False)  # still running when its output fails
    response = await answer
    assert response.status_code == 500
    assert json.loads(response.body)["error"]["code"] == "request_failed"
    assert request.state is RequestState.FAILED and engine.cancelled == ["victim"]
    assert not any(r.exc_info for r in caplog.records)


@pytest.mark.parametrize("streamed", [True, False])
async def test_a_failing_prompt_of_a_list_ends_its_siblings_and_the_response(tok, streamed):
    """A request of two prompts whose first prompt's output cannot render: the response ends with
    the error, and the other prompt is cancelled (the engine drops it) rather than left running."""
    rt, engine, live = setup(tok, {"r-0": {"prompt": [5, 6], "max_tokens": 8, "stream": streamed},
                                   "r-1": {"prompt": [7, 8], "max_tokens": 8, "stream": streamed}})
    parts = [Part(*live["r-0"], 0), Part(*live["r-1"], 1)]
    reply = Reply("r", 0, "tiny", parts)

    async def receive():
        await asyncio.Event().wait()

    http = HTTPRequest({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive)
    answer = asyncio.create_task(read_all(output.stream(rt, reply)) if streamed else output.complete(http, rt, reply))
    feed(rt, "r-1", [40], finish=False)
    for _ in range(10):  # the response reads the sibling's token before the faulty one comes
        await asyncio.sleep(0)
    feed(rt, "r-0", [SENTINEL], finish=False)
    result = await answer
    if streamed:
        events = sse(result)
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "request_failed"
        assert [c["choices"][0]["index"] for c in events[:-2]] == [1]  # the sibling's first token went out
    else:
        assert result.status_code == 500 and json.loads(result.body)["error"]["code"] == "request_failed"
    assert live["r-0"][0].state is RequestState.FAILED and live["r-1"][0].state is RequestState.CANCELLED
    assert sorted(engine.cancelled) == ["r-0", "r-1"]
