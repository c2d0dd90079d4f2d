"""The typed messages across the thread boundary: commands into the GPU thread, events out of it.
Plain data only (ints, strings, lists), so the asyncio side never touches a tensor."""
from __future__ import annotations

import dataclasses


# ---- commands (asyncio loop -> GPU thread) --------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Admit:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    request_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class Shutdown:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Stall:
    """Test hook: block the GPU thread for `seconds` (a stuck-thread drill for the watchdog)."""
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class InjectFailure:
    """Test hook: fail one running request as if the engine had failed it."""
    request_id: str
    message: str


Command = Admit | Cancel | Shutdown | Stall | InjectFailure


# ---- events (GPU thread -> asyncio loop), delivered as one StepEvents per step --------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Token:
    request_id: str
    token_id: int
    first: bool  # the prefill's token


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
    request_id: str
    reason: str  # "stop" | "length"


@dataclasses.dataclass(frozen=True, slots=True)
class Failed:
    request_id: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Released:
    """The engine dropped a cancelled request and freed its KV slot."""
    request_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    phase: str  # "prefill" | "decode" | "mixed"
    request_ids: list[str]
    rows: int
    decode_rows: int
    prefill_tokens: int
    positions_max: int
    started_ns: int  # time.time_ns() at the start of the step
    cpu_s: float  # wall time of the step on the GPU thread
    gpu_s: float | None  # CUDA-event time of the forward, when on a GPU
    routes_per_rank: list[int]
    routes_per_expert: list[int]
    collective_calls: int
    collective_bytes: int
    exchange_s: float
    kv_slots_used: int


@dataclasses.dataclass(frozen=True, slots=True)
class StepEvents:
    """Everything one step produced, in order: tokens, then terminal events."""
    tokens: list[Token]
    finished: list[Finished]
    failed: list[Failed]
    released: list[Released]
    record: StepRecord | None


@dataclasses.dataclass(frozen=True, slots=True)
class PrefillStarted:
    """Sent before the forward of a step in which these requests begin their prefill."""
    request_ids: list[str]
    started_ns: int


@dataclasses.dataclass(frozen=True, slots=True)
class EngineDied:
    """The GPU thread stopped on an error: every request it held has a Failed event in `failed`."""
    message: str
    failed: list[Failed]


Event = PrefillStarted | StepEvents | EngineDied
