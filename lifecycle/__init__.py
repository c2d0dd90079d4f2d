"""Request lifecycle on the asyncio side: states and their transition table, admission and FCFS
deferral, cancel and disconnect, token sinks. Pure Python: no torch, nothing from engine/ or ep/;
it reaches the GPU thread only through the EngineClient protocol."""
from __future__ import annotations

from lifecycle.counters import SchedulerCounters
from lifecycle.engine_client import EngineClient
from lifecycle.observer import LifecycleObserver, NullObserver
from lifecycle.params import GenerationParams
from lifecycle.rejection import Draining, NotReady, QueueFull, Rejection
from lifecycle.request import Request
from lifecycle.scheduler import Scheduler
from lifecycle.sink import SinkEnd, SinkItem, TokenSink
from lifecycle.states import (
    TERMINAL,
    TRANSITIONS,
    FinishReason,
    IllegalTransition,
    RequestState,
    TerminalReason,
    advance,
)

__all__ = [
    "TERMINAL", "TRANSITIONS", "Draining", "EngineClient", "SchedulerCounters", "FinishReason", "GenerationParams",
    "IllegalTransition", "LifecycleObserver", "NotReady", "NullObserver", "QueueFull", "Rejection",
    "Request", "RequestState", "Scheduler", "SinkEnd", "SinkItem", "TerminalReason", "TokenSink",
    "advance",
]
