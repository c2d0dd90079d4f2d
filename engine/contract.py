"""The contract between the layers (torch-free, stdlib only): the one definition of every piece of
request data that crosses a package boundary. lifecycle/, telemetry/ and daemon/ take nothing else
from engine/ (tests/test_layering.py pins it), and ep/ may use it too.

- The request vocabulary: finish reasons, request states, terminal reasons.
- The sampling parameters, and the bounds table with the one check of every request field, run
  where the request is parsed (daemon/protocol.py); the engine only asserts what it needs.
- The typed commands into the GPU thread and the events out of it (tokens, prompt log-probs,
  terminal events, step records, the engine snapshot that /ready and the metrics read).

Plain data only (ints, floats, strings, tuples, lists, enums), so the asyncio side never touches a
tensor and never reads an object the GPU thread owns."""
from __future__ import annotations

import dataclasses
import enum
import math

# A top-N list: (token id, log-probability) pairs, most likely first.
TopLogprobs = tuple[tuple[int, float], ...]
MAX_STALL_S = 600.0  # the longest Stall the test hook accepts
# A temperature below this is greedy (vLLM's _SAMPLING_EPS): dividing logits by it could overflow.
GREEDY_BELOW = 1e-5


# ---- the request vocabulary ------------------------------------------------------------------------
class FinishReason(enum.StrEnum):
    """Why a sequence or a FINISHED request stopped, in OpenAI's words: a str, the value a response carries."""
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens


class RequestState(enum.Enum):
    """A request's state on the asyncio side (lifecycle/states.py holds the transition table)."""
    RECEIVED = "received"
    PENDING = "pending"
    ADMITTED = "admitted"
    PREFILL = "prefill"
    DECODE = "decode"
    # everything below is terminal (see TERMINAL)
    FINISHED = "finished"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    DISCONNECTED = "disconnected"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL: frozenset[RequestState] = frozenset({
    RequestState.FINISHED, RequestState.REJECTED, RequestState.CANCELLED, RequestState.DISCONNECTED,
    RequestState.FAILED,
})
# The states in which the engine (GPU thread) holds the request and a KV slot is reserved for it.
ENGINE_HELD: frozenset[RequestState] = frozenset({RequestState.ADMITTED, RequestState.PREFILL, RequestState.DECODE})


class TerminalReason(enum.Enum):
    """The telemetry vocabulary for how a request ended (one per terminal state, two for FINISHED)."""
    COMPLETED_LENGTH = "completed_length"
    COMPLETED_STOP = "completed_stop"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    DISCONNECTED = "disconnected"
    FAILED = "failed"


# ---- the bounds of every request field -------------------------------------------------------------
MAX_LOGPROBS = 5  # the most top log-probs a token may ask for (OpenAI's limit for completions)
MAX_CHOICES = 16  # the most sequences one request may generate (n, or best_of)
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1  # every integer a request carries fits a signed 64-bit one
MAX_LOGIT_BIAS = 100.0  # |bias| per token, as OpenAI documents
MAX_LOGIT_BIAS_ENTRIES = 300  # tokens one request may bias


class ParamError(ValueError):
    """A request field outside its bound; `param` names the field (the API error's `param`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class ParamTypeError(ParamError, TypeError):
    """A request field of the wrong type (a bool or a float where an integer goes, a string...)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Bound:
    """An allowed interval; `integer` demands an int (never a bool or a float)."""
    low: float
    high: float
    integer: bool = False
    open_low: bool = False  # the low end itself is excluded
    off: tuple[int, ...] = ()  # integers below `low` that are allowed and mean "off" (top_k's -1 and 0)

    def problem(self, name: str, value: object) -> ParamError | None:
        """The error for `value` as parameter `name`; None when it is allowed."""
        if self.integer and isinstance(value, float) and abs(value) >= 2**63:  # a JSON integer past 64 bits
            return ParamError(name, f"'{name}' must be {self.describe()}, got {value:.17g} (out of range)")
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            kind = "an integer" if self.integer else "a number"
            return ParamTypeError(name, f"'{name}' must be {kind}, got {type(value).__name__}")
        if value in self.off:
            return None
        nan = isinstance(value, float) and math.isnan(value)
        if nan or value < self.low or value > self.high or (self.open_low and value == self.low):
            return ParamError(name, f"'{name}' must be {self.describe()}, got {value}")
        return None

    def describe(self) -> str:
        span = f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}]"
        if self.integer and self.high == INT64_MAX:
            span = f">= {self.low:g} (a signed 64-bit integer)" if self.low > INT64_MIN else "a signed 64-bit integer"
        return span if not self.off else f"{' or '.join(map(str, self.off))} (off) or {span}"


BOUNDS: dict[str, Bound] = {
    "max_tokens": Bound(1, INT64_MAX, integer=True),
    "temperature": Bound(0.0, 2.0),
    "top_p": Bound(0.0, 1.0, open_low=True),
    "top_k": Bound(1, INT64_MAX, integer=True, off=(-1, 0)),  # 0 too, as vLLM; at most the vocabulary: the daemon
    "min_p": Bound(0.0, 1.0),
    "seed": Bound(INT64_MIN, INT64_MAX, integer=True),
    "presence_penalty": Bound(-2.0, 2.0),
    "frequency_penalty": Bound(-2.0, 2.0),
    "repetition_penalty": Bound(0.0, 2.0, open_low=True),  # (0, 2], as SGLang; 1 is neutral
    "logprobs": Bound(0, MAX_LOGPROBS, integer=True),
    "prompt_logprobs": Bound(0, MAX_LOGPROBS, integer=True),
    "n": Bound(1, MAX_CHOICES, integer=True),
    "best_of": Bound(1, MAX_CHOICES, integer=True),
    "token_id": Bound(0, INT64_MAX, integer=True),  # a prompt or stop token id (the vocabulary: the daemon)
    "logit_bias": Bound(-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS),
}


def check(name: str, value: object, bound: str | None = None) -> object:
    """`value`, if BOUNDS[bound or name] allows it as parameter `name`; else raise its ParamError."""
    found = BOUNDS[bound or name].problem(name, value)
    if found is not None:
        raise found
    return value


# ---- sampling parameters -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request's tokens are chosen: the one definition, from the parsed request through the
    lifecycle's request to the engine's Admit. The defaults are greedy decoding without log-probs:
    a request with only defaults takes the engine's argmax fast path. `checked` validates against
    BOUNDS (the API's policy); the plain constructor does not, so the engine's tests can hand it
    values only the engine's own domain checks (engine/draw_params.py) refuse."""
    temperature: float = 0.0  # 0: greedy (argmax of the penalised logits)
    top_p: float = 1.0
    top_k: int = -1  # -1: off (`checked` takes 0 as off too and makes it -1, BOUNDS' first "off")
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None  # None: the engine draws one
    logprobs: int | None = None  # per sampled token: its log-prob and the top-N (N may be 0)
    prompt_logprobs: int | None = None  # per prompt token likewise (the first has none)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit before anything else)

    @classmethod
    def checked(cls, **sent: object) -> SamplingParams:
        """The parameters as a request sent them (None or absent: the default), each checked against
        BOUNDS in the order of the fields below (so a request with two bad fields hears of the
        same one every time), numbers made floats; raises the first bad field's ParamError.
        logit_bias: (token id, bias) pairs. The vocabulary's bounds are the daemon's (protocol.py)."""
        unknown = set(sent) - set(_CHECKED)
        if unknown:
            raise TypeError(f"not a sampling parameter: {sorted(unknown)}")
        fields: dict[str, object] = {}
        for name in _CHECKED:
            value = sent.get(name)
            if name == "logit_bias":
                fields[name] = _checked_bias(() if value is None else value)
            elif value is not None:
                check(name, value)
                bound = BOUNDS[name]  # an "off" value as its first spelling (top_k 0: -1)
                fields[name] = (bound.off[0] if value in bound.off else value) if bound.integer else float(value)
        return cls(**fields)

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def plain_greedy(self) -> bool:
        """Nothing beyond the argmax of the raw logits is needed."""
        return (self.temperature < GREEDY_BELOW and not self.penalised and self.logprobs is None
                and self.prompt_logprobs is None and not self.logit_bias)


_CHECKED = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "logit_bias", "logprobs", "prompt_logprobs")


def _checked_bias(pairs: tuple[tuple[int, object], ...]) -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs: at most MAX_LOGIT_BIAS_ENTRIES, ids distinct, biases within bounds."""
    if not isinstance(pairs, tuple) or not all(isinstance(e, tuple) and len(e) == 2 for e in pairs):
        raise ParamTypeError("logit_bias", "'logit_bias' must be (token id, bias) pairs")
    if len(pairs) > MAX_LOGIT_BIAS_ENTRIES:
        raise ParamError("logit_bias", f"'logit_bias' may name at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got "
                                       f"{len(pairs)}")
    out: dict[int, float] = {}
    for token, bias in pairs:
        check("logit_bias", token, "token_id")
        if token in out:
            raise ParamError("logit_bias", f"'logit_bias' names token {token} twice")
        out[token] = float(check("logit_bias", bias))
    return tuple(out.items())


# ---- commands (asyncio loop -> GPU thread) --------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Admit:
    """A request of `n` sequences (choices 0..n-1) that share one prefill of `prompt_ids`. Built once,
    where the request is parsed, with every field inside its bounds (the vocabulary and context
    limits included); the lifecycle's Request carries it unchanged to the engine."""
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool = False
    sampling: SamplingParams = SamplingParams()
    n: int = 1
    stop_token_ids: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class StopChoice:
    """The daemon found a stop string in choice `index`'s text; the scheduler asks the engine to
    finish that sequence now ("stop")."""
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
    finish_reason: FinishReason | None = None  # set on a choice's last token: STOP (EOS / stop token) | LENGTH


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
    """Every sequence of the request has ended: "length" if any hit max_tokens, else "stop"."""
    request_id: str
    reason: FinishReason


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
class EngineSnapshot:
    """The GPU thread's state as the asyncio side may know it: published with every StepEvents and
    with EngineDied (and taken once before the thread starts). /ready and the metrics read this,
    never the thread's own objects."""
    steps: int  # steps run so far
    decode_batch_max: int  # the largest decode batch so far
    running: int  # sequences holding a KV slot
    waiting: int  # requests admitted by the scheduler, waiting for KV slots
    overlapped_steps: int  # steps launched while the one before was in flight
    async_scheduling: bool  # overlapped decode is on
    kv_slots_free: int
    kv_slots_total: int
    kv_pages_free: int = 0  # KV pages free, or cached and unreferenced (engine/kv_pages.py)
    kv_pages_total: int = 0
    kv_page_size: int = 0  # tokens per page
    preemptions: int = 0  # sequences preempted (to be recomputed) so far
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache so far
    prefix_cache_hits: int = 0  # of which found there

    @property
    def kv_slots_used(self) -> int:
        return self.kv_slots_total - self.kv_slots_free

    @property
    def kv_pages_used(self) -> int:
        return self.kv_pages_total - self.kv_pages_free


@dataclasses.dataclass(frozen=True, slots=True)
class StepEvents:
    """Everything one step produced, in order: prompt log-probs, tokens, then terminal events."""
    tokens: list[Token]
    finished: list[Finished]
    failed: list[Failed]
    released: list[Released]
    record: StepRecord | None
    prompt_logprobs: list[PromptLogprobs] = dataclasses.field(default_factory=list)
    snapshot: EngineSnapshot | None = None  # the engine's state once these events happened
    # (request id, choice) preempted in planning: pages freed, recomputed later, nothing lost (engine/batcher.py)
    preempted: list[tuple[str, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class PrefillStarted:
    """Sent before the forward of a step in which these requests begin their prefill."""
    request_ids: list[str]
    started_ns: int
    cached_tokens: list[int] = dataclasses.field(default_factory=list)  # per request: prefix-cache hits


@dataclasses.dataclass(frozen=True, slots=True)
class EngineDied:
    """The GPU thread stopped on an error: every request it held has a Failed event in `failed`."""
    message: str
    failed: list[Failed]
    snapshot: EngineSnapshot | None = None


Event = PrefillStarted | StepEvents | EngineDied
