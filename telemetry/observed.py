"""What telemetry reads of the requests it observes, as protocols: telemetry imports nothing from
lifecycle/ or daemon/, and sees the lifecycle's Request and the daemon's parsed request only through
these attributes. States and reasons are the contract's enums (engine/contract.py)."""
from __future__ import annotations

from typing import Protocol

from pegainfer.engine.contract import Admit, FinishReason, RequestState, TerminalReason


class ObservedRequest(Protocol):
    """A request as the lifecycle observer hands it over (lifecycle.request.Request)."""
    command: Admit  # its parameters: max_tokens, ignore_eos, sampling, n, stop_token_ids
    model: str
    state: RequestState
    output_ids: list[int]
    finish_reason: FinishReason | None
    terminal_reason: TerminalReason | None
    error: str | None
    code: str | None  # a rejection's stable cause ("queue_full", "not_ready", "draining"), or the end's
    received_at: float | None
    pending_at: float | None
    admitted_at: float | None
    prefill_started_at: float | None
    first_token_at: float | None
    finished_at: float | None
    pending_depth_at_admit: int
    active_set_size_max: int
    decode_batch_size_max: int

    @property
    def request_id(self) -> str: ...

    @property
    def prompt_ids(self) -> list[int]: ...


class AnnouncedRequest(Protocol):
    """The parsed API request the daemon announces before submitting (daemon.protocol's)."""
    model: str | None
    stream: bool
    n: int
    stop: list[str]
    best_of: int | None
    echo: bool
