"""The contract between the GPU side and the rest (torch-free, stdlib only): the typed commands into
the GPU thread and the events out of it, the sampling specification, the step record. Plain data only
(ints, floats, strings, tuples, lists), so the asyncio side never touches a tensor."""
from __future__ import annotations

import dataclasses

# A top-N list: (token id, log-probability) pairs, most likely first.
TopLogprobs = tuple[tuple[int, float], ...]
MAX_STALL_S = 600.0  # the longest Stall the test hook accepts
# A temperature below this is greedy (vLLM's _SAMPLING_EPS): dividing logits by it could overflow.
GREEDY_BELOW = 1e-5


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingSpec:
    """How one request's tokens are chosen. The defaults are greedy decoding without log-probs:
    a request with only defaults takes the engine's argmax fast path."""
    temperature: float = 0.0  # 0: greedy (argmax of the penalised logits)
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None  # None: the engine draws one
    logprobs: int | None = None  # per sampled token: its log-prob and the top-N (N may be 0)
    prompt_logprobs: int | None = None  # per prompt token likewise (the first has none)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit before anything else)

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def plain_greedy(self) -> bool:
        """Nothing beyond the argmax of the raw logits is needed."""
        return (self.temperature < GREEDY_BELOW and not self.penalised and self.logprobs is None
                and self.prompt_logprobs is None and not self.logit_bias)


# ---- commands (asyncio loop -> GPU thread) --------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Admit:
    """A request of `n` sequences (choices 0..n-1) that share one prefill of `prompt_ids`."""
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool = False
    sampling: SamplingSpec = SamplingSpec()
    n: int = 1
    stop_token_ids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class StopChoice:
    """The daemon found a stop string in choice `index`'s text: finish that sequence now ("stop")."""
    request_id: str
    index: int


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

    def __post_init__(self) -> None:
        # checked here, on the sender's side: time.sleep raises on a negative, NaN or huge value, and
        # an exception in the GPU thread ends the engine with every request it holds
        if not (isinstance(self.seconds, (int, float)) and 0 <= self.seconds <= MAX_STALL_S):
            raise ValueError(f"Stall seconds must be in [0, {MAX_STALL_S:g}], got {self.seconds!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class InjectFailure:
    """Test hook: fail one running request as if the engine had failed it."""
    request_id: str
    message: str


Command = Admit | StopChoice | Cancel | Shutdown | Stall | InjectFailure


# ---- events (GPU thread -> asyncio loop), delivered as one StepEvents per step --------------------
@dataclasses.dataclass(slots=True)
class Token:
    """One sampled token; read-only once sent like every other event. Not declared frozen only
    because the GPU thread makes one per row per step, and a frozen dataclass's __init__ (one
    object.__setattr__ per field) costs four times a plain one's."""
    request_id: str
    token_id: int
    first: bool  # the prefill's token
    index: int = 0  # which choice (sequence) of the request
    logprob: float | None = None  # log-softmax of the raw logits at token_id, when asked for
    top_logprobs: TopLogprobs = ()
    finish_reason: str | None = None  # set on a choice's last token: "stop" (EOS / stop token) | "length"


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
    """Every sequence of the request has ended: "length" if any hit max_tokens, else "stop"."""
    request_id: str
    reason: str  # "stop" | "length"


@dataclasses.dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """Per prompt token: (its log-prob given the tokens before it, the top-N); None for the first.
    A prompt fed in chunks sends one event per chunk: `entries` are those of prompt tokens
    start, start + 1, ... (the chunks' entries joined in order are the whole prompt's)."""
    request_id: str
    entries: list[tuple[float, TopLogprobs] | None]
    start: int = 0


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
    cpu_s: float  # wall time of the step on the GPU thread (overlapped: from its launch to its read-back)
    gpu_s: float | None  # CUDA-event time of the forward, when on a GPU
    routes_per_rank: list[int]
    routes_per_expert: list[int]
    collective_calls: int
    collective_bytes: int
    exchange_s: float
    kv_slots_used: int
    draws: int = 0  # tokens chosen this step (a prefill of n choices draws n from one row)
    sampled: bool = False  # the step took the sampling path (logits out), not the argmax fast path
    overlapped: bool = False  # launched before the step ahead of it was read (ids fed on the device)
    dropped_rows: int = 0  # rows whose sequence ended before the step was read: their tokens were dropped


@dataclasses.dataclass(frozen=True, slots=True)
class StepEvents:
    """Everything one step produced, in order: prompt log-probs, tokens, then terminal events."""
    tokens: list[Token]
    finished: list[Finished]
    failed: list[Failed]
    released: list[Released]
    record: StepRecord | None
    prompt_logprobs: list[PromptLogprobs] = dataclasses.field(default_factory=list)


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
