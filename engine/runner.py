"""One forward step over a batch of rows and the choice of each row's next token. On CUDA the
one-token (decode) rows replay a captured graph; prompt rows run a prefill graph or eagerly beside
them.

Two ways out of the forward: when every draw of the step is plain greedy (temperature 0, no
penalties, no log-probs) the graphs return the argmax they compute on the device, exactly as before
sampling existed; otherwise the same graphs return their logits and engine.sampler chooses every
draw in one batched call (under engine.request_guard: one request's faulty values fail that request
alone). A step with rows that want prompt log-probs (echo with logprobs) runs eagerly and turns the
hidden states of those chunks into log-probs a slice of positions at a time."""
from __future__ import annotations

import dataclasses

import torch

from engine.batch import Batch, RowInput
from engine.cuda_graphs import DecodeGraphs, Launched, wait_and_read
from engine.kv_cache import MLACache
from engine.contract import TopLogprobs
from engine.model.model import DeepseekV2
from engine.phases import phase
from engine.prefill_graphs import PrefillGraphs
from engine.request_guard import choose, per_row
from engine.sampler import Draw, PromptWant, prompt_logprobs


@dataclasses.dataclass(slots=True)
class StepOutput:
    tokens: list[int]  # one per draw
    logprobs: list[float | None]  # one per draw: the chosen token's raw log-prob, where asked for
    top_logprobs: list[TopLogprobs]  # one per draw, cut to the N that draw asked for
    prompt: dict[int, list[tuple[float, TopLogprobs] | None]]  # forward row -> its chunk's prompt log-probs
    sampled: bool  # False: the argmax fast path ran
    failed: dict[int, str] = dataclasses.field(default_factory=dict)  # draw -> why it failed (its request's values)
    failed_rows: dict[int, str] = dataclasses.field(default_factory=dict)  # forward row -> why its prompt log-probs failed


class ModelRunner:
    def __init__(self, model: DeepseekV2, cache: MLACache, device: torch.device | str,
                 graphs: DecodeGraphs | None = None, prefill_graphs: PrefillGraphs | None = None):
        self.model = model
        self.cache = cache
        self.device = device
        self.graphs = graphs
        self.prefill_graphs = prefill_graphs
        self._eager_last: list[int] | None = None  # the last eager launch's tokens (what a feed reads)

    def step(self, rows: list[RowInput]) -> list[int]:
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

    def launch(self, rows: list[RowInput], feed: list[int] | None = None) -> Launched | list[int]:
        """Start a greedy step of decode rows without waiting for its tokens (collect() reads them),
        so the host can prepare the next step while this one runs. feed[i] = j >= 0: row i's input
        is row j's token of the step launched just before, which the host has not read yet (-1: the
        id in rows[i]). The eager path has nothing to overlap: it runs the step at once."""
        if self.graphs is not None:
            return self.graphs.launch(rows, feed)
        if feed is not None:
            prev = self._eager_last
            if prev is None:
                raise RuntimeError("a decode feed needs the step before to be a launched greedy step")
            rows = [r if j < 0 else RowInput(r.slot, [prev[j]], r.start_pos) for r, j in zip(rows, feed)]
        self._eager_last = self._eager(rows)
        return self._eager_last

    def collect(self, launched: Launched | list[int]) -> list[int]:
        """The greedy tokens of a launched step."""
        return launched if isinstance(launched, list) else self.graphs.collect(launched)

    def run(self, rows: list[RowInput], draws: list[Draw], prompt_rows: dict[int, PromptWant] | None = None
            ) -> StepOutput:
        """The step with a token chosen per draw (several draws may read one row: the first step of
        a request with n choices). prompt_rows: forward row -> the prompt log-probs its chunk wants.
        A draw or prompt row whose request's values make its share of the work raise is left out
        (StepOutput.failed, failed_rows); the others get what they would have got without it."""
        prompt_rows = prompt_rows or {}
        if not prompt_rows and all(d.spec.plain_greedy for d in draws):
            greedy = self.step(rows)
            tokens = [greedy[d.row] for d in draws]
            return StepOutput(tokens, [None] * len(draws), [()] * len(draws), {}, sampled=False)
        if prompt_rows:
            logits, prompt, failed_rows = self._prompt_step(rows, prompt_rows)  # [R, V]
        else:
            logits, prompt, failed_rows = self.logits(rows), {}, {}
        with phase("sampling"):
            out, kept, failed = choose(logits, draws)
        n = len(draws)
        tokens, chosen, tops = [-1] * n, [None] * n, [()] * n  # a failed draw keeps these
        if out is None:
            return StepOutput(tokens, chosen, tops, prompt, True, failed, failed_rows)
        # waits for the device with the GIL released; the reads below are quick
        for s, tok in zip(kept, _read(out.tokens)):
            tokens[s] = tok
        if out.logprobs is not None:
            lps, ids, vals = out.logprobs.tolist(), out.top_ids.tolist(), out.top_logprobs.tolist()
            for j, s in enumerate(kept):
                want = draws[s].spec.logprobs
                if want is not None:
                    chosen[s], tops[s] = lps[j], tuple(zip(ids[j][:want], vals[j][:want]))
        return StepOutput(tokens, chosen, tops, prompt, True, failed, failed_rows)

    def logits(self, rows: list[RowInput]) -> torch.Tensor:
        """[R, V] float32 logits of every row's last new token."""
        self._eager_last = None
        if self.graphs is None:
            return self._eager_logits(rows)
        decode, prompt = _split(rows)
        if not prompt:
            return self.graphs.run(rows, logits=True).float()
        prompt_rows = [rows[i] for i in prompt]
        pg = self.prefill_graphs
        if pg is not None and pg.fits(prompt_rows):
            first = pg.run(prompt_rows, logits=True).float()  # a copy: later replays cannot touch it
        else:
            first = self._eager_logits(prompt_rows)
        out = torch.empty(len(rows), first.shape[-1], dtype=torch.float32, device=first.device)  # [R, V]
        out[torch.tensor(prompt, device=first.device)] = first
        if decode:
            out[torch.tensor(decode, device=first.device)] = self.graphs.run([rows[i] for i in decode],
                                                                             logits=True).float()
        return out

    def fork(self, src_slot: int, dst_slots: list[int], length: int) -> None:
        """Copy the first `length` cached positions of one KV slot into others (all layers)."""
        data = self.cache.data  # [L, S+1, N, W]
        dst = torch.tensor(dst_slots, dtype=torch.int64, device=data.device)
        data[:, dst, :length] = data[:, src_slot:src_slot + 1, :length]

    def _eager(self, rows: list[RowInput]) -> list[int]:
        batch = Batch.build(rows, self.device)
        logits = self.model.forward(batch, self.cache)  # [R, V]
        with phase("sampling"):
            tokens = torch.argmax(logits.float(), dim=-1)
        return _read(tokens)

    def _eager_logits(self, rows: list[RowInput]) -> torch.Tensor:
        return self.model.forward(Batch.build(rows, self.device), self.cache).float()  # [R, V]

    def _prompt_step(self, rows: list[RowInput], wants: dict[int, PromptWant]
                     ) -> tuple[torch.Tensor, dict[int, list], dict[int, str]]:
        """Eager, with the hidden states of every new token kept: the [R, V] logits of each row's
        last token, and for the rows in `wants` their chunk's prompt log-probs, the LM head applied
        a slice of positions at a time (engine.sampler.prompt_logprobs), never to the whole chunk.
        Returns (logits, row -> entries, failed row -> why)."""
        self._eager_last = None
        batch = Batch.build(rows, self.device)
        hidden = self.model.hidden(batch, self.cache)  # [T, H]
        with torch.inference_mode():
            logits = self.model.head(hidden[batch.last_index]).float()  # [R, V]
            vocab = logits.shape[-1]

            def entries(r: int) -> list:
                start, want = batch.starts[r], wants[r]
                got = prompt_logprobs(lambda a, b: self.model.head(hidden[start + a:start + b]).float(),
                                      want.targets, want.n, vocab)
                return [None, *got] if want.first else got

            prompt, failed = per_row(entries, wants)
        return logits, prompt, failed


def _split(rows: list[RowInput]) -> tuple[list[int], list[int]]:
    """Indices of the one-token decode rows (a graph serves them) and of the prompt rows."""
    decode, prompt = [], []
    for i, r in enumerate(rows):
        (decode if len(r.token_ids) == 1 and r.start_pos > 0 else prompt).append(i)
    return decode, prompt


def _read(t: torch.Tensor) -> list:
    return wait_and_read(t) if t.is_cuda else t.tolist()
