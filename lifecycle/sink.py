"""The token sink: one request's bounded, coalescing buffer between the scheduler and its stream,
and the one channel by which the request's output reaches its handler.

The scheduler (producer) pushes the engine's Token events whole (choice index, log-probs, finish
reason), the prompt's PromptLogprobs events, and, exactly once, an end; it never blocks. The HTTP
stream (the one consumer) awaits `next()` or iterates with `async for`, and each read returns
everything buffered since the previous read in one item, so a reader that falls a little behind
sends fewer, larger SSE chunks instead of queueing one item per token. Prompt log-probs wake
nobody: they come before the prompt's first token, and go out with it.

Bounded: when more than `max_buffered` tokens sit unread the sink reports `overflowed`, and the
scheduler cancels the request ("client too slow to read"). A slow reader therefore costs at most
`max_buffered` + one step's tokens of memory, never an unbounded queue.

Both sides live on the asyncio loop thread; nothing here is thread-safe, and nothing needs to be.
A waiting reader parks on a bare future that the next push or close resolves (an asyncio.Event
would cost a waiter deque and a new future per wait, on every streamed token).
"""
from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from pegainfer.engine.contract import PromptLogprobs, Token
from pegainfer.lifecycle.states import FinishReason, RequestState, TerminalReason


@dataclasses.dataclass(frozen=True, slots=True)
class SinkEnd:
    """How the request ended, as the stream needs it to write its last chunk or error."""
    state: RequestState
    reason: TerminalReason
    finish_reason: FinishReason | None = None
    message: str | None = None  # for the server's records; the daemon decides what the client sees
    code: str | None = None  # a stable cause chosen by whoever ended it (None: the state's usual one)


@dataclasses.dataclass(frozen=True, slots=True)
class SinkItem:
    """What one read returns: the tokens since the last read (in the engine's order), the prompt
    log-prob events since the last read (a prompt fed in chunks sends one per chunk), and the end
    if it has come."""
    tokens: list[Token]
    end: SinkEnd | None = None
    prompt: Sequence[PromptLogprobs] = ()

    @property
    def is_last(self) -> bool:
        return self.end is not None


class TokenSink:
    """Single-producer, single-consumer, asyncio-side; see the module docstring."""

    __slots__ = ("max_buffered", "_buffer", "_prompt", "_end", "_end_read", "_waiter", "_reading")

    def __init__(self, max_buffered: int) -> None:
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1, got {max_buffered}")
        self.max_buffered = max_buffered
        self._buffer: list[Token] = []
        self._prompt: list[PromptLogprobs] = []
        self._end: SinkEnd | None = None
        self._end_read = False
        self._waiter: asyncio.Future[None] | None = None  # the reader's, while it waits
        self._reading = False

    # ---- producer side (the scheduler) ----------------------------------------------------------
    def push(self, token: Token) -> None:
        if self._end is not None:
            raise RuntimeError("push after the sink was closed")
        self._buffer.append(token)
        if self._waiter is not None:
            self._wake()

    def push_prompt(self, event: PromptLogprobs) -> None:
        """Buffer one prompt chunk's log-probs; they are read with the next token or the end."""
        if self._end is not None:
            raise RuntimeError("push after the sink was closed")
        self._prompt.append(event)

    def close(self, end: SinkEnd) -> None:
        """Deliver the one terminal item; a second close is a scheduler bug and raises."""
        if self._end is not None:
            raise RuntimeError(f"sink closed twice ({self._end.state.name}, then {end.state.name})")
        self._end = end
        if self._waiter is not None:
            self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if not waiter.done():  # a reader cancelled while it waited left a cancelled future
            waiter.set_result(None)

    @property
    def overflowed(self) -> bool:
        return len(self._buffer) > self.max_buffered

    @property
    def closed(self) -> bool:
        return self._end is not None

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    # ---- consumer side (the HTTP stream) ---------------------------------------------------------
    def read_nowait(self) -> SinkItem | None:
        """The next item if one is ready, None if the reader would have to wait.
        Raises StopAsyncIteration once the terminal item has been read."""
        if self._end_read:
            raise StopAsyncIteration
        if not self._buffer and self._end is None:
            return None
        tokens, self._buffer = self._buffer, []
        self._end_read = self._end is not None
        if self._prompt:
            prompt, self._prompt = self._prompt, []
            return SinkItem(tokens, self._end, prompt)
        return SinkItem(tokens, self._end)

    async def next(self) -> SinkItem:
        """Wait for the next item. Raises StopAsyncIteration once the terminal item was read."""
        if self._reading:
            raise RuntimeError("a TokenSink has exactly one reader")
        self._reading = True
        try:
            while (item := self.read_nowait()) is None:
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter
            return item
        finally:
            self._reading = False
            self._waiter = None

    def __aiter__(self) -> TokenSink:
        return self

    async def __anext__(self) -> SinkItem:
        return await self.next()
