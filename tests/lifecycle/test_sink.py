"""The token sink: coalescing reads, one terminal item, overflow, one reader."""
from __future__ import annotations

import asyncio

import pytest

from lifecycle.sink import SinkEnd, SinkItem, TokenSink
from lifecycle.states import FinishReason, RequestState, TerminalReason

STOP = SinkEnd(RequestState.FINISHED, TerminalReason.COMPLETED_STOP, FinishReason.STOP)


async def test_reader_gets_everything_buffered_since_its_last_read_in_one_item() -> None:
    sink = TokenSink(max_buffered=16)
    for token in (5, 6, 7):
        sink.push(token)
    assert await sink.next() == SinkItem([5, 6, 7])
    sink.push(8)
    sink.close(STOP)
    last = await sink.next()
    assert last == SinkItem([8], STOP) and last.is_last
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
    sink.push(1)
    await asyncio.sleep(0)
    sink.push(2)
    sink.push(3)
    await asyncio.sleep(0)
    sink.close(STOP)
    await asyncio.wait_for(reader, 1.0)
    assert [i.token_ids for i in items] == [[1], [2, 3], []]
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
        sink.push(token)
    assert not sink.overflowed and sink.buffered == 3
    sink.push(3)
    assert sink.overflowed
    assert sink.read_nowait() == SinkItem([0, 1, 2, 3])
    assert not sink.overflowed and sink.buffered == 0


def test_producer_misuse_raises() -> None:
    sink = TokenSink(max_buffered=4)
    sink.close(STOP)
    with pytest.raises(RuntimeError):
        sink.push(1)
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
    sink.push(9)
    assert (await asyncio.wait_for(first, 1.0)).token_ids == [9]
