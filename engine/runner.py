"""One forward step over a StepPlan's rows and the choice of each draw's token (engine/step_plan.py).
On CUDA the one-token (decode) rows replay a captured graph; prompt rows run a prefill graph or
eagerly beside them.

Three entry points: run(plan) runs a step and reads its tokens; launch(plan) starts a decode step
(greedy, or device-sampled) without waiting, and collect(launched) reads it (overlapped decode: the GPU thread
launches step N+1, its ids fed from step N's tokens on the device, before it reads step N).

Three ways out of the forward: when every draw of the step is plain greedy (temperature 0, no
penalties, no log-probs) the graphs return the argmax they compute on the device, exactly as before
sampling existed. Otherwise the decode rows' draws are chosen on the device inside the decode graph
(engine.device_sampler, issue 33: no logits leave the graph, and such a step may be launched and
collected like a greedy one), and the prompt rows' draws (a request's first token) by
engine.sampler on their logits. Without a device sampler (no graphs, or sampler "off") every draw
goes to engine.sampler in one batched call. engine.sampler runs under engine.request_guard: one
request's faulty values fail that request alone; the device sampler takes values checked on the
host (engine/draw_params.py) and fails a draw it cannot convert alone. A step with rows that want prompt log-probs (echo with logprobs) runs eagerly and turns the
hidden states of those chunks into log-probs a slice of positions at a time. After the forward, the
plan's forks copy a shared prefill's partial last KV page to its siblings (they share its full pages)."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import dataclasses

import torch

from pegainfer.engine.batch import Batch, RowInput
from pegainfer.engine.cuda_graphs import DecodeGraphs, Launched, wait_and_read
from pegainfer.engine.kv_cache import MLACache
from pegainfer.engine.model.model import DeepseekV2
from pegainfer.engine.phases import phase
from pegainfer.engine.prefill_graphs import PrefillGraphs
from pegainfer.engine.request_guard import choose, per_row
from pegainfer.engine.sampler import Draw, PromptWant, prompt_logprobs
from pegainfer.engine.step_meter import Events, StepMeter
from pegainfer.engine.step_plan import Fork, StepPlan, StepResult, fed_order


class LaunchedStep:
    """A decode step on its way (ModelRunner.launch): its tokens' handle, its device timing, its
    counters and its draws (None: greedy), read by ModelRunner.collect."""
    __slots__ = ("handle", "events", "counters", "draws", "draw_rows")

    def __init__(self, handle, events: Events | None, counters: Callable[[], object] | None,
                 draws: list[Draw] | None = None, draw_rows: list[int] | None = None):
        self.handle, self.events, self.counters, self.draws = handle, events, counters, draws
        self.draw_rows = draw_rows  # greedy: each draw's row (None: one per row)


class MixedLaunch:
    """A launched greedy step with prompt rows (admission overlapped): the prompts in the prefill
    graph (or eagerly: their tokens already read), the one-token rows in the decode graph."""
    __slots__ = ("prompt", "decode", "first", "rest")

    def __init__(self, prompt: list[int], decode: list[int], first, rest: Launched | None):
        self.prompt, self.decode, self.first, self.rest = prompt, decode, first, rest


class ModelRunner:
    def __init__(self, model: DeepseekV2, cache: MLACache, device: torch.device | str,
                 graphs: DecodeGraphs | None = None, prefill_graphs: PrefillGraphs | None = None):
        self.model = model
        self.cache = cache
        self.device = device
        self.graphs = graphs
        self.prefill_graphs = prefill_graphs
        self._eager_last: list[int] | None = None  # the last eager launch's tokens (what a feed reads)

    @property
    def samples_on_device(self) -> bool:
        """Decode rows' draws are chosen inside the decode graph: sampled steps may be launched."""
        return self.graphs is not None and self.graphs.sampler is not None

    def run(self, plan: StepPlan, meter: StepMeter | None = None) -> StepResult:
        """The step with a token chosen per draw (several draws may read one row: the first step of
        a request with n choices), then its forks. A draw or prompt row whose request's values make
        its share of the work raise is left out (StepResult.failed, failed_rows); the others get
        what they would have got without it. meter: time the forward and take the step's counters."""
        self.cache.flush()  # the page table changes the batcher made for this step
        events = meter.start() if meter is not None else None
        draws, sampled = plan.draws, None
        if not plan.prompt_wants and (draws is None or all(d.spec.plain_greedy for d in draws)):
            greedy = self._greedy(plan.rows)
            if draws is not None:
                tokens = [greedy[d.row] for d in draws]
            else:
                tokens = greedy if plan.draw_rows is None else [greedy[r] for r in plan.draw_rows]
        elif draws is None:
            raise ValueError("a step that wants prompt log-probs takes the sampling path: give its draws")
        else:
            sampled = self._sample(plan.rows, draws, plan.prompt_wants)
        if meter is not None:
            meter.stop(events)
        for fork in plan.forks:  # not for a request that failed in this step: it is dropped
            if sampled is None or not (fork.row in sampled.failed_rows or any(d in sampled.failed for d in fork.draws)):
                self._fork(fork)
        gpu_s = counters = None
        if meter is not None:
            gpu_s, counters = meter.seconds(events), meter.counters()
        if sampled is None:
            return StepResult.greedy(tokens, gpu_s, counters)
        return sampled if meter is None else sampled._replace(gpu_s=gpu_s, counters=counters)

    def launch(self, plan: StepPlan, meter: StepMeter | None = None) -> LaunchedStep:
        """Start a step of decode rows without waiting for its tokens (collect() reads them), so the
        host can prepare the next step while this one runs; plan.feed may take input ids from the
        tokens of the step launched just before, which the host has not read yet. A plan with draws
        (one per row, in order) needs the device sampler (samples_on_device)."""
        self.cache.flush()
        events = meter.start() if meter is not None else None
        if plan.draws is None:
            handle = self._launch(plan.rows, plan.feed)
        elif not self.samples_on_device:
            raise RuntimeError("a sampled step is launched only where the decode graph samples on the device")
        else:
            handle = self.graphs.launch(plan.rows, plan.feed, plan.draws)
        counters = meter.stop_launched(events) if meter is not None else None
        return LaunchedStep(handle, events, counters, plan.draws, plan.draw_rows)

    def collect(self, launched: LaunchedStep) -> StepResult:
        """The tokens of a launched step (one per row), with its log-probs, timing and counters."""
        gpu_s = StepMeter.seconds(launched.events)
        counters = launched.counters() if launched.counters is not None else None
        if launched.draws is None:
            tokens = self._collect(launched.handle)
            if launched.draw_rows is not None:  # a prompt chunk before its last draws nothing
                tokens = [tokens[r] for r in launched.draw_rows]
            return StepResult.greedy(tokens, gpu_s, counters)
        return self._sampled(launched.handle, launched.draws)._replace(gpu_s=gpu_s, counters=counters)

    def _sampled(self, handle: Launched, draws: list[Draw]) -> StepResult:
        """A device-sampled step's result, once it is done (a failed draw's token is -1)."""
        tokens = self.graphs.collect(handle)
        failed = handle.failed
        for i in failed:
            tokens[i] = -1
        chosen, tops = self.graphs.logprobs(handle, draws)
        return StepResult(tokens, chosen, tops, {}, True, failed, {})

    # ---- the device side (tools/benchkit/fake_device.py stands in for _greedy, _launch, _collect) --
    def _greedy(self, rows: list[RowInput]) -> list[int]:
        """Run the rows' new tokens through the model; return each row's greedy next token."""
        self._eager_last = None
        if self.graphs is None:
            return self._eager(rows)
        decode, prompt = _split(rows)
        if not prompt:
            return self.graphs.run(rows)
        out = [0] * len(rows)
        prompt_rows = [rows[i] for i in prompt]
        pg = self.prefill_graphs
        first = pg.run(prompt_rows) if pg is not None and pg.fits(prompt_rows) else self._eager(prompt_rows)
        for i, tok in zip(prompt, first):
            out[i] = tok
        if decode:
            for i, tok in zip(decode, self.graphs.run([rows[i] for i in decode])):
                out[i] = tok
        return out

    def _launch(self, rows: list[RowInput], feed: list[int] | None) -> Launched | MixedLaunch | list[int]:
        """feed[i] = j >= 0: row i's input is token j of the step launched just before, its one-token
        rows' first and then its prompt rows' (-1: the id in rows[i]). Prompt rows (admission
        overlapped) go to the prefill graph beside the decode graph's launch. The eager path has nothing
        to overlap: it runs the step at once."""
        feed = _fed(feed)
        if self.graphs is not None:
            decode, prompt = _split(rows)
            if not prompt:
                return self.graphs.launch(rows, feed)
            prompt_rows = [rows[i] for i in prompt]
            pg = self.prefill_graphs
            if pg is not None and pg.fits(prompt_rows):
                out, first = pg.launch(prompt_rows, keep=True)
            else:
                first = self._eager(prompt_rows)
                out = torch.tensor(first, dtype=torch.int64, device=self.graphs.tokens.device)
            rest = None
            if decode:
                rest = self.graphs.launch([rows[i] for i in decode], _fed(feed and [feed[i] for i in decode]))
            # after the decode graph, which writes its padding rows over the buffer: the prompts'
            # first tokens, from a buffer of their own (outside the graphs' shared pool)
            self.graphs.follow(len(decode), out)  # for the next launch's feed
            return MixedLaunch(prompt, decode, first, rest)
        if feed is not None:
            prev = self._eager_last
            if prev is None:
                raise RuntimeError("a decode feed needs the step before to be a launched greedy step")
            rows = [r if j < 0 else RowInput(r.slot, [prev[j]], r.start_pos) for r, j in zip(rows, feed)]
        tokens = self._eager(rows)
        self._eager_last = fed_order(rows, tokens)  # what the decode graphs' token buffer would hold
        return tokens

    def _collect(self, handle: Launched | MixedLaunch | list[int]) -> list[int]:
        if isinstance(handle, list):
            return handle
        if not isinstance(handle, MixedLaunch):
            return self.graphs.collect(handle)
        out = [0] * (len(handle.prompt) + len(handle.decode))
        for i, tok in zip(handle.prompt, PrefillGraphs.read(handle.first)):
            out[i] = tok
        if handle.rest is not None:
            for i, tok in zip(handle.decode, self.graphs.collect(handle.rest)):
                out[i] = tok
        return out

    def _sample(self, rows: list[RowInput], draws: list[Draw], wants: Mapping[int, PromptWant]) -> StepResult:
        """The decode rows' draws on the device (launched first), the prompt rows' by engine.sampler
        (_host_sample, on those rows alone), merged back in the plan's order."""
        decode = _split(rows)[0] if self.samples_on_device else []
        at = {r: j for j, r in enumerate(decode)}  # decode row -> its graph row
        on_device = [i for i, d in enumerate(draws) if d.row in at]
        if not on_device:
            return self._host_sample(rows, draws, wants)
        self._eager_last = None
        if [draws[i].row for i in on_device] != decode:  # one draw per decode row, in row order
            raise RuntimeError("a decode row is drawn from other than once")
        if len(decode) == len(rows):  # a decode step: draw i reads row i
            return self._sampled(self.graphs.launch(rows, None, draws), draws)
        # draw j of on_device reads graph row j (the device sampler goes by position, not Draw.row)
        handle = self.graphs.launch([rows[r] for r in decode], None, [draws[i] for i in on_device])
        prompt = [r for r in range(len(rows)) if r not in at]
        pos = {r: j for j, r in enumerate(prompt)}  # prompt row -> its row in the host step
        others = [i for i in range(len(draws)) if draws[i].row not in at]
        host = self._host_sample([rows[r] for r in prompt],
                                 [dataclasses.replace(draws[i], row=pos[draws[i].row]) for i in others],
                                 {pos[r]: w for r, w in wants.items()})
        dev = self._sampled(handle, [draws[i] for i in on_device])
        n = len(draws)
        tokens, chosen, tops = [-1] * n, [None] * n, [()] * n
        for part, idx in ((dev, on_device), (host, others)):
            for j, i in enumerate(idx):
                tokens[i], chosen[i], tops[i] = part.tokens[j], part.logprobs[j], part.top_logprobs[j]
        failed = {on_device[j]: why for j, why in dev.failed.items()} | {others[j]: why for j, why in host.failed.items()}
        return StepResult(tokens, chosen, tops, {prompt[j]: e for j, e in host.prompt.items()}, True, failed,
                          {prompt[j]: why for j, why in host.failed_rows.items()})

    def _host_sample(self, rows: list[RowInput], draws: list[Draw], wants: Mapping[int, PromptWant]) -> StepResult:
        if wants:
            logits, prompt, failed_rows = self._prompt_step(rows, wants)  # [R, V]
        else:
            logits, prompt, failed_rows = self._logits(rows), {}, {}
        with phase("sampling"):
            out, kept, failed = choose(logits, draws)
        n = len(draws)
        tokens, chosen, tops = [-1] * n, [None] * n, [()] * n  # a failed draw keeps these
        if out is None:
            return StepResult(tokens, chosen, tops, prompt, True, failed, failed_rows)
        # waits for the device with the GIL released; the reads below are quick
        for s, tok in zip(kept, _read(out.tokens)):
            tokens[s] = tok
        if out.logprobs is not None:
            lps, ids, vals = out.logprobs.tolist(), out.top_ids.tolist(), out.top_logprobs.tolist()
            for j, s in enumerate(kept):
                want = draws[s].spec.logprobs
                if want is not None:
                    chosen[s], tops[s] = lps[j], tuple(zip(ids[j][:want], vals[j][:want]))
        return StepResult(tokens, chosen, tops, prompt, True, failed, failed_rows)

    def _logits(self, rows: list[RowInput]) -> torch.Tensor:
        """[R, V] float32 logits of every row's last new token."""
        self._eager_last = None
        if self.graphs is None:
            return self._eager_logits(rows)
        decode, prompt = _split(rows)
        if not prompt:
            return self.graphs.run(rows, logits=True).to(torch.float32, copy=True)  # a copy of the graph's buffer
        prompt_rows = [rows[i] for i in prompt]
        pg = self.prefill_graphs
        if pg is not None and pg.fits(prompt_rows):
            first = pg.run(prompt_rows, logits=True).to(torch.float32, copy=True)  # later replays cannot touch it
        else:
            first = self._eager_logits(prompt_rows)
        return self._with_decode_logits(rows, prompt, first, decode)

    def _with_decode_logits(self, rows: list[RowInput], eager: list[int], first: torch.Tensor,
                            decode: list[int]) -> torch.Tensor:
        """[R, V]: the rows `eager` from `first` [E, V], the rows `decode` from the decode graph."""
        if not decode:
            return first
        out = torch.empty(len(rows), first.shape[-1], dtype=torch.float32, device=first.device)  # [R, V]
        out[torch.tensor(eager, device=first.device)] = first
        out[torch.tensor(decode, device=first.device)] = self.graphs.run([rows[i] for i in decode],
                                                                         logits=True).float()
        return out

    def _fork(self, fork: Fork) -> None:
        """Give the siblings the first `length` cached positions of the prefilled slot (all layers):
        the full pages they share already, a copy of the partial last one."""
        self.cache.copy_prefix(fork.src, fork.dst, fork.length)

    def _eager(self, rows: list[RowInput]) -> list[int]:
        batch = Batch.build(rows, self.device)
        logits = self.model.forward(batch, self.cache)  # [R, V]
        with phase("sampling"):
            tokens = torch.argmax(logits.float(), dim=-1)
        return _read(tokens)

    def _eager_logits(self, rows: list[RowInput]) -> torch.Tensor:
        return self.model.forward(Batch.build(rows, self.device), self.cache).float()  # [R, V]

    def _prompt_step(self, rows: list[RowInput], wants: Mapping[int, PromptWant]
                     ) -> tuple[torch.Tensor, dict[int, list], dict[int, str]]:
        """Eager, with the hidden states of every new token kept: the [R, V] logits of each row's
        last token, and for the rows in `wants` their chunk's prompt log-probs, the LM head applied
        a slice of positions at a time (engine.sampler.prompt_logprobs), never to the whole chunk.
        Returns (logits, row -> entries, failed row -> why). Decode rows beside them run in the
        decode graph as in any other step (a row's bits must not depend on what its neighbours ask)."""
        self._eager_last = None
        decode, eager = _split(rows) if self.graphs is not None else ([], list(range(len(rows))))
        at = {r: j for j, r in enumerate(eager)}  # row -> its index among the eager rows
        batch = Batch.build([rows[r] for r in eager], self.device)
        hidden = self.model.hidden(batch, self.cache)  # [T, H]
        with torch.inference_mode():
            first = self.model.head(hidden[batch.last_index]).float()  # [E, V]
            vocab = first.shape[-1]
            logits = self._with_decode_logits(rows, eager, first, decode)  # [R, V]

            def entries(r: int) -> list:
                start, want = batch.starts[at[r]], wants[r]
                got = prompt_logprobs(lambda a, b: self.model.head(hidden[start + a:start + b]).float(),
                                      want.targets, want.n, vocab)
                return [None, *got] if want.first else got

            prompt, failed = per_row(entries, wants)
        return logits, prompt, failed


def _fed(feed: list[int] | None) -> list[int] | None:
    """The feed, or None where no row reads a token of the step before (every id from the host)."""
    return feed if feed and max(feed) >= 0 else None


def _split(rows: list[RowInput]) -> tuple[list[int], list[int]]:
    """Indices of the one-token decode rows (a graph serves them) and of the prompt rows (a prompt
    chunk of one token included)."""
    decode, prompt = [], []
    for i, r in enumerate(rows):
        (decode if len(r.token_ids) == 1 and r.start_pos > 0 and not r.prompt else prompt).append(i)
    return decode, prompt


def _read(t: torch.Tensor) -> list:
    return wait_and_read(t) if t.is_cuda else t.tolist()
