"""The GPU side's scheduler: the requests waiting for KV capacity and the sequences running, FCFS
admission by free KV pages (engine/kv_capacity.py), pages taken as sequences grow and preemption
when none is left, the prefill budget, n-choice forks and which steps may run overlapped. It turns the
running sequences into one StepPlan per step and a StepResult back into the contract's events
(engine/step_plan.py); it never touches a tensor, so it is tested on the CPU with a fake runner
(tests/engine/test_batcher.py).

Every decoding sequence gets its token each step; prompts share the step's prefill budget in
arrival order, so a long prompt is fed in chunks while the others keep decoding (prompt log-probs
are computed chunk by chunk too). The prefill budget is max_prefill_tokens while nobody decodes; while
sequences decode, a step's tokens (its decode rows and its prompt chunks together) stay within
mixed_step_tokens, as vLLM's chunked prefill under max_num_batched_tokens, so that a long prompt
costs the decoding streams beside it a bounded step time; prompts always get at least
MIN_PROMPT_CHUNK tokens, so that decode rows filling the budget cannot starve them.

Pages: a sequence's prompt pages are taken at admission (shared ones from the prefix cache), its
decode pages as it reaches them. When a decode row needs a page and none is free, the newest running
sequences are preempted (their pages freed, they wait at the front of the queue) until one is; the
oldest always goes on. A preempted sequence is recomputed: its prompt prefilled again, then its own
generated tokens fed back as decode rows that draw nothing (Sequence.replay), computed exactly as
they first were, so it continues with the tokens it would have had. An overlapped successor never
preempts: when its rows need more pages than are free, it is not launched.

A request of n choices is n sequences sharing one prefill: the first sequence prefills, all n draw
their first token from its last row (each with its own seed stream), the n-1 siblings share its full
prompt pages and take a copy of the partial last one (the plan's forks), and decode on their own
slots. The request's Finished event comes once its last sequence has ended.

Overlapped decode (the daemon's --async-scheduling, as vLLM's async scheduling and SGLang's overlap
scheduler): while every running sequence decodes (greedily, or with any sampling parameters where
the runner chooses tokens inside the decode graph: `sampled_overlap`) and nobody waits for capacity,
a step is `launchable`, and the step after one in flight is its `successor`: its input ids are the step in
flight's tokens, taken on the device; its rows are that step's minus those that reach max_tokens
there. A sequence that ends for another reason (EOS, a stop token, a stop string, a cancel) is
learned one step late: its token from the successor is dropped. Admission, prefill, forks and
steps sampled on the host run one at a time, with nothing in flight, so freed capacity is never handed out
while a launched step may still write to it; except that with `overlap_admission` (the daemon's
--async-admission, engine/successor.py) plain greedy newcomers join a launched step, their writes
queued behind the step in flight's on the one device stream."""
from __future__ import annotations

import collections
import dataclasses

from pegainfer.engine.batch import RowInput
from pegainfer.engine.contract import Failed, Finished, PromptLogprobs, Token
from pegainfer.engine.kv_capacity import PagedCapacity
from pegainfer.engine.sampler import Draw, PromptWant
from pegainfer.engine.sequence import Sequence
from pegainfer.engine.step_plan import Fork, StepPlan, StepResult
from pegainfer.engine.successor import successor


@dataclasses.dataclass(slots=True)
class StepOutcome:
    """The events one step produced, and what its record says of whom it served."""
    tokens: list[Token]
    finished: list[Finished]
    failed: list[Failed]
    prompt_logprobs: list[PromptLogprobs]
    served: list[Sequence]  # the sequences the record names (a launched step: those still running)
    draws: int
    dropped: int = 0  # rows whose sequence ended while the step was in flight


MIN_PROMPT_CHUNK = 64  # prompt tokens a step still takes when decode rows fill mixed_step_tokens
MIXED_STEP_TOKENS = 8192  # the default step budget while sequences decode (docs/STATUS.md: why not 2048)


class Batcher:
    def __init__(self, capacity: PagedCapacity, eos_id: int | None, *, max_prefill_tokens: int = 8192,
                 overlap: bool = True, sampled_overlap: bool = False,
                 mixed_step_tokens: int = MIXED_STEP_TOKENS, overlap_admission: bool = False,
                 max_step_prompts: int = 0):
        self.capacity = capacity
        self.eos_id = eos_id
        self.max_prefill_tokens = max_prefill_tokens
        self.mixed_step_tokens = mixed_step_tokens  # decode rows + prompt tokens of a step while any decode
        # prompt rows (prompts and prompt chunks, recomputed ones included) a step takes at most; 0: no
        # bound. On CUDA a step with more prompt rows than the prefill graphs hold runs them eagerly
        # (engine/prefill_graphs.py MAX_ROWS), host-bound; a bound keeps such a wave in graphed steps.
        # admit() leaves the requests past it waiting (not yet prefilling) while the bound is reached
        if max_step_prompts < 0:
            raise ValueError(f"max_step_prompts must be 0 (no bound) or more, got {max_step_prompts}")
        self.max_step_prompts = max_step_prompts
        self.overlap = overlap  # let plain greedy decode steps run overlapped
        # sampled decode steps too: the runner chooses their tokens on the device (a launched step's
        # successor learns its penalties' history there), ModelRunner.samples_on_device
        self.sampled_overlap = sampled_overlap
        # plain greedy newcomers join a launched step (engine/successor.py), rather than waiting for
        # the step in flight to be read
        self.overlap_admission = overlap and overlap_admission
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: dict[tuple[str, int], Sequence] = {}  # (request id, choice index) -> sequence
        self.preemptions = 0  # sequences preempted so far
        self.preempted: list[tuple[str, int]] = []  # since take_preempted
        self.joined: list[tuple[str, int]] = []  # (request id, cached prompt tokens) the last successor admitted

    # ---- requests in and out ----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """A request admitted by engine.admission (its first sequence, carrying its siblings) waits."""
        self.waiting.append(seq)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def can_admit(self) -> bool:
        return bool(self.waiting) and self.capacity.fits(self.waiting[0])

    def admit(self) -> list[str]:
        """FCFS: take waiting requests while capacity is free for all of their choices (preempted
        sequences first: they wait at the front). Long prompts are not held back here: the step's
        prefill budget splits them into chunks. Returns the ids of the requests new to the engine."""
        admitted = []
        bound = self.max_step_prompts
        # running sequences with prompt rows still to run: each takes a prompt row of the next step
        pending = sum(s.slot >= 0 and s.cached < len(s.prompt_ids) for s in self.running.values()) if bound else 0
        while self.waiting and self.capacity.fits(self.waiting[0]) and not (bound and pending >= bound):
            pending += 1
            seq = self.waiting.popleft()
            self.capacity.take(seq)
            self.running[seq.key] = seq
            if not seq.preemptions:  # a preempted sequence resuming is no new request
                admitted.append(seq.request_id)
        return admitted

    def held_ids(self) -> list[str]:
        return list(dict.fromkeys([*(k[0] for k in self.running), *(s.request_id for s in self.waiting)]))

    def drop(self, request_id: str) -> bool:
        """Forget every sequence of a request and free their capacity; False if it held none."""
        found = False
        for key in [k for k in self.running if k[0] == request_id]:
            seq = self.running.pop(key)
            for s in (seq, *seq.forks):
                self.capacity.release(s)
            found = True
        kept = [s for s in self.waiting if s.request_id != request_id]  # preempted choices wait too
        if len(kept) < len(self.waiting):
            self.waiting = collections.deque(kept)
            return True
        return found

    def stop_choice(self, request_id: str, index: int) -> Finished | None:
        """A stop string ended a running choice; the request's Finished if it was the last one."""
        seq = self.running.get((request_id, index))
        if seq is None:
            waiting = next((s for s in self.waiting if s.key == (request_id, index) and s.slot < 0), None)
            if waiting is None or waiting.forks:
                return None
            self.waiting.remove(waiting)  # a preempted choice: it holds no pages
            end = waiting.group.end_one("stop")
            return Finished(request_id, end) if end is not None else None
        end = self._end(seq, "stop")
        return Finished(request_id, end) if end is not None else None

    def clear(self) -> None:
        """The engine died: forget everything (capacity with it)."""
        self.running.clear()
        self.waiting.clear()

    # ---- steps ------------------------------------------------------------------------------------
    def plan(self, launch: bool = False) -> StepPlan:
        """The next step over the running sequences. Only the step's first prompt is cut to the step's
        prompt budget (prompt_budget; a pure decode step never works it out); one that would not fit whole
        waits for the next step, with those behind it (FCFS), as do prompts past max_step_prompts.
        Scheduling a row advances its sequence's cached count. launch: the step may run overlapped if
        it is plain greedy decode."""
        full = budget = -1  # the step's prompt budget (prompt_budget), worked out at its first prompt row
        rows, seqs, owners, draw_rows, forks = [], [], [], [], []
        wants: dict[int, PromptWant] = {}
        held = False  # a prompt was held back: the later ones wait behind it
        plain = one_per_row = decoding = True  # all plain greedy / each row draws its own / all decode
        n_decode = prefill = ends = prompts = 0
        caching = self.capacity.caching
        for s in list(self.running.values()):  # a copy: growing may preempt the newest
            if s.slot < 0:
                continue  # preempted while this step was planned
            start, plen = s.cached, len(s.prompt_ids)
            if start >= plen:  # decoding: its last token (replaying: the next of its own tokens)
                ids = [s.output_ids[start - plen]] if s.replay else [s.output_ids[-1]]
                if start >= s.room and not self._grow(s, start + 1):
                    continue  # s itself was preempted: no newer sequence held pages it could take
                n_decode += 1
                if s.forks:
                    decoding = False
            else:
                if full < 0:  # the step's first prompt: its budget is known now, and it may be cut to it
                    full = budget = self.prompt_budget()
                elif held or budget <= 0 or (self.max_step_prompts and prompts >= self.max_step_prompts):
                    continue  # its next prompt chunk waits for a later step (with those behind it)
                elif plen - start > budget and budget < full:
                    held = True  # it would be cut beside other prompts
                    continue
                # a recomputed prompt stops where its prompt log-probs went out, so none goes out twice
                cut = s.echoed if start < s.echoed else plen
                ids = s.prompt_ids[start:min(start + budget, cut)]
                budget -= len(ids)
                prompts += 1
                decoding = False
                prefill += len(ids)
            end = start + len(ids)  # a prompt's pages were taken at admission
            r = len(rows)
            rows.append(RowInput(s.slot, ids, start, prompt=start < plen))
            seqs.append(s)
            s.cached = end
            if end > ends:
                ends = end
            if start < plen and caching:
                self.capacity.written(s, end)
            if not s.plain:
                plain = False
                if s.sampling.prompt_logprobs is not None and s.echoed <= start < plen:  # echo: this chunk's
                    wants[r] = PromptWant(s.sampling.prompt_logprobs, s.prompt_ids[start + 1:end + 1], start == 0)
                    s.echoed = end
            if s.replay:  # recomputing: no draw until the cache holds every token it had
                if end >= plen + len(s.output_ids) - 1:
                    s.replay = False
                one_per_row = decoding = False
                continue
            if end < plen:
                one_per_row = False
                continue  # a prompt chunk before the last: no token yet
            owners.append(s)
            draw_rows.append(r)
            if s.forks and start < plen:  # the siblings draw from this row too, then copy its cache
                one_per_row = False
                first = len(owners) - 1
                owners += s.forks
                draw_rows += [r] * len(s.forks)
                forks.append(Fork(s.slot, tuple(f.slot for f in s.forks), end, r, range(first, len(owners))))
        draws = None
        if not plain:
            draws = [Draw(r, s.sampling, s.seed, s.index, len(s.output_ids), s.prompt_ids, s.output_ids, s.params)
                     for s, r in zip(owners, draw_rows)]
        return StepPlan(rows, draws=draws, draw_rows=None if one_per_row else draw_rows, prompt_wants=wants,
                        forks=tuple(forks), seqs=seqs, owners=owners, decode_rows=n_decode, prefill_tokens=prefill,
                        positions_max=max(ends - 1, 0),
                        launchable=launch and self.overlap and (plain or self.sampled_overlap) and decoding
                        and one_per_row and not wants and bool(rows))

    def prompt_budget(self) -> int:
        """The prompt tokens of the next step: max_prefill_tokens with nobody decoding, else what
        mixed_step_tokens leaves beside the decode rows (at least MIN_PROMPT_CHUNK)."""
        n_decode = sum(len(s.prompt_ids) <= s.cached for s in self.running.values())
        if not n_decode:
            return self.max_prefill_tokens
        return min(self.max_prefill_tokens, max(self.mixed_step_tokens - n_decode, MIN_PROMPT_CHUNK))

    def successor(self, prev: StepPlan) -> StepPlan | None:
        """The step after `prev`, to launch before prev is read, or None (overlap off, a request waits
        for capacity that cannot join, or nobody wants another token), engine/successor.py. The
        requests it admitted, with their cached prompt tokens: `joined`."""
        plan, self.joined = successor(self, prev)
        return plan

    def settle(self, plan: StepPlan, result: StepResult) -> StepOutcome:
        """A step run to the end: forked siblings start decoding, requests the result failed are
        dropped (they alone), every other draw's token goes to its sequence."""
        failed: dict[str, str] = {}
        if result.failed or result.failed_rows:
            failed = {plan.owners[i].request_id: why for i, why in result.failed.items()}
            failed.update({plan.seqs[r].request_id: why for r, why in result.failed_rows.items()})
        for fork in plan.forks:
            seq = plan.seqs[fork.row]
            if seq.request_id not in failed:  # the runner copied its prefill to the siblings
                for f in seq.forks:
                    f.cached = seq.cached
                    self.running[f.key] = f
                seq.forks = []
        dropped = [Failed(rid, f"the engine could not serve this request: {why}") for rid, why in failed.items()
                   if self.drop(rid)]
        tokens: list[Token] = []
        finished: list[Finished] = []
        for seq, tok, lp, top in zip(plan.owners, result.tokens, result.logprobs, result.top_logprobs):
            if seq.request_id not in failed:
                self._take(seq, tok, lp, top, tokens, finished)
        prompt = []
        for r, entries in result.prompt.items():
            rid, start = plan.seqs[r].request_id, plan.rows[r].start_pos
            if rid not in failed:  # a later chunk's entries begin with its first token's successor
                prompt.append(PromptLogprobs(rid, entries, start + (start > 0)))
        return StepOutcome(tokens, finished, dropped, prompt, plan.seqs, len(plan.owners))

    def settle_launched(self, plan: StepPlan, result: StepResult) -> StepOutcome:
        """A launched step read back: sequences that ended while it ran drop their tokens."""
        tokens: list[Token] = []
        finished: list[Finished] = []
        live = []
        running = self.running
        dropped = []
        for i, why in result.failed.items():  # a draw of a device-sampled step failed on its own values
            seq = plan.owners[i]
            if running.get(seq.key) is seq and self.drop(seq.request_id):
                dropped.append(Failed(seq.request_id, f"the engine could not serve this request: {why}"))
        for seq, tok, lp, top in zip(plan.owners, result.tokens, result.logprobs, result.top_logprobs):
            if running.get(seq.key) is not seq:
                continue  # it ended (or was cancelled, or failed) while this step was in flight
            live.append(seq)
            self._take(seq, tok, lp, top, tokens, finished)
        draws = len(live)
        if plan.draw_rows is not None:  # prompt chunks before their last (admission overlapped) served too
            live += [s for s, r in zip(plan.seqs, plan.rows)
                     if r.prompt and r.start_pos + len(r.token_ids) < len(s.prompt_ids) and running.get(s.key) is s]
        return StepOutcome(tokens, finished, dropped, [], live, draws, len(plan.owners) - draws)

    def _grow(self, seq: Sequence, end: int) -> bool:
        """Pages for seq up to `end`, preempting the newest running sequences (never one planned
        already: they come before seq) while none is free. False: seq itself was the newest."""
        while not self.capacity.grow(seq, end):
            victim = next(reversed(self.running.values()))
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's pages and queue it ahead of new requests, to be recomputed: its
        prompt prefilled again, then its generated tokens fed back (Sequence.replay), so that it goes
        on with exactly the tokens it would have had. Sampling repeats too: a draw's randomness is a
        function of the request's seed and the position (engine/counter_rng.py)."""
        del self.running[seq.key]
        for s in (seq, *seq.forks):
            self.capacity.release(s)
        seq.cached = 0
        seq.replay = bool(seq.output_ids)
        seq.preemptions += 1
        self.preemptions += 1
        self.preempted.append((seq.request_id, seq.index))
        self.waiting.appendleft(seq)

    def take_preempted(self) -> list[tuple[str, int]]:
        """(request id, choice) of the sequences preempted since the last call."""
        out, self.preempted = self.preempted, []
        return out

    def _take(self, seq: Sequence, tok: int, logprob, top, tokens: list[Token], finished: list[Finished]) -> None:
        """Give a chosen token to its sequence: its Token event, and the request's Finished when that
        ended the request's last sequence."""
        seq.output_ids.append(tok)
        reason = seq.finish_reason(self.eos_id)
        tokens.append(Token(seq.request_id, tok, len(seq.output_ids) == 1, seq.index, logprob, top, reason))
        if reason is not None:
            end = self._end(seq, reason)
            if end is not None:
                finished.append(Finished(seq.request_id, end))

    def _end(self, seq: Sequence, reason: str) -> str | None:
        """One sequence ended: free its capacity; the request's reason if it was the last one."""
        del self.running[seq.key]
        self.capacity.release(seq)
        return seq.group.end_one(reason)
