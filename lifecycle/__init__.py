"""Request lifecycle on the asyncio side: the transition table between request states, admission
and FCFS deferral, cancel, disconnect and stop strings, token sinks. Pure Python: the standard
library and the contract (engine/contract.py) only, no torch, nothing else from engine/ or ep/;
it reaches the GPU thread only through the EngineClient protocol."""
from __future__ import annotations

from lifecycle.counters import SchedulerCounters
from lifecycle.engine_client import EngineClient
from lifecycle.observer import LifecycleObserver, NullObserver
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
    "TERMINAL", "TRANSITIONS", "Draining", "EngineClient", "SchedulerCounters", "FinishReason",
    "IllegalTransition", "LifecycleObserver", "NotReady", "NullObserver", "QueueFull", "Rejection",
    "Request", "RequestState", "Scheduler", "SinkEnd", "SinkItem", "TerminalReason", "TokenSink",
    "advance",
]
