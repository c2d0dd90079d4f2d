"""One choice of a completion as it streams: its text, grown token by token through the incremental
detokenizer and the stop-string scan, its log-prob entries released with their text (on a stop
string, all of them: one per generated token, as usage counts them), its finish
reason, and what it counts for usage and for best_of ranking."""
from __future__ import annotations

import dataclasses

from pegainfer.daemon.logprobs import LogprobEntry, entry
from pegainfer.daemon.stop import StopText
from pegainfer.engine.contract import Token
from pegainfer.engine.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclasses.dataclass(slots=True)
class Delta:
    """What a choice releases at once: text, its log-prob entries, and the finish reason if it ended."""
    text: str = ""
    entries: list[LogprobEntry] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None

    def __bool__(self) -> bool:
        return bool(self.text or self.entries or self.finish_reason)

    def __add__(self, later: Delta) -> Delta:
        return Delta(self.text + later.text, self.entries + later.entries, later.finish_reason or self.finish_reason)


class ChoiceOutput:
    """Tokens after the choice ended (those the engine made before it heard of a stop string) are
    ignored. A stop token (EOS, a stop_token_ids entry) ends the choice without adding its text."""

    def __init__(self, index: int, tok: Tokenizer, stops: list[str], logprobs: bool, prefix: Delta | None = None,
                 *, echo_only: bool = False, include_stop: bool = False):
        self.index = index
        self.echo_only = echo_only  # the echoed prompt is the whole reply: the one token made is dropped
        self.tok = tok
        self.detok = IncrementalDetokenizer(tok)
        self.stop = StopText(stops, include_stop)  # include_stop: vLLM's include_stop_str_in_output
        self.logprobs = logprobs
        self.prefix = prefix  # the echoed prompt, released with the first delta
        self.base = len(prefix.text) if prefix else 0  # offsets of the completion start after the echo
        self.seen = 0  # characters of completion text decoded (released or held)
        self.sent = 0  # characters of completion text released
        self.pending: list[tuple[LogprobEntry, int]] = []  # (entry, end offset) not yet released
        self.finish_reason: str | None = None
        self.stopped_by_string = False
        self.tokens = 0  # generated tokens that count (up to and including the one that ended it)
        self.cumulative_logprob = 0.0

    def push(self, t: Token) -> Delta:
        if self.finish_reason is not None:
            return Delta()
        if self.echo_only:  # max_tokens 0: nothing generated is returned or billed
            self.finish_reason = "length"
            return self._opened(Delta(finish_reason="length"))
        self.tokens += 1
        if t.logprob is not None:
            self.cumulative_logprob += t.logprob
        if t.finish_reason == "stop":  # a stop token: no text of its own
            return self._opened(self._end("stop"))
        text = self.detok.push(t.token_id)
        if self.logprobs:
            e = entry(self.tok, t.token_id, t.logprob, t.top_logprobs, self.base + self.seen)
            self.pending.append((e, self.seen + len(text)))
        self.seen += len(text)
        out = self._release(self.stop.push(text))
        if self.stop.stopped:
            self.stopped_by_string = True
            self.finish_reason = "stop"
            out.finish_reason = "stop"
        elif t.finish_reason is not None:
            out = out + self._end(t.finish_reason)
        return self._opened(out)

    def close(self, reason: str) -> Delta:
        """The request finished while this choice had not (it should not happen; be safe)."""
        if self.finish_reason is not None:
            return Delta()
        return self._opened(self._end(reason))

    def _end(self, reason: str) -> Delta:
        """The token stream ended: release what the detokenizer and the stop scan still hold."""
        out = self._release(self.stop.push(self.detok.flush()))
        if not self.stop.stopped:
            out = out + self._release(self.stop.flush())
        self.stopped_by_string = self.stop.stopped
        self.finish_reason = "stop" if self.stop.stopped else reason
        out.entries += [e for e, _ in self.pending]
        self.pending = []
        out.finish_reason = self.finish_reason
        return out

    def _release(self, text: str) -> Delta:
        """Release text; entries go with it once all their text is out. On a stop string every entry
        left goes with the last text, as vLLM reports them: the log-probs name each generated token
        that usage counts, the ones that spelled the stop string included (their offsets point past the
        returned text, where their text would have been)."""
        self.sent += len(text)
        if self.stop.stopped:
            done = [e for e, _ in self.pending]
            self.pending = []
            return Delta(text, done)
        if not self.pending:
            return Delta(text)
        n = 0
        while n < len(self.pending) and self.pending[n][1] <= self.sent:
            n += 1
        done, self.pending = [e for e, _ in self.pending[:n]], self.pending[n:]
        return Delta(text, done)

    def _opened(self, out: Delta) -> Delta:
        if self.prefix is None:
            return out
        prefix, self.prefix = self.prefix, None
        return prefix + out
