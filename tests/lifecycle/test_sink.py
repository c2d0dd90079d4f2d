"""The token sink: coalescing reads of whole token events, prompt log-probs that ride with the next
token, one terminal item, overflow, one reader."""
from __future__ import annotations

import asyncio

import pytest

from pegainfer.engine.contract import PromptLogprobs, Token
from pegainfer.lifecycle.sink import SinkEnd, SinkItem, TokenSink
from pegainfer.lifecycle.states import FinishReason, RequestState, TerminalReason

STOP = SinkEnd(RequestState.FINISHED, TerminalReason.COMPLETED_STOP, FinishReason.STOP)


def t(token_id: int, index: int = 0) -> Token:
    return Token("r", token_id, False, index)


def ts(*ids: int) -> list[Token]:
    return [t(i) for i in ids]


async def test_reader_gets_everything_buffered_since_its_last_read_in_one_item() -> None:
    sink = TokenSink(max_buffered=16)
    for token in (5, 6, 7):
        sink.push(t(token))
    assert await sink.next() == SinkItem(ts(5, 6, 7))
    sink.push(t(8))
    sink.close(STOP)
    last = await sink.next()
    assert last == SinkItem(ts(8), STOP) and last.is_last
    with pytest.raises(StopAsyncIteration):
        await sink.next()
    with pytest.raises(StopAsyncIteration):
        sink.read_nowait()


async def test_async_for_wakes_on_push_and_stops_after_the_terminal_item() -> None:
    sink = TokenSink(max_buffered=16)
    items: list[SinkItem] = []

    async def read() -> None:
        async for item in sink:
            items.append(item)

    reader = asyncio.create_task(read())
    await asyncio.sleep(0)  # the reader is now waiting on an empty sink
    sink.push(t(1))
    await asyncio.sleep(0)
    sink.push(t(2))
    sink.push(t(3))
    await asyncio.sleep(0)
    sink.close(STOP)
    await asyncio.wait_for(reader, 1.0)
    assert [i.tokens for i in items] == [ts(1), ts(2, 3), []]
    assert [i.end for i in items] == [None, None, STOP]


async def test_terminal_item_with_no_tokens_and_read_nowait_when_empty() -> None:
    sink = TokenSink(max_buffered=1)
    assert sink.read_nowait() is None
    end = SinkEnd(RequestState.CANCELLED, TerminalReason.CANCELLED, message="cancelled")
    sink.close(end)
    assert sink.closed
    assert sink.read_nowait() == SinkItem([], end)


def test_overflow_is_reported_past_the_bound_and_cleared_by_a_read() -> None:
    sink = TokenSink(max_buffered=3)
    for token in range(3):
        sink.push(t(token))
    assert not sink.overflowed and sink.buffered == 3
    sink.push(t(3))
    assert sink.overflowed
    assert sink.read_nowait() == SinkItem(ts(0, 1, 2, 3))
    assert not sink.overflowed and sink.buffered == 0


def test_producer_misuse_raises() -> None:
    sink = TokenSink(max_buffered=4)
    sink.close(STOP)
    with pytest.raises(RuntimeError):
        sink.push(t(1))
    with pytest.raises(RuntimeError):
        sink.close(STOP)
    with pytest.raises(ValueError):
        TokenSink(max_buffered=0)


async def test_a_second_concurrent_reader_is_refused() -> None:
    sink = TokenSink(max_buffered=4)
    first = asyncio.create_task(sink.next())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError):
        await sink.next()
    sink.push(t(9))
    assert (await asyncio.wait_for(first, 1.0)).tokens == ts(9)


async def test_token_events_arrive_whole_and_prompt_log_probs_ride_with_the_next_token() -> None:
    sink = TokenSink(max_buffered=4)
    first, second = PromptLogprobs("r", [None, (-1.0, ())], 0), PromptLogprobs("r", [(-2.0, ((5, -2.0),))], 2)
    reader = asyncio.create_task(sink.next())
    await asyncio.sleep(0)
    sink.push_prompt(first)
    sink.push_prompt(second)
    await asyncio.sleep(0)
    assert not reader.done() and sink.read_nowait() is None  # prompt log-probs alone wake nobody
    token = Token("r", 7, True, 1, -0.5, ((7, -0.5),), FinishReason.LENGTH)
    sink.push(token)
    item = await asyncio.wait_for(reader, 1.0)
    assert item.tokens == [token] and item.tokens[0] is token and list(item.prompt) == [first, second]
    sink.push_prompt(first)
    sink.close(STOP)
    assert sink.read_nowait() == SinkItem([], STOP, [first])  # the end carries what is left
    with pytest.raises(RuntimeError):
        sink.push_prompt(first)
