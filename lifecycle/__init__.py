"""Request lifecycle on the asyncio side: the transition table between request states, admission
and FCFS deferral, cancel, disconnect and stop strings, token sinks. Pure Python: the standard
library and the contract (engine/contract.py) only, no torch, nothing else from engine/ or ep/;
it reaches the GPU thread only through the EngineClient protocol."""
from __future__ import annotations

from pegainfer.lifecycle.counters import SchedulerCounters
from pegainfer.lifecycle.engine_client import EngineClient
from pegainfer.lifecycle.observer import LifecycleObserver, NullObserver
from pegainfer.lifecycle.rejection import Draining, NotReady, QueueFull, Rejection
from pegainfer.lifecycle.request import Request
from pegainfer.lifecycle.scheduler import Scheduler
from pegainfer.lifecycle.sink import SinkEnd, SinkItem, TokenSink
from pegainfer.lifecycle.states import (
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
