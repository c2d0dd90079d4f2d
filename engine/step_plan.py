"""The typed boundary between the batcher and the runner (DESIGN.md, engine layers): a StepPlan says
what one forward step runs and who draws from it; a StepResult says what came out. The batcher
builds the plan and consumes the result (engine/batcher.py); the runner only reads the plan's rows,
draws, prompt log-prob wants, forks and feed (engine/runner.py), so the batcher can be tested with a
fake runner and no model (tests/engine/test_batcher.py).

Both are built once per step from lists made once: a 256-row decode step costs no more host time
than when these travelled as parallel lists."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from pegainfer.engine.batch import RowInput
from pegainfer.engine.contract import TopLogprobs
from pegainfer.engine.sampler import Draw, PromptWant

if TYPE_CHECKING:
    from pegainfer.engine.sequence import Sequence
    from pegainfer.engine.step_counters import ExchangeCounters


@dataclasses.dataclass(frozen=True, slots=True)
class Fork:
    """After the step: the n-1 siblings of a request of n choices take a copy of the first `length`
    KV positions of the slot that ran its shared prefill. Skipped when the request failed in the
    step (its forward row or one of its draws, in StepResult.failed_rows / failed)."""
    src: int  # the prefilled slot
    dst: tuple[int, ...]  # the siblings' slots
    length: int  # the prompt's length
    row: int  # the forward row of the last prompt chunk
    draws: range  # the request's draws (choice 0's, then its siblings')


_NONE: Mapping = MappingProxyType({})  # the shared empty default of the mappings below (never written)


class StepPlan(NamedTuple):
    """One forward step. Draw i chooses a token from forward row `draws[i].row` (sampling) or
    `draw_rows[i]` (the argmax fast path); a prompt chunk before its last draws nothing, and the last
    chunk of a request of n choices is read by n draws. Immutable: a NamedTuple, not a frozen
    dataclass, because one is built per step on the GPU thread's critical path and a frozen
    dataclass's __init__ of these twelve fields costs three times a tuple's."""
    rows: list[RowInput]  # the forward's rows, in order
    draws: list[Draw] | None = None  # per draw: its row and parameters; None: every draw is plain greedy
    draw_rows: list[int] | None = None  # greedy: each draw's forward row; None: draw i reads row i
    prompt_wants: Mapping[int, PromptWant] = _NONE  # forward row -> the prompt log-probs its chunk wants
    forks: tuple[Fork, ...] = ()
    # a step launched while the step before it is in flight (overlapped decode): row i's input is row
    # feed[i]'s token of that step, still on the device (-1: the id in rows[i])
    feed: list[int] | None = None
    # what the batcher scheduled; the runner never reads these
    seqs: list[Sequence] | tuple[Sequence, ...] = ()  # row i's sequence
    owners: list[Sequence] | tuple[Sequence, ...] = ()  # draw i's sequence
    decode_rows: int = 0  # rows of one token after the prompt
    prefill_tokens: int = 0
    positions_max: int = 0  # the largest position a row writes
    launchable: bool = False  # a decode step that may run overlapped (ModelRunner.launch): greedy, or sampled on the device

    @classmethod
    def greedy(cls, rows: list[RowInput]) -> StepPlan:
        """Every row's argmax next token (what tools and tests run outside the GPU thread)."""
        return cls(rows)

    @property
    def num_draws(self) -> int:
        if self.draws is not None:
            return len(self.draws)
        return len(self.rows) if self.draw_rows is None else len(self.draw_rows)


class StepResult(NamedTuple):
    """What a step produced. A draw or prompt row whose request's own values made its share of the
    step fail is left out (engine.request_guard): its token is -1, and `failed` / `failed_rows` say why;
    the other draws got what they would have got without it. Immutable, like the plan."""
    tokens: list[int]  # one per draw
    logprobs: list[float | None]  # one per draw: the chosen token's raw log-prob, where asked for
    top_logprobs: list[TopLogprobs]  # one per draw, cut to the N that draw asked for
    prompt: Mapping[int, list[tuple[float, TopLogprobs] | None]] = _NONE  # forward row -> its chunk's entries
    sampled: bool = False  # False: the argmax fast path ran
    failed: Mapping[int, str] = _NONE  # draw -> why (its request's values)
    failed_rows: Mapping[int, str] = _NONE  # forward row -> why its prompt log-probs failed
    gpu_s: float | None = None  # device time of the forward (engine.step_meter), when metered on a GPU
    counters: ExchangeCounters | None = None  # the EP backend's counters of the step, when metered

    @classmethod
    def greedy(cls, tokens: list[int], gpu_s: float | None = None, counters: ExchangeCounters | None = None
               ) -> StepResult:
        n = len(tokens)
        return cls(tokens, [None] * n, [()] * n, _NONE, False, _NONE, _NONE, gpu_s, counters)


def fed_order(rows: list[RowInput], items: list) -> list:
    """items (one per row) in the order a launch's feed indexes the step before: its one-token rows'
    first, then its prompt rows' (the decode graphs' token buffer, DecodeGraphs.follow)."""
    return [x for x, r in zip(items, rows) if not r.prompt] + [x for x, r in zip(items, rows) if r.prompt]
