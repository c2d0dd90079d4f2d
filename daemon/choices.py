"""All choices of one completion request: the engine's token events (read from the request's sink)
routed to each choice, the echoed prompt put in front of each (its log-probs joined from the
prompt's chunk events), the choices that hit a stop string (so the scheduler can finish them), and,
at the end, the choices returned (best_of: the n with the highest cumulative log-prob)."""
from __future__ import annotations

from collections.abc import Sequence

from pegainfer.daemon.choice import ChoiceOutput, Delta
from pegainfer.daemon.logprobs import prompt_entries
from pegainfer.daemon.protocol import CompletionRequest
from pegainfer.daemon.shapes import COMPLETION, Shape
from pegainfer.engine.contract import PromptLogprobs, Token, TopLogprobs
from pegainfer.engine.tokenizer import Tokenizer


class Choices:
    def __init__(self, req: CompletionRequest, tok: Tokenizer, prompt_ids: list[int]):
        self.tok = tok
        self.n = req.n
        self.logprobs = req.logprobs is not None
        self.echo = req.echo
        self.prompt_ids = prompt_ids
        self.prompt_text = req.prompt if req.prompt is not None else tok.decode(prompt_ids)
        self.items = [ChoiceOutput(i, tok, req.stop, self.logprobs, echo_only=req.echo_only,
                                   include_stop=req.include_stop) for i in range(req.candidates)]
        # everything released, per choice: the non-streaming body (a stream sends it as it goes)
        self._keep = not req.stream
        self.texts = [""] * len(self.items)
        self.entries: list[list] = [[] for _ in self.items]
        self._echoed = not req.echo
        self._prompt: list[tuple[float, TopLogprobs] | None] | None = None  # the prompt's log-prob entries

    def feed(self, tokens: list[Token], prompt: Sequence[PromptLogprobs] = ()
             ) -> tuple[list[tuple[int, Delta]], list[int]]:
        """Route new tokens (and prompt log-prob events, which come before the first token);
        returns each choice's combined delta (in choice order) and the choices that have just found
        a stop string (the scheduler should finish them)."""
        for event in prompt:
            self._join_prompt(event)
        if tokens and not self._echoed:
            self._put_echo(self._prompt)
        if len(tokens) == 1 and self._echoed:  # one token of one choice: no merging, no sorting
            t = tokens[0]
            c = self.items[t.index]
            was_open = c.finish_reason is None
            d = c.push(t)
            stopped = [t.index] if was_open and c.stopped_by_string else []
            return self._record({t.index: d} if d else {}), stopped
        deltas: dict[int, Delta] = {}
        stopped = []
        for t in tokens:
            c = self.items[t.index]
            was_open = c.finish_reason is None
            d = c.push(t)
            if was_open and c.stopped_by_string:
                stopped.append(t.index)
            if d:
                deltas[t.index] = deltas[t.index] + d if t.index in deltas else d
        return self._record(deltas), stopped

    def finish(self, reason: str) -> list[tuple[int, Delta]]:
        """The request finished: close any choice that has not (it should not happen)."""
        return self._record({c.index: d for c in self.items if (d := c.close(reason))})

    @property
    def completion_tokens(self) -> int:
        """Every generated token counts, best_of candidates included (as OpenAI bills them)."""
        return sum(c.tokens for c in self.items)

    def final(self, shape: Shape = COMPLETION, offset: int = 0) -> list[dict]:
        """The response's choices in `shape`, indexed offset..offset+n-1: with best_of > n, the n
        candidates of highest cumulative log-prob, best first; otherwise all of them in order."""
        chosen = self.items
        if len(self.items) > self.n:
            chosen = sorted(self.items, key=lambda c: c.cumulative_logprob, reverse=True)[:self.n]
        return [shape.choice(offset + i, self.texts[c.index], self.entries[c.index], c.finish_reason, self.logprobs)
                for i, c in enumerate(chosen)]

    def _join_prompt(self, event: PromptLogprobs) -> None:
        """One chunk's prompt log-probs: the entries of prompt tokens event.start, start + 1, ..."""
        joined = self._prompt if self._prompt is not None else []
        del joined[event.start:]
        joined.extend(event.entries)
        self._prompt = joined

    def _put_echo(self, prompt: list[tuple[float, TopLogprobs] | None] | None) -> None:
        self._echoed = True
        entries = []
        if self.logprobs:
            entries = prompt_entries(self.tok, self.prompt_ids, prompt or [None] * len(self.prompt_ids))
        for c in self.items:
            c.prefix = Delta(self.prompt_text, list(entries))
            c.base = len(self.prompt_text)

    def _record(self, deltas: dict[int, Delta]) -> list[tuple[int, Delta]]:
        out = sorted(deltas.items()) if len(deltas) > 1 else list(deltas.items())
        if not self._keep:
            return out
        for i, d in out:
            self.texts[i] += d.text
            self.entries[i] += d.entries
        return out
