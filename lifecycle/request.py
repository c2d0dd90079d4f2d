"""One request as the asyncio side sees it: the engine command it will be run as, its state, its
output so far, its timings, its sink.

Plain data plus two methods that move it through the transition table. Times come from the
caller (the scheduler's injected clock), so a Request never reads a clock itself. Its parameters
are the contract's Admit, built once where the request was parsed and handed to the engine as it is.
"""
from __future__ import annotations

import dataclasses

from pegainfer.engine.contract import Admit
from pegainfer.lifecycle.sink import SinkEnd, TokenSink
from pegainfer.lifecycle.states import (
    TERMINAL,
    FinishReason,
    RequestState,
    TerminalReason,
    advance,
    terminal_reason,
)


@dataclasses.dataclass(slots=True)
class Request:
    command: Admit  # what the engine runs: prompt ids, limits, sampling parameters, choices
    model: str
    sink: TokenSink
    state: RequestState = RequestState.RECEIVED
    output_ids: list[int] = dataclasses.field(default_factory=list)
    finish_reason: FinishReason | None = None
    terminal_reason: TerminalReason | None = None
    error: str | None = None
    code: str | None = None  # the stable cause of the end, where the state alone does not say it
    stopped_choices: list[int] = dataclasses.field(default_factory=list)  # choices ended by a stop string
    # timestamps, in the scheduler clock's seconds; None until the request gets there
    received_at: float | None = None
    pending_at: float | None = None
    admitted_at: float | None = None
    prefill_started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None  # the time of the terminal move, whichever terminal it was
    # admission and batching facts for the trace
    pending_depth_at_admit: int = 0  # requests still queued behind this one when it was admitted
    active_set_size_max: int = 0  # most requests held by the engine at once while this one was
    decode_batch_size_max: int = 0  # largest batch among the decode steps that made its tokens
    cached_tokens: int = 0  # prompt tokens the engine found in its prefix cache (usage's cached_tokens)
    # who sent it, as the daemon identifies callers (a digest of the API key); only they may cancel it
    owner: str | None = None

    @property
    def request_id(self) -> str:
        return self.command.request_id

    @property
    def prompt_ids(self) -> list[int]:
        return self.command.prompt_ids

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL

    def move(self, new: RequestState, now: float) -> None:
        """A non-terminal move; terminal moves go through `end` so their reason is recorded."""
        if new in TERMINAL:
            raise ValueError(f"use Request.end for the terminal state {new.name}")
        self.state = advance(self.state, new)
        if new is RequestState.PENDING:
            self.pending_at = now
        elif new is RequestState.ADMITTED:
            self.admitted_at = now
        elif new is RequestState.PREFILL:
            self.prefill_started_at = now
        elif new is RequestState.DECODE:
            self.first_token_at = now

    def end(
        self,
        new: RequestState,
        now: float,
        *,
        finish_reason: FinishReason | None = None,
        error: str | None = None,
        code: str | None = None,
    ) -> SinkEnd:
        """Move to a terminal state, record why, and return the sink's terminal item (the caller
        closes the sink, after its observers have seen the move). `code`: a stable cause the client
        is told (e.g. "server_shutdown", "queue_full"), where the state alone does not say it."""
        reason = terminal_reason(new, finish_reason)  # validates before anything changes
        self.state = advance(self.state, new)
        self.finish_reason = finish_reason
        self.terminal_reason = reason
        self.error = error
        self.code = code
        self.finished_at = now
        return SinkEnd(state=new, reason=reason, finish_reason=finish_reason, message=error, code=code)
